"""Reading a request body under a size limit, and making sense of its content type."""

import json
from dataclasses import dataclass
from urllib.parse import parse_qs

from django.http import HttpRequest

from webhooks.fairness_key import NOT_JSON, parse_json_body

READ_CHUNK = 64 * 1024


class BodyTooLarge(Exception):
    pass


def read_limited(request: HttpRequest, limit: int) -> bytes:
    """Read at most `limit` bytes, whatever Content-Length claims, so memory stays bounded."""
    declared = request.META.get("CONTENT_LENGTH") or ""
    if declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge
    chunks, total = [], 0
    while True:
        chunk = request.read(min(READ_CHUNK, limit + 1 - total))
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
        if total > limit:
            raise BodyTooLarge
    return b"".join(chunks)


@dataclass(frozen=True)
class ParsedBody:
    json: object  # the parsed document, or NOT_JSON
    content_type: str


def parse_body(raw: bytes, content_type_header: str) -> ParsedBody:
    """JSON as JSON; a form body's `payload=` field (GitHub's form mode) as JSON; else raw.

    The raw bytes are what we store and deliver either way: parsing only serves to
    find the tenant key and event type.
    """
    media_type = content_type_header.split(";")[0].strip().lower()
    if media_type == "application/x-www-form-urlencoded":
        try:
            fields = parse_qs(raw.decode("utf-8"), strict_parsing=False)
        except UnicodeDecodeError:
            return ParsedBody(NOT_JSON, media_type)
        payload = fields.get("payload", [None])[0]
        parsed = parse_json_body(payload.encode()) if payload else NOT_JSON
        return ParsedBody(parsed, media_type)
    return ParsedBody(parse_json_body(raw), media_type or "application/octet-stream")


def json_error(message: str, **extra: object) -> bytes:
    return json.dumps({"error": message, **extra}).encode()

"""Where a source's fairness key lives, and reading it out of a verified request.

Locations: `body.shop_id` (dots for nesting: `body.shop.id`), `header:X-Shopify-Shop-Domain`,
`query:shop`, `path:0` (the first path segment after the source slug).
"""

import json
import re
from dataclasses import dataclass

from django.core.exceptions import ValidationError

MAX_KEY_LENGTH = 255
_NAME = re.compile(r"^[A-Za-z0-9_\-]+$")


@dataclass(frozen=True)
class KeyLocation:
    kind: str  # body | header | query | path
    parts: tuple[str, ...]


def parse_location(text: str) -> KeyLocation:
    text = text.strip()
    if text.startswith("body."):
        parts = tuple(text[len("body.") :].split("."))
        if all(_NAME.match(part) for part in parts):
            return KeyLocation("body", parts)
    for kind in ("header", "query", "path"):
        prefix = f"{kind}:"
        if text.startswith(prefix):
            name = text[len(prefix) :].strip()
            if kind == "path" and name.isdigit():
                return KeyLocation(kind, (name,))
            if kind != "path" and name and _NAME.match(name):
                return KeyLocation(kind, (name,))
    raise ValidationError(
        "%(value)s is not a fairness-key location. Use body.field (body.shop.id for nesting), "
        "header:Name, query:name or path:N.",
        params={"value": repr(text)},
    )


def validate_location(text: str) -> None:
    if text:
        parse_location(text)


@dataclass(frozen=True)
class KeyResult:
    """The tenant key, or why there is none (the event then goes to the fallback lane)."""

    value: str | None
    missing_reason: str = ""


def _scalar_to_key(value: object, where: str) -> KeyResult:
    if value is None:
        return KeyResult(None, f"{where} is null")
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        return KeyResult(None, f"{where} is not a string or number")
    text = str(value).strip()
    if not text:
        return KeyResult(None, f"{where} is empty")
    if len(text) > MAX_KEY_LENGTH:
        return KeyResult(None, f"{where} is longer than {MAX_KEY_LENGTH} characters")
    return KeyResult(text)


def extract_key(
    location: KeyLocation,
    *,
    body_json: object,
    headers: dict[str, str],
    query: dict[str, str],
    path_segments: list[str],
) -> KeyResult:
    """Read the key; `body_json` is the parsed body or `NOT_JSON`."""
    name = location.parts[0]
    if location.kind == "header":
        lowered = {key.lower(): value for key, value in headers.items()}
        return _scalar_to_key(lowered.get(name.lower()), f"header {name}")
    if location.kind == "query":
        return _scalar_to_key(query.get(name), f"query parameter {name}")
    if location.kind == "path":
        index = int(name)
        value = path_segments[index] if index < len(path_segments) else None
        return _scalar_to_key(value, f"path segment {index}")
    where = "body." + ".".join(location.parts)
    if body_json is NOT_JSON:
        return KeyResult(None, "body is not JSON")
    node = body_json
    for part in location.parts:
        if not isinstance(node, dict) or part not in node:
            return KeyResult(None, f"{where} is missing")
        node = node[part]
    return _scalar_to_key(node, where)


class _NotJson:
    def __repr__(self) -> str:
        return "NOT_JSON"


NOT_JSON = _NotJson()


def parse_json_body(raw: bytes) -> object:
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        return NOT_JSON

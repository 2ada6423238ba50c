"""Reading a request body under a size limit and a deadline, and making sense of its type.

Every way a body can fail to arrive is a `BodyError` with the HTTP status and a reason for
the JSON answer (docs/INGEST.md has the table):

- `Content-Length` over the limit, or more bytes than the limit: 413.
- `Content-Length` that is not a number: 400.
- Fewer bytes than `Content-Length` promised (the client closed early): 400.
- No `Content-Length` but `Transfer-Encoding` (chunked): read to the end when the server
  delimits the body itself (gunicorn sets `wsgi.input_terminated`); otherwise 411.
- The client stops sending mid-body: 408 after BODY_IDLE_TIMEOUT_SECONDS without a byte
  (under gunicorn, whose socket we can reach; behind a proxy its body timeout applies).
- A body the server cannot decode (a malformed chunk): 400.
- A `Content-Encoding` other than identity: 415 (we verify and store the bytes as sent, and
  the receivers downstream would get compressed bytes labelled as something else).
"""

import contextlib
import socket
from collections import Counter
from dataclasses import dataclass
from urllib.parse import parse_qsl

from django.http import HttpRequest

from webhooks.fairness_key import JsonObject, NotJson, parse_json_body, parse_json_text

READ_CHUNK = 64 * 1024
BODY_IDLE_TIMEOUT_SECONDS = 10.0
MAX_FORM_FIELDS = 1000
FORM = "application/x-www-form-urlencoded"
MULTIPART = "multipart/form-data"


class BodyError(Exception):
    """The body could not be read; `status` and `message` make the JSON answer."""

    status = 400

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status


class BodyTooLarge(BodyError):
    status = 413

    def __init__(self, limit: int) -> None:
        super().__init__(f"body larger than {limit} bytes")


def check_content_encoding(request: HttpRequest) -> None:
    encoding = request.headers.get("Content-Encoding", "").strip().lower()
    if encoding and encoding != "identity":
        raise BodyError(
            "Content-Encoding is not supported: send the body uncompressed, as it was signed",
            status=415,
        )


def read_limited(request: HttpRequest, limit: int) -> bytes:
    """The whole body, at most `limit` bytes, whatever the headers claim; else BodyError."""
    meta = request.META
    declared_text = str(meta.get("CONTENT_LENGTH") or "").strip()
    if declared_text:
        if not declared_text.isascii() or not declared_text.isdigit():
            raise BodyError("Content-Length is not a number")
        declared = int(declared_text)
        if declared > limit:
            raise BodyTooLarge(limit)
        stream, expected = request, declared
    elif meta.get("wsgi.input_terminated"):
        # No length (chunked): this server (gunicorn) ends the stream at the body's end, so
        # it is read directly; Django's own stream would read nothing without a length.
        stream, expected = meta["wsgi.input"], None
    elif meta.get("HTTP_TRANSFER_ENCODING"):
        raise BodyError("a Content-Length is required", status=411)
    else:
        return b""  # HTTP/1.1: no Content-Length and no Transfer-Encoding means no body
    raw = _read(stream, limit, _server_socket(meta))
    if expected is not None and len(raw) < expected:
        raise BodyError(f"body ended after {len(raw)} of the {expected} bytes in Content-Length")
    return raw


def _server_socket(meta: dict) -> socket.socket | None:
    sock = meta.get("gunicorn.socket")
    return sock if isinstance(sock, socket.socket) else None


def _timed_out(exc: BaseException | None) -> bool:
    """A socket timeout, possibly wrapped (Django raises UnreadablePostError from it)."""
    for _ in range(5):
        if exc is None:
            return False
        if isinstance(exc, TimeoutError):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _read(stream, limit: int, sock: socket.socket | None) -> bytes:
    chunks, total = [], 0
    prior_timeout = sock.gettimeout() if sock is not None else None
    try:
        if sock is not None:
            sock.settimeout(BODY_IDLE_TIMEOUT_SECONDS)
        while True:
            chunk = stream.read(min(READ_CHUNK, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:
                raise BodyTooLarge(limit)
    except BodyError:
        raise
    except Exception as exc:  # the server's body decoder: a malformed chunk, a reset socket
        if _timed_out(exc):
            raise BodyError(
                f"no body bytes for {BODY_IDLE_TIMEOUT_SECONDS:g} s; request abandoned",
                status=408,
            ) from exc
        raise BodyError(f"the body could not be read ({type(exc).__name__})") from exc
    finally:
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.settimeout(prior_timeout)
    return b"".join(chunks)


@dataclass(frozen=True)
class ParsedBody:
    json: object  # the parsed document, or a NotJson with the reason
    media_type: str


def media_type_of(content_type_header: str) -> str:
    return content_type_header.split(";")[0].strip().lower()


def parse_body(raw: bytes, content_type_header: str) -> ParsedBody:
    """What the tenant key and the event type are read from. The raw bytes are what is stored
    and delivered, whatever this finds.

    - form-encoded: the `payload=` field parsed as JSON (GitHub's form mode); without one, the
      form's fields as a flat object, so `body.shop` reads field `shop`.
    - multipart: not parsed.
    - anything else: parsed as JSON whatever the label says (senders mislabel JSON as
      text/plain or octet-stream); a body that is not JSON is simply not JSON.
    """
    media_type = media_type_of(content_type_header)
    if media_type == FORM:
        return ParsedBody(_parse_form(raw), media_type)
    if media_type == MULTIPART:
        return ParsedBody(NotJson("body is multipart/form-data, not JSON"), media_type)
    return ParsedBody(parse_json_body(raw), media_type or "application/octet-stream")


def _parse_form(raw: bytes) -> object:
    if not raw.strip():
        return NotJson("body is empty")
    try:
        fields = parse_qsl(
            raw.decode("utf-8"),
            keep_blank_values=True,
            encoding="utf-8",
            errors="strict",
            max_num_fields=MAX_FORM_FIELDS,
        )
    except UnicodeDecodeError:
        return NotJson("form body is not UTF-8")
    except ValueError:
        return NotJson(f"form body has more than {MAX_FORM_FIELDS} fields")
    payloads = [value for name, value in fields if name == "payload"]
    if len(payloads) > 1:
        return NotJson("form field payload appears more than once")
    if payloads:
        return parse_json_text(payloads[0])
    counts = Counter(name for name, _ in fields)
    duplicates = frozenset(name for name, count in counts.items() if count > 1)
    first: dict[str, str] = {}
    for name, value in fields:
        first.setdefault(name, value)
    pairs = list(first.items())
    return JsonObject(pairs, duplicates) if duplicates else dict(pairs)

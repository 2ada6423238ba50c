"""Where a source's fairness key lives, and reading it out of a verified request.

Locations: `body.shop_id` (dots for nesting: `body.shop.id`), `header:X-Shopify-Shop-Domain`,
`query:shop`, `path:0` (the first path segment after the source slug).

The body is parsed strictly (docs/INGEST.md has the table): UTF-8 only (a leading BOM is
ignored), no NaN/Infinity literals, nesting bounded by the interpreter's recursion limit,
integers of any length. A document that cannot be read this way is `NotJson` with the reason,
and a key that should have come from it sends the event to the fallback lane with that reason.
"""

import json
import re
from dataclasses import dataclass

from django.core.exceptions import ValidationError

MAX_KEY_LENGTH = 255
_NAME = re.compile(r"^[A-Za-z0-9_\-]+$")
_UTF8_BOM = b"\xef\xbb\xbf"
# Python refuses to convert longer digit strings to int (sys.int_info.default_max_str_digits).
_MAX_INT_DIGITS = 4000


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


# --- the parsed body ------------------------------------------------------------------------


class NotJson:
    """A body that is not a readable JSON document, and why (shown as the fallback reason)."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def __repr__(self) -> str:
        return f"NotJson({self.reason!r})"


NOT_JSON = NotJson("body is not JSON")


class JsonObject(dict):
    """A JSON object in which some names appeared more than once.

    Parsers disagree on which duplicate wins (Python takes the last, others the first), so a
    value read through a duplicated name is ambiguous and is never used as a key.
    """

    __slots__ = ("duplicates",)

    def __init__(self, pairs: list[tuple[str, object]], duplicates: frozenset[str]) -> None:
        super().__init__(pairs)
        self.duplicates = duplicates


class HugeInteger(str):
    """An integer literal too long for int(): kept as its digits."""

    __slots__ = ()


def duplicated(node: object, name: str) -> bool:
    return isinstance(node, JsonObject) and name in node.duplicates


def _object(pairs: list[tuple[str, object]]) -> dict:
    obj = dict(pairs)
    if len(obj) == len(pairs):
        return obj
    seen: set[str] = set()
    duplicates = {name for name, _ in pairs if name in seen or seen.add(name)}
    return JsonObject(pairs, frozenset(duplicates))


def _integer(text: str) -> int | HugeInteger:
    return int(text) if len(text) <= _MAX_INT_DIGITS else HugeInteger(text)


class _NonFiniteLiteral(ValueError):
    pass


def _constant(name: str) -> float:
    raise _NonFiniteLiteral(name)


def parse_json_text(text: str) -> object:
    """Strict JSON from text, or NotJson with the reason."""
    if not text.strip():
        return NotJson("body is empty")
    try:
        return json.loads(
            text, object_pairs_hook=_object, parse_int=_integer, parse_constant=_constant
        )
    except _NonFiniteLiteral:
        return NotJson("body contains NaN or Infinity, which JSON does not allow")
    except RecursionError:
        return NotJson("body JSON is nested too deeply")
    except ValueError:
        return NotJson("body is not valid JSON")


def parse_json_body(raw: bytes) -> object:
    """Strict JSON from the raw body (UTF-8, BOM ignored), or NotJson with the reason."""
    if raw.startswith(_UTF8_BOM):
        raw = raw[len(_UTF8_BOM) :]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return NotJson("body is not UTF-8 (JSON must be)")
    return parse_json_text(text)


# --- reading the key ------------------------------------------------------------------------


def header_text(value: str) -> str | None:
    """A header value as the text its sender meant, UTF-8, or None when its bytes are not
    UTF-8. WSGI hands each header byte over as one Latin-1 character (PEP 3333), so
    "магазин.example" sent in UTF-8 arrives as "Ð¼Ð°Ð³..."; ASCII, nearly every value,
    comes through unchanged. A value already holding characters past Latin-1 did not
    come through WSGI and is taken as it is."""
    try:
        raw = value.encode("latin-1")
    except UnicodeEncodeError:
        return value
    if raw.isascii():
        return value
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def clean_text(value: str, limit: int) -> str | None:
    """`value` stripped, if it is printable text within `limit` characters, else None.

    Printable rules out NUL (PostgreSQL text cannot hold it), other control characters and
    lone surrogates (not encodable as UTF-8), which no identifier should contain.
    """
    text = value.strip()
    if not text or len(text) > limit or not text.isprintable():
        return None
    return text


def _scalar_to_key(value: object, where: str) -> KeyResult:
    if value is None:
        return KeyResult(None, f"{where} is null")
    if isinstance(value, bool) or not isinstance(value, str | int):
        return KeyResult(None, f"{where} is not a string or an integer")
    text = str(value).strip()
    if not text:
        return KeyResult(None, f"{where} is empty")
    if len(text) > MAX_KEY_LENGTH:
        return KeyResult(None, f"{where} is longer than {MAX_KEY_LENGTH} characters")
    if not text.isprintable():
        return KeyResult(None, f"{where} contains control or unprintable characters")
    return KeyResult(text)


def extract_key(
    location: KeyLocation,
    *,
    body_json: object,
    headers: dict[str, str],
    query: dict[str, str],
    path_segments: list[str],
) -> KeyResult:
    """Read the key; `body_json` is the parsed body or a `NotJson`."""
    name = location.parts[0]
    if location.kind == "header":
        lowered = {key.lower(): value for key, value in headers.items()}
        value = lowered.get(name.lower())
        text = header_text(value) if isinstance(value, str) else value
        if isinstance(value, str) and text is None:
            return KeyResult(None, f"header {name} is not UTF-8")
        return _scalar_to_key(text, f"header {name}")
    if location.kind == "query":
        return _scalar_to_key(query.get(name), f"query parameter {name}")
    if location.kind == "path":
        index = int(name)
        value = path_segments[index] if index < len(path_segments) else None
        return _scalar_to_key(value, f"path segment {index}")
    return _body_key(location, body_json)


def _body_key(location: KeyLocation, body_json: object) -> KeyResult:
    where = "body." + ".".join(location.parts)
    if isinstance(body_json, NotJson):
        return KeyResult(None, body_json.reason)
    if not isinstance(body_json, dict):
        kind = "an array" if isinstance(body_json, list) else "a scalar"
        return KeyResult(None, f"body is {kind}, not a JSON object")
    node: object = body_json
    for part in location.parts:
        if not isinstance(node, dict) or part not in node:
            return KeyResult(None, f"{where} is missing")
        if duplicated(node, part):
            return KeyResult(None, f"{where} is ambiguous: {part!r} appears more than once")
        node = node[part]
    return _scalar_to_key(node, where)

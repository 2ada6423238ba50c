"""Request bodies read as strictly as the publish API reads its own
(ingest.api.parse_document): UTF-8, no NaN or Infinity, numbers that fit, bounded
nesting, and no object that names a key twice, which the json module would settle
silently by keeping the last value."""

from typing import Any

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

from ingest.api import parse_document


class StrictJSONParser(JSONParser):
    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        try:
            return parse_document(stream.read())
        except ValueError as exc:
            raise ParseError(str(exc)) from exc

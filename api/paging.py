"""Cursor pagination for every list: keyset, never OFFSET, so page 10,000 costs what page
one does. A list is ordered by a unique tuple of columns that an index serves in that
order (a test reads the PostgreSQL plans); the cursor is the last row's values of those
columns, opaque to callers (base64url of JSON), and checked when it comes back.

    {"data": [...], "next_cursor": "WyIyMDI2LTEy..."}   (null on the last page)
"""

import base64
import binascii
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from django.db.models import Model, Q, QuerySet
from drf_spectacular.utils import OpenApiParameter, inline_serializer
from rest_framework import serializers
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request

DEFAULT_LIMIT = 50
MAX_LIMIT = 250
MAX_CURSOR_CHARS = 512
BAD_CURSOR = "Not a cursor this list gave out; start again without one."
# Unpadded base64url, as _encode writes it: base64 would skip any other character, so a
# cursor with one appended would otherwise still be read.
CURSOR_ALPHABET = "[A-Za-z0-9_-]"

PARAMETERS = [
    OpenApiParameter(
        "cursor",
        {"type": "string", "maxLength": MAX_CURSOR_CHARS, "pattern": f"^{CURSOR_ALPHABET}*$"},
        description="next_cursor of the previous page; empty for the first.",
    ),
    OpenApiParameter(
        "limit",
        {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT},
        description=f"Items per page, 1 to {MAX_LIMIT} (default {DEFAULT_LIMIT}).",
    ),
]


def page_of(item: type[serializers.Serializer], name: str) -> serializers.Serializer:
    """The schema of one page of `item`s."""
    return inline_serializer(
        name=f"{name}Page",
        fields={
            "data": item(many=True),
            "next_cursor": serializers.CharField(
                allow_null=True, help_text="Pass as ?cursor= for the next page; null: no more."
            ),
        },
    )


def limit_of(request: Request) -> int:
    raw = request.query_params.get("limit")
    if raw is None:
        return DEFAULT_LIMIT
    # isascii: "²" is a digit to str.isdigit() and not a number to int().
    if not (raw.isascii() and raw.isdigit()) or not 1 <= int(raw) <= MAX_LIMIT:
        raise ValidationError({"limit": [f"A whole number from 1 to {MAX_LIMIT}."]})
    return int(raw)


def _encode(values: list[Any]) -> str:
    plain = [value.isoformat() if isinstance(value, datetime) else value for value in values]
    return base64.urlsafe_b64encode(json.dumps(plain).encode()).decode().rstrip("=")


def _decode(cursor: str, model: type[Model], columns: Sequence[str]) -> list[Any]:
    try:
        if len(cursor) > MAX_CURSOR_CHARS or not re.fullmatch(f"{CURSOR_ALPHABET}+", cursor):
            raise ValueError
        raw = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        if not isinstance(raw, list) or len(raw) != len(columns):
            raise ValueError
        values = []
        for column, value in zip(columns, raw, strict=True):
            if not isinstance(value, str | int) or isinstance(value, bool):
                raise ValueError
            field = model._meta.get_field("id" if column == "pk" else column)
            values.append(field.to_python(value))
        if any(value is None for value in values):
            raise ValueError
        return values
    except (ValueError, TypeError, binascii.Error, DjangoValidationError, OverflowError) as exc:
        raise ValidationError({"cursor": [BAD_CURSOR]}) from exc


def _after(columns: Sequence[str], values: list[Any], descending: bool) -> Q:
    """Rows strictly past `values` in the list's order (lexicographic over the columns)."""
    op = "lt" if descending else "gt"
    past = Q()
    for depth, column in enumerate(columns):
        equal = {c: v for c, v in zip(columns[:depth], values[:depth], strict=True)}
        past |= Q(**equal, **{f"{column}__{op}": values[depth]})
    return past


@dataclass(frozen=True)
class Page:
    rows: list[Any]
    next_cursor: str | None

    def answer(self, serialize: Callable[[Any], dict]) -> dict:
        return {"data": [serialize(row) for row in self.rows], "next_cursor": self.next_cursor}


def page(
    queryset: QuerySet,
    request: Request,
    columns: Sequence[str],
    *,
    descending: bool = True,
) -> Page:
    """One page of `queryset` in `columns` order (the last column unique), after the
    request's cursor."""
    limit = limit_of(request)
    cursor = request.query_params.get("cursor") or ""
    if cursor:
        queryset = queryset.filter(
            _after(columns, _decode(cursor, queryset.model, columns), descending)
        )
    order = [f"-{column}" if descending else column for column in columns]
    rows = list(queryset.order_by(*order)[: limit + 1])
    more = len(rows) > limit
    rows = rows[:limit]
    next_cursor = None
    if more:
        last = rows[-1]
        next_cursor = _encode([getattr(last, column) for column in columns])
    return Page(rows, next_cursor)

"""Cursor pagination for every list: keyset, never OFFSET, so page 10,000 costs what page
one does. A list is ordered by a unique tuple of columns that an index serves in that
order (a test reads the PostgreSQL plans); the cursor is the last row's position in that
order, written out: each column's value, joined by "-" (a time as microseconds since
1970, a number in digits, and text, which only the last column may be, as it is).

    {"data": [...], "next_cursor": "1764979200123456-01JE..."}   (null on the last page)

Any cursor of that shape is a position, so the document's pattern says exactly which
cursors a list takes: one of another shape is a 422, and one that names no row still
answers the rows after that position.
"""

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import models
from django.db.models import Model, Q, QuerySet
from drf_spectacular.utils import OpenApiParameter, inline_serializer
from rest_framework import serializers
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request

DEFAULT_LIMIT = 50
MAX_LIMIT = 250
MAX_CURSOR_CHARS = 512
SEPARATOR = "-"
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# Up to year 5138 in microseconds, and below 2**63: both fit what they are read into.
TIME_DIGITS = r"\d{1,17}"
NUMBER_DIGITS = r"\d{1,18}"
TEXT = r"[^\x00]*"  # any text but NUL, which PostgreSQL refuses


def _kind(model: type[Model], column: str) -> str:
    field = model._meta.pk if column == "pk" else model._meta.get_field(column)
    if isinstance(field, models.DateTimeField):
        return TIME_DIGITS
    if isinstance(field, models.IntegerField | models.AutoField):
        return NUMBER_DIGITS
    return TEXT


def cursor_pattern(model: type[Model], columns: Sequence[str]) -> str:
    kinds = [_kind(model, column) for column in columns]
    if TEXT in kinds[:-1]:
        raise ValueError("only the last column of a cursor may be text")
    return "^(" + SEPARATOR.join(f"({kind})" for kind in kinds) + ")?$"


def parameters(model: type[Model], columns: Sequence[str]) -> list[OpenApiParameter]:
    """The cursor and limit parameters of a list ordered by `columns` of `model`."""
    return [
        OpenApiParameter(
            "cursor",
            {
                "type": "string",
                "maxLength": MAX_CURSOR_CHARS,
                "pattern": cursor_pattern(model, columns),
            },
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
    def one(value: Any) -> str:
        if isinstance(value, datetime):
            delta = value.astimezone(UTC) - EPOCH
            return str((delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds)
        return str(value)

    return SEPARATOR.join(one(value) for value in values)


def _decode(cursor: str, model: type[Model], columns: Sequence[str]) -> list[Any]:
    found = re.fullmatch(cursor_pattern(model, columns), cursor)
    if len(cursor) > MAX_CURSOR_CHARS or found is None or not cursor:
        raise ValidationError(
            {"cursor": ["Not a cursor of this list: pass next_cursor as it was given."]}
        )
    values = []
    for column, raw in zip(columns, found.groups()[1:], strict=True):
        kind = _kind(model, column)
        if kind == TIME_DIGITS:
            values.append(EPOCH + timedelta(microseconds=int(raw)))
        elif kind == NUMBER_DIGITS:
            values.append(int(raw))
        else:
            values.append(raw)
    return values


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

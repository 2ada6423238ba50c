"""Model instances from hand-written SQL, without Model.objects.raw()'s cost.

raw() works out, on every call, which column is which field, compiles the converters
and resolves the model's init order: on ingest's look-ups (a source, a tenant, the
destinations: a few rows each) that is a large part of a request's Python time, and the
same work on every request (docs/INGEST.md). Here that plan is made once per (database
vendor, SQL text) from the first result's column names, and each row becomes an instance through
the same converters the ORM applies (aware datetimes and booleans on SQLite, JSON), so
the instances are the ones raw() would give. Columns that are not the model's (a
joined table's value under an alias) are set as attributes of the same name, as raw()
does, converted by a field when the caller names one for them (`extra_fields`). No
caching of rows: every call reads the database.
"""

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from django.db import connection, models

M = TypeVar("M", bound=models.Model)
Converter = Callable[[Any, Any, Any], Any]
# (position of each concrete field's column, converters by field index, extra columns
# with their converters)
_Plan = tuple[
    list[int],
    list[tuple[int, list[Converter], Any]],
    list[tuple[str, int, list[Converter], Any]],
]
_PLANS: dict[tuple[str, str], _Plan] = {}


def _converters(field: models.Field, table: str) -> tuple[list[Converter], Any]:
    col = field.get_col(table)
    return connection.ops.get_db_converters(col) + col.get_db_converters(connection), col


def _plan(
    model: type[models.Model], columns: list[str], extra_fields: dict[str, models.Field]
) -> _Plan:
    position = {name: index for index, name in enumerate(columns)}
    fields = model._meta.concrete_fields
    missing = [field.column for field in fields if field.column not in position]
    if missing:
        raise ValueError(f"the query does not select {', '.join(missing)} of {model.__name__}")
    converters = []
    for index, field in enumerate(fields):
        found, col = _converters(field, model._meta.db_table)
        if found:
            converters.append((index, found, col))
    own = {field.column for field in fields}
    extras = []
    for index, name in enumerate(columns):
        if name not in own:
            field = extra_fields.get(name)
            extras.append(
                (
                    name,
                    index,
                    *(_converters(field, field.model._meta.db_table) if field else ([], None)),
                )
            )
    return [position[field.column] for field in fields], converters, extras


def fetch(
    model: type[M],
    sql: str,
    params: Sequence[Any],
    extra_fields: dict[str, models.Field] | None = None,
) -> list[M]:
    """The instances of `model` for the rows of `sql`, which selects every column of
    the model's table (`SELECT t.* ...`), and possibly more: `extra_fields` names the
    field whose conversion an extra column gets (another model's, say)."""
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
        key = (connection.vendor, sql)
        plan = _PLANS.get(key)
        if plan is None:
            columns = [column[0] for column in cursor.description]
            plan = _PLANS[key] = _plan(model, columns, extra_fields or {})
    positions, converters, extras = plan
    found = []
    for row in rows:
        values = [row[index] for index in positions]
        for index, functions, col in converters:
            value = values[index]
            for function in functions:
                value = function(value, col, connection)
            values[index] = value
        instance = model.from_db(connection.alias, None, values)
        for name, index, functions, col in extras:
            value = row[index]
            for function in functions:
                value = function(value, col, connection)
            setattr(instance, name, value)
        found.append(instance)
    return found

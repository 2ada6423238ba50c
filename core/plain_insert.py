"""INSERT model instances with one statement per model (COPY for many rows on
PostgreSQL), without bulk_create's cost.

bulk_create() compiles SQL for every row it inserts: most of a publish batch's CPU, and
the largest part of recording a group of delivery attempts. Here the statement
is built once per (database vendor, model) from the model's metadata, and each row is a
list of values: plain strings, numbers, booleans, bytes and foreign keys pass as they
are; datetimes and JSON are adapted by their field for the database in use, exactly as
the ORM would (a test reads rows back on SQLite and PostgreSQL and compares).

Two steps, so a caller can build the rows before its transaction opens (on SQLite,
BEGIN takes the one write lock) and only execute inside it. Like bulk_create, no signals
are sent. An auto-increment primary key is left to the database (and not read back);
any other primary key (a ULID) must be set on construction.
"""

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from functools import partial
from operator import attrgetter
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connection, models
from django.utils import timezone

from core import prepared_statements
from core.database import this_connection, vendor

# Fields whose Python value is already what both SQLite and psycopg take as a parameter.
_PLAIN_FIELDS = (
    models.CharField,
    models.TextField,
    models.IntegerField,
    models.BooleanField,
    models.BinaryField,
    models.ForeignKey,
)
# Parameters one statement may carry: SQLite's default limit in the versions Django
# supports; psycopg's protocol limit.
_MAX_PARAMS = {"sqlite": 999, "postgresql": 65535}
_STATEMENTS: dict[tuple[str, type], tuple[str, list[models.Field]]] = {}
# A column's value: an attribute getter, or an adapter and its field, bound per call to
# this thread's connection (_bound).
_Getter = Callable[[Any], Any] | tuple[Callable[..., Any], models.Field]
_PLANS: dict[tuple[str, type], tuple[str, list[_Getter]]] = {}

Prepared = tuple[Sequence[models.Model], str, list[list[Any]]]

# From this many rows on, PostgreSQL gets them by COPY rather than a multi-row INSERT.
# psycopg re-parses an INSERT's text for placeholders on every call once it carries over
# 50 parameters (it caches only smaller statements) and quotes each value into the text
# in Python; COPY streams the rows through its C dumpers, and the server parses no SQL
# per row. Below this many rows INSERT is cheaper: a COPY takes a second round trip
# (the figures: docs/BENCHMARKS.md).
COPY_FROM_ROWS = 6


def _statement(model: type[models.Model]) -> tuple[str, list[models.Field]]:
    """The INSERT statement for `model` and its fields, one per placeholder, in order."""
    key = (vendor(), model)
    if key not in _STATEMENTS:
        fields = [
            field
            for field in model._meta.concrete_fields
            if not isinstance(field, models.AutoField | models.BigAutoField)
        ]
        quote = connection.ops.quote_name
        columns = ", ".join(quote(field.column) for field in fields)
        placeholders = ", ".join(["%s"] * len(fields))
        table = quote(model._meta.db_table)
        # Identifiers from model metadata, quoted; every value is a query parameter.
        sql = f"INSERT INTO {table} ({columns}) VALUES ({placeholders})"  # noqa: S608
        _STATEMENTS[key] = (sql, fields)
    return _STATEMENTS[key]


def _plan(model: type[models.Model]) -> tuple[str, list[_Getter]]:
    """The INSERT statement for `model` and one value getter per column."""
    key = (vendor(), model)
    if key not in _PLANS:
        sql, fields = _statement(model)
        getters: list[_Getter] = []
        for field in fields:
            if isinstance(field, _PLAIN_FIELDS):
                getters.append(attrgetter(field.attname))
            elif isinstance(field, models.DateTimeField) and (field.auto_now or field.auto_now_add):
                getters.append((_stamped, field))
            elif (
                connection.vendor == "postgresql"
                and isinstance(field, models.DateTimeField)
                and not (field.auto_now or field.auto_now_add)
            ):
                getters.append((_datetime_for_postgresql, field))
            else:  # datetimes, JSON: the field adapts them for this database
                getters.append((_prepared, field))
        _PLANS[key] = (sql, getters)
    return _PLANS[key]


def _bound(getters: list[_Getter], conn: Any) -> list[Callable[[Any], Any]]:
    """The getters of one call: adapters given this thread's connection, and the fields
    stamped on saving (auto_now) one time for all the rows, as one request writes them."""
    bound: list[Callable[[Any], Any]] = []
    now = None
    for getter in getters:
        if callable(getter):
            bound.append(getter)
            continue
        adapt, field = getter
        if adapt is _stamped:
            now = now or timezone.now()
            bound.append(partial(_stamped, field, now, field.get_db_prep_save(now, conn)))
        else:
            bound.append(partial(adapt, field, conn))
    return bound


def _stamped(field: models.Field, now: datetime, prepared: Any, obj: models.Model) -> Any:
    """What DateTimeField.pre_save does for auto_now, with the call's one time: the
    instance gets it too."""
    setattr(obj, field.attname, now)
    return prepared


def _datetime_for_postgresql(field: models.Field, conn: Any, obj: models.Model) -> Any:
    """An aware datetime (or None) is what get_db_prep_save gives PostgreSQL anyway; the
    full path, a chain of calls per value of every row, is kept for anything else."""
    value = getattr(obj, field.attname)
    if value is None or (isinstance(value, datetime) and value.tzinfo is not None):
        return value
    return _prepared(field, conn, obj)


def _prepared(field: models.Field, conn: Any, obj: models.Model) -> Any:
    return field.get_db_prep_save(field.pre_save(obj, True), conn)


def prepare_values(model: type[models.Model], rows: Sequence[Mapping[str, Any]]) -> Prepared:
    """Like prepare(), from each row's values by field attname (`delivery_id`), without
    model instances: building those costs more than the INSERT (a recorder's group of
    Attempts). No defaults are applied and no pre_save runs: give every column."""
    if not rows:
        return (), "", []
    sql, fields = _statement(model)
    columns = [
        (field.attname, None if isinstance(field, _PLAIN_FIELDS) else field) for field in fields
    ]
    # The connection in hand: a field's adapter reads several of its attributes per
    # value, each a look-up through django.db.connection, and a batch has many values.
    conn = this_connection()
    return (
        (),
        sql,
        [
            [
                row[name] if field is None else field.get_db_prep_save(row[name], conn)
                for name, field in columns
            ]
            for row in rows
        ],
    )


def prepare(objs: Sequence[models.Model]) -> Prepared:
    """The objects (all of one model), their INSERT statement and their rows; nothing
    is executed yet."""
    if not objs:
        return objs, "", []
    sql, plan = _plan(type(objs[0]))
    getters = _bound(plan, this_connection())
    return objs, sql, [[getter(obj) for getter in getters] for obj in objs]


def execute(prepared: Sequence[Prepared]) -> None:
    """INSERT prepared rows in the order given: one multi-row statement per model (more
    only past the database's parameter limit), or on PostgreSQL one COPY from
    COPY_FROM_ROWS rows on. One statement rather than executemany()'s one step per row:
    on SQLite each step also hands the GIL back and forth, and a recorder waiting for the
    GIL between rows held the one write lock the longer."""
    with connection.cursor() as cursor:
        for _, sql, rows in prepared:
            if not rows:
                continue
            if vendor() == "postgresql" and len(rows) >= COPY_FROM_ROWS:
                _copy(cursor, sql, rows)
                continue
            per_statement = max(1, _MAX_PARAMS.get(vendor(), 999) // len(rows[0]))
            for start in range(0, len(rows), per_statement):
                cursor.execute(*_multi_row(sql, rows[start : start + per_statement]))
    _mark_saved(prepared)


def _multi_row(sql: str, rows: list[list[Any]]) -> tuple[str, list[Any]]:
    """One INSERT statement carrying every row (the caller keeps within the limit)."""
    one_row = sql[sql.rindex(" VALUES (") + len(" VALUES ") :]
    return sql + f", {one_row}" * (len(rows) - 1), [value for row in rows for value in row]


def as_one_statement(
    prepared: Sequence[Prepared], also: Sequence[tuple[str, list[Any]]] = ()
) -> tuple[str, list[Any]] | None:
    """PostgreSQL: the prepared INSERTs and the `also` statements (an UPDATE beside them)
    as ONE statement of data-modifying CTEs, or None where that cannot be (another
    database, more parameters than one statement may carry, no rows).

    Run outside a transaction, one statement is its own transaction: it commits when it
    returns, all or nothing, in one round trip where BEGIN, an INSERT per model and
    COMMIT took four (ingest's accepted event; docs/INGEST.md has the figures). Foreign
    keys between the rows hold: PostgreSQL checks them at the end of the statement (and
    Django declares them deferred, checked at commit)."""
    if vendor() != "postgresql":
        return None
    parts = [_multi_row(sql, rows) for _, sql, rows in prepared if rows]
    parts += also
    if not parts or sum(len(params) for _, params in parts) > _MAX_PARAMS["postgresql"]:
        return None
    *first, (last_sql, _) = parts
    ctes = ", ".join(f"w{index} AS ({sql})" for index, (sql, _) in enumerate(first))
    sql = f"WITH {ctes} {last_sql}" if ctes else last_sql
    return sql, [value for _, params in first for value in params] + parts[-1][1]


def execute_one_statement(prepared: Sequence[Prepared], statement: tuple[str, list[Any]]) -> None:
    """Run as_one_statement()'s `statement` for `prepared`: as a prepared statement where
    it may be (core.prepared_statements), since one caller runs the same few statements
    on every request."""
    prepared_statements.execute(*statement)
    _mark_saved(prepared)


def _mark_saved(prepared: Sequence[Prepared]) -> None:
    # Every write here goes through django.db.connection, the default database's.
    alias = DEFAULT_DB_ALIAS
    for objs, _, _ in prepared:
        for obj in objs:
            state = obj._state
            state.adding = False
            state.db = alias


def _copy(cursor: Any, insert_sql: str, rows: list[list[Any]]) -> None:
    """The rows of `insert_sql` (one _statement) by COPY FROM STDIN, in text format: the
    same adapted values the INSERT would carry. Database errors (a unique key already
    taken) come out as Django's, as from cursor.execute()."""
    head = insert_sql[: insert_sql.rindex(" VALUES (")]
    statement = "COPY" + head.removeprefix("INSERT INTO") + " FROM STDIN"
    with connection.wrap_database_errors, cursor.cursor.copy(statement) as copy:
        for row in rows:
            copy.write_row(row)

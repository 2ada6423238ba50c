"""Loading a pick's deliveries, with their event and endpoint, for sending.

A worker loads every delivery it leases, so this runs for each one: three plain SELECTs
(one per table, only the columns sending and recording read) whose rows go straight to
`Model.from_db`, with the database's converters applied only where a column needs one
(aware datetimes and booleans on SQLite). Through the ORM the same load cost several
times more: select_related + only() compiled for ~40% of a feed's CPU, and raw() then
spent ~19% of a worker's CPU mapping columns and running converters row by row.
"""

from collections.abc import Callable, Collection, Sequence
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connection, connections, models

from delivery.models import Delivery
from tenants.models import Endpoint
from webhooks.models import Event

# What sending and recording read, per table; the rest of the rows stays unread (and
# deferred: reading another field would cost a query per row).
_LOADED_FIELDS = {
    Delivery: ("id", "status", "attempts", "event_id", "endpoint_id"),
    Event: ("id", "event_type", "content_type", "payload"),
    Endpoint: (
        "id",
        "url",
        "enabled",
        "timeout_seconds",
        "consecutive_failures",
        "failing_since",
        "last_success_at",
    ),
}

Converter = Callable[[Any, Any, Any], Any]


class _Plan:
    """How to load one model's rows on one database: the SELECT's start, the attnames
    in the model's field order (as from_db takes them), and each column's converters."""

    def __init__(self, model: type[models.Model]) -> None:
        fields = [f for f in model._meta.concrete_fields if f.attname in _LOADED_FIELDS[model]]
        quote = connection.ops.quote_name
        self.select = (
            f"SELECT {', '.join(quote(f.column) for f in fields)}"  # noqa: S608 - quoted
            f" FROM {quote(model._meta.db_table)}"  # model metadata; ids are parameters
            f" WHERE {quote(model._meta.pk.column)} IN "
        )
        self.names = [f.attname for f in fields]
        self.pk_at = self.names.index(model._meta.pk.attname)
        self.converters: list[tuple[int, Any, list[Converter]]] = []
        for index, field in enumerate(fields):
            column = field.get_col(model._meta.db_table)
            found = connection.ops.get_db_converters(column) + column.get_db_converters(connection)
            if found:
                self.converters.append((index, column, found))


_PLANS: dict[tuple[str, type], _Plan] = {}


def _rows(model: type[models.Model], ids: Collection[object]) -> dict[object, Any]:
    """`model`'s rows with these primary keys (loaded fields only), by primary key."""
    # The connection itself, looked up once: each attribute read through the
    # `connection` proxy is a thread-local lookup, and this loop runs per row.
    wrapper = connections[DEFAULT_DB_ALIAS]
    key = (wrapper.vendor, model)
    plan = _PLANS.get(key) or _PLANS.setdefault(key, _Plan(model))
    with wrapper.cursor() as cursor:
        cursor.execute(f"{plan.select}({', '.join(['%s'] * len(ids))})", list(ids))
        rows = cursor.fetchall()
    alias, names = wrapper.alias, plan.names
    loaded = {}
    for row in rows:
        if plan.converters:
            row = list(row)
            for index, column, converters in plan.converters:
                value = row[index]
                for convert in converters:
                    value = convert(value, column, wrapper)
                row[index] = value
        loaded[row[plan.pk_at]] = model.from_db(alias, names, row)
    return loaded


def load_many(delivery_ids: Sequence[str]) -> dict[str, Delivery]:
    """The deliveries with their event and endpoint: one query per table. A delivery
    whose row, event or endpoint is gone (deleted meanwhile) is left out."""
    if not delivery_ids:
        return {}
    deliveries = _rows(Delivery, set(delivery_ids))
    events = _rows(Event, {d.event_id for d in deliveries.values()})
    endpoints = _rows(Endpoint, {d.endpoint_id for d in deliveries.values()})
    loaded = {}
    for pk, delivery in deliveries.items():
        event, endpoint = events.get(delivery.event_id), endpoints.get(delivery.endpoint_id)
        if event is None or endpoint is None:
            continue  # deleted between the queries (CASCADE): the delivery is gone too
        delivery.event, delivery.endpoint = event, endpoint
        loaded[pk] = delivery
    return loaded

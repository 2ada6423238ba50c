"""Loading a pick's deliveries, with their event and endpoint, for sending.

A worker loads every delivery it leases, so this runs for each one: two plain SELECTs
(deliveries joined to their endpoint, then their events by id; only the columns sending
and recording read) whose rows go straight to `Model.from_db`, with the database's
converters applied only where a column needs one (aware datetimes and booleans on
SQLite). Through the ORM the same load costs several times more: select_related + only()
compiles the query on every load, and raw() maps columns and runs converters row by row.

Why the events come in a query of their own: on PostgreSQL the events are in day
partitions (delivery.upkeep.partitions), and a join from deliveries cannot tell the planner
which days it needs, so it reads every day's partition (a hash join over all of them,
slower with every day of history kept; bench/history.py). Their ids as constants prune
it to the days they are in.
"""

from collections.abc import Callable, Collection, Sequence
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connection, connections, models

from core import tracing
from delivery.models import Delivery
from tenants.models import Endpoint
from webhooks.models import Event

# What sending and recording read, per table; the rest of the rows stays unread (and
# deferred: reading another field would cost a query per row).
_LOADED_FIELDS = {
    Delivery: ("id", "status", "attempts", "event_id", "endpoint_id", "tenant_id"),
    Event: ("id", "event_type", "content_type", "payload", "trace_parent"),
    Endpoint: (
        "id",
        "tenant_id",
        "url",
        "max_in_flight",  # with fixed_max_in_flight: whether its limit adapts
        "fixed_max_in_flight",
        "enabled",
        "timeout_seconds",
        "sign_requests",
        "send_trace_context",
        "operational_events",
        "consecutive_failures",
        "failing_since",
        "last_success_at",
    ),
}

Converter = Callable[[Any, Any, Any], Any]


class _Part:
    """One model's share of the SELECT: its loaded fields in the model's field order (as
    from_db takes them), their qualified columns, and the converters some of them need."""

    def __init__(self, model: type[models.Model], skip: Collection[str] = ()) -> None:
        wanted = set(_LOADED_FIELDS[model]) - set(skip)
        fields = [f for f in model._meta.concrete_fields if f.attname in wanted]
        quote, table = connection.ops.quote_name, model._meta.db_table
        self.model = model
        self.names = [f.attname for f in fields]
        self.columns = [f"{quote(table)}.{quote(f.column)}" for f in fields]
        self.pk_at = self.names.index(model._meta.pk.attname)
        self.converters: list[tuple[int, Any, list[Converter]]] = []
        for index, field in enumerate(fields):
            column = field.get_col(table)
            found = connection.ops.get_db_converters(column) + column.get_db_converters(connection)
            if found:
                self.converters.append((index, column, found))

    def build(self, values: Sequence[Any], alias: str, wrapper: Any) -> models.Model:
        if self.converters:
            values = list(values)
            for index, column, converters in self.converters:
                value = values[index]
                for convert in converters:
                    value = convert(value, column, wrapper)
                values[index] = value
        return self.model.from_db(alias, self.names, values)

    def shared(
        self, built: dict[object, Any], values: Sequence[Any], alias: str, wrapper: Any
    ) -> models.Model:
        """The instance for this row's primary key, built once per load: rows that share
        an event or endpoint share one instance, as the ORM's select_related would."""
        pk = values[self.pk_at]
        instance = built.get(pk)
        if instance is None:
            instance = built[pk] = self.build(values, alias, wrapper)
        return instance


class _Plan:
    """The two SELECTs (deliveries joined to their endpoint; events) for a database."""

    def __init__(self, traced: bool) -> None:
        # The event's traceparent is read only by a traced attempt (attempt_trace).
        untraced = () if traced else ("trace_parent",)
        self.parts = [_Part(Delivery), _Part(Event, skip=untraced), _Part(Endpoint)]
        delivery, event, endpoint = self.parts
        quote = connection.ops.quote_name

        def column(model: type[models.Model], name: str) -> str:
            field = model._meta.get_field(name)
            return f"{quote(model._meta.db_table)}.{quote(field.column)}"

        self.select = (
            f"SELECT {', '.join(delivery.columns + endpoint.columns)}"  # noqa: S608
            f" FROM {quote(Delivery._meta.db_table)}"  # quoted model metadata; the ids
            f" JOIN {quote(Endpoint._meta.db_table)}"  # are parameters
            f" ON {column(Endpoint, 'id')} = {column(Delivery, 'endpoint')}"
            f" WHERE {column(Delivery, 'id')} IN "
        )
        self.select_events = (
            f"SELECT {', '.join(event.columns)} FROM {quote(Event._meta.db_table)}"  # noqa: S608
            f" WHERE {column(Event, 'id')} IN "
        )
        width = len(delivery.names)
        self.slices = [slice(0, width), slice(width, None)]
        self.event_at = delivery.names.index("event_id")


_PLANS: dict[tuple[str, bool], _Plan] = {}


def load_many(delivery_ids: Sequence[str]) -> dict[str, Delivery]:
    """The deliveries with their event and endpoint, in two queries. A delivery whose row,
    event or endpoint is gone (deleted meanwhile) is left out."""
    if not delivery_ids:
        return {}
    # The connection itself, looked up once: each attribute read through the
    # `connection` proxy is a thread-local lookup, and the loop below runs per row.
    wrapper = connections[DEFAULT_DB_ALIAS]
    key = (wrapper.vendor, tracing.enabled())
    plan = _PLANS.get(key) or _PLANS.setdefault(key, _Plan(key[1]))
    ids = list(set(delivery_ids))
    alias = wrapper.alias
    (delivery_part, event_part, endpoint_part) = plan.parts
    (delivery_at, endpoint_at) = plan.slices
    with wrapper.cursor() as cursor:
        cursor.execute(f"{plan.select}({', '.join(['%s'] * len(ids))})", ids)
        rows = cursor.fetchall()
        event_ids = list({row[plan.event_at] for row in rows})
        events: dict[object, Any] = {}
        if event_ids:
            cursor.execute(f"{plan.select_events}({', '.join(['%s'] * len(event_ids))})", event_ids)
            for values in cursor.fetchall():
                event_part.shared(events, values, alias, wrapper)
    endpoints: dict[object, Any] = {}
    loaded = {}
    for row in rows:
        event = events.get(row[plan.event_at])
        if event is None:
            continue  # deleted meanwhile
        delivery = delivery_part.build(row[delivery_at], alias, wrapper)
        delivery.event = event
        delivery.endpoint = endpoint_part.shared(endpoints, row[endpoint_at], alias, wrapper)
        loaded[delivery.pk] = delivery
    return loaded

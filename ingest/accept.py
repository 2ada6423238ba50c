"""Persist an accepted event and its deliveries in one transaction, then enqueue on commit.

Shared by ingest (gateway side) and publish (sender side). The caller answers 2xx only
after `accept` returns, i.e. after the commit.

Idempotency: an event with an idempotency key is stored once per source (ingest) or per
tenant (publish); a repeat answers with the first event (`created=False`). The unique
constraints on Event are the guard: `accept` inserts optimistically and looks the earlier
event up only when the insert collides, so the common case costs no extra query.
`accept_many` (the batch publish API) does the same for a whole batch with a number of
queries that does not grow per event: a look-up of the keys already stored, one of the
tenants' endpoints, a bulk insert of the events and one of the deliveries.
"""

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import NotRequired, TypedDict, Unpack

from django.db import DatabaseError, IntegrityError, connection, transaction
from django.db.models import F, Q
from django.utils import timezone

from core import operational, plain_insert, plain_instances, plain_select, tracing
from core.database import this_connection, vendor
from core.ids import new_ulid, ulid_time_ms
from delivery.models import Delivery
from delivery.pipeline.enqueueing import enqueue_on_commit
from delivery.upkeep.partitions import Partition
from tenants.models import Endpoint, Tenant
from webhooks import key_hygiene
from webhooks.fairness_key import KeyResult
from webhooks.models import Event, Source, SourceSecret

from . import config_cache, idempotency

TENANT_NAME_LENGTH = Tenant._meta.get_field("name").max_length
FALLBACK_REASON_LENGTH = Event._meta.get_field("fallback_reason").max_length
_BULK_ATTEMPTS = 4  # an optimistic one, then up to three with the keys looked up


@dataclass(frozen=True)
class Accepted:
    event: Event
    created: bool  # False: an idempotent repeat of an earlier event
    deliveries: int


# --- hot-path look-ups -------------------------------------------------------------------------
#
# Ingest looks up a source, its secrets, its destinations and a tenant on every request.
# Compiling these through the ORM costs several times more CPU than the same rows through
# Model.objects.raw(), which still converts them (aware datetimes, booleans), and raw()
# plans its columns anew on every call (the figures: docs/BENCHMARKS.md, docs/INGEST.md).
# So the rows come through core.plain_select: the same instances, planned once. The SQL is
# built from the models' metadata, once per database vendor.

_SQL: dict[str, dict[str, str]] = {}


def _sql(name: str) -> str:
    statements = _SQL.get(vendor())
    if statements is None:
        quote = connection.ops.quote_name
        source, secret, endpoint, tenant, through = (
            quote(model._meta.db_table)
            for model in (Source, SourceSecret, Endpoint, Tenant, Source.destinations.through)
        )
        # The configuration's version in the same statement as the source (config_cache).
        version = f"({config_cache.version_sql()})" if vendor() in config_cache.VENDORS else "NULL"
        # Identifiers from model metadata, quoted; every value is a query parameter.
        statements = {
            # The source with its secrets and their expiry, newest first: one row per
            # secret (one with a NULL secret when there is none), one round trip for
            # both. Expired ones are dropped per request (config_cache keeps them).
            "source": (
                f"SELECT s.*, k.{quote('secret')} AS secret_value,"  # noqa: S608
                f" k.{quote('expires_at')} AS secret_expires_at, {version} AS config_version"
                f" FROM {source} s"
                f" LEFT JOIN {secret} k ON k.{quote('source_id')} = s.{quote('id')}"
                f" WHERE s.{quote('slug')} = %s"
                f" ORDER BY k.{quote('created_at')} DESC, k.{quote('id')} DESC"
            ),
            "destinations": (
                f"SELECT e.* FROM {endpoint} e JOIN {through} d"  # noqa: S608
                f" ON d.{quote('endpoint_id')} = e.{quote('id')}"
                f" WHERE d.{quote('source_id')} = %s ORDER BY e.{quote('id')}"
            ),
            "tenant": f"SELECT * FROM {tenant} WHERE {quote('key')} = %s",  # noqa: S608
            "tenant_endpoints": (
                f"SELECT * FROM {endpoint} WHERE {quote('tenant_id')} = %s"  # noqa: S608
                f" ORDER BY {quote('id')}"
            ),
        }
        _SQL[vendor()] = statements
    return statements[name]


_SECRET_EXPIRY = {"secret_expires_at": SourceSecret._meta.get_field("expires_at")}
_UNCACHED = config_cache.Lookups(keep=False)  # every look-up reads the database


_Secrets = list[tuple[str, datetime | None]]


def _source_with_secrets(slug: str) -> tuple[tuple[Source, _Secrets] | None, int | None]:
    """((source, its secrets with their expiry) or None, the configuration's version)."""
    rows = plain_select.fetch(Source, _sql("source"), [slug], _SECRET_EXPIRY)
    if not rows:
        # No row, no version: nothing is kept of an absence, and the next look-up that
        # needs the version reads it.
        return None, None
    secrets = [(one.secret_value, one.secret_expires_at) for one in rows if one.secret_value]
    return (rows[0], secrets), rows[0].config_version


def load_source(
    slug: str, lookups: config_cache.Lookups = _UNCACHED
) -> tuple[Source | None, list[str]]:
    """The active source named `slug` and its unexpired secrets (newest first)."""
    found = lookups.source(slug, partial(_source_with_secrets, slug))
    if found is None or not found[0].is_active:
        return None, []
    source, secrets = found
    return source, config_cache.unexpired(secrets)


def source_destinations(
    source: Source, lookups: config_cache.Lookups = _UNCACHED
) -> list[Endpoint]:
    return lookups.endpoints(
        "destinations",
        source.pk,
        partial(plain_select.fetch, Endpoint, _sql("destinations"), [source.pk]),
    )


def tenant_by_key(key: str, lookups: config_cache.Lookups = _UNCACHED) -> Tenant | None:
    return lookups.tenant(
        key, lambda: next(iter(plain_select.fetch(Tenant, _sql("tenant"), [key])), None)
    )


def resolve_tenant(
    source: Source, key: KeyResult, lookups: config_cache.Lookups = _UNCACHED
) -> tuple[Tenant | None, str]:
    """(tenant, fallback reason). Unknown keys register a tenant only if the source allows it."""
    if key.value is None:
        return None, key.missing_reason or "no fairness key configured"
    if key.value == operational.TENANT_KEY:
        return None, f"the tenant key {operational.TENANT_KEY} is the platform's own"
    tenant = tenant_by_key(key.value, lookups)
    key_hygiene.note_key(source, key.value, known=tenant is not None)
    if tenant is not None:
        return tenant, ""
    if not source.auto_register_tenants:
        return None, "unknown tenant key (auto-registration is off for this source)"
    # Registering writes at once, whatever becomes of the event: not on a source kept
    # under a version that may be gone (a source re-created, auto-registration off).
    lookups.confirm()
    allowed, reason = key_hygiene.may_register(source)
    if not allowed:
        return None, reason
    tenant, _ = Tenant.objects.get_or_create(
        key=key.value,
        defaults={
            "name": key.value[:TENANT_NAME_LENGTH],
            "auto_registered": True,
            "registered_by": source,
        },
    )
    return tenant, ""


def destinations_for(
    source: Source | None,
    tenant: Tenant | None,
    event_type: str,
    lookups: config_cache.Lookups = _UNCACHED,
) -> list[Endpoint]:
    """Gateway mode: the source's destinations. Otherwise the tenant's matching endpoints."""
    if source is not None:
        shared = source_destinations(source, lookups)
        if shared:
            return shared
    if tenant is None:
        return []
    endpoints = lookups.endpoints(
        "tenant_endpoints",
        tenant.pk,
        partial(plain_select.fetch, Endpoint, _sql("tenant_endpoints"), [tenant.pk]),
    )
    return [endpoint for endpoint in endpoints if endpoint.accepts(event_type)]


def _existing(source: Source | None, tenant: Tenant | None, idempotency_key: str) -> Event | None:
    events = Event.objects.select_related("tenant")
    if source is not None:
        return events.filter(source=source, idempotency_key=idempotency_key).first()
    return events.filter(source=None, tenant=tenant, idempotency_key=idempotency_key).first()


def _deliveries_for(event: Event, endpoints: Iterable[Endpoint]) -> list[Delivery]:
    # A delivery's id carries its event's time, not its own: on PostgreSQL it then lives
    # in its event's day partition, and the day's partitions are dropped together
    # (delivery.upkeep.partitions). Its own time is `enqueued_at`: at ingest, its event's
    # arrival (one clock read per request, not one per row).
    # core.plain_instances: Delivery(**fields) per row weighs on a publish batch's CPU.
    event_ms = ulid_time_ms(event.id)
    tenant = event.tenant
    return [
        plain_instances.new(
            Delivery,
            {
                "id": new_ulid(event_ms),
                "enqueued_at": event.received_at,
                # A disabled endpoint's work is held, not dropped: it resumes when re-enabled.
                "status": Delivery.Status.PENDING if endpoint.enabled else Delivery.Status.HELD,
            },
            {"event": event, "endpoint": endpoint, "tenant": tenant},
        )
        for endpoint in endpoints
    ]


class EventFields(TypedDict):
    """What `accept` stores for one event (and each item of an `accept_many` batch)."""

    source: Source | None
    tenant: Tenant | None
    event_type: str
    headers: dict[str, str]
    content_type: str
    payload: bytes
    idempotency_key: str | None
    fallback_reason: NotRequired[str]  # why there is no tenant (the fallback lane)
    to: NotRequired[list[Endpoint]]  # accept_many: these destinations, not the tenant's


def _new_event(fields: EventFields, received_at: datetime | None = None) -> Event:
    """`received_at`: the request's time, shared by a batch's events (default: now)."""
    tenant = fields["tenant"]
    reason = fields.get("fallback_reason", "")
    return plain_instances.new(
        Event,
        {
            "received_at": received_at or timezone.now(),
            "event_type": fields["event_type"],
            "headers": fields["headers"],
            "content_type": fields["content_type"],
            "payload": fields["payload"],
            "idempotency_key": fields["idempotency_key"],
            "fallback_reason": reason[:FALLBACK_REASON_LENGTH] if tenant is None else "",
            "trace_parent": tracing.current_traceparent(),
        },
        {"source": fields["source"], "tenant": tenant},
    )


def accept(**fields: Unpack[EventFields]) -> Accepted:
    endpoints = destinations_for(fields["source"], fields["tenant"], fields["event_type"])
    return _store(fields, endpoints)


def accept_to(
    endpoints: list[Endpoint], config_version: int | None = None, **fields: Unpack[EventFields]
) -> Accepted:
    """`accept` to the given endpoints, looked up already: ingest's destinations (through
    its kept look-ups), or a test event a tenant sends to one endpoint only. It still
    waits in the tenant's lane like any event. `config_version`: the version of the
    configuration the look-ups assumed; the write checks it and raises
    config_cache.Stale, having written nothing, if it is another by then."""
    return _store(fields, endpoints, config_version)


def _store(
    fields: EventFields, endpoints: list[Endpoint], config_version: int | None = None
) -> Accepted:
    with tracing.span("webhook.accept"):
        # The event's stored traceparent is this span's: its deliveries' attempts are
        # children of the span that accepted it.
        return _store_traced(fields, endpoints, config_version)


def _store_traced(
    fields: EventFields, endpoints: list[Endpoint], config_version: int | None
) -> Accepted:
    source, tenant, idempotency_key = fields["source"], fields["tenant"], fields["idempotency_key"]
    event = _new_event(fields)
    deliveries = _deliveries_for(event, endpoints)
    # Rows are prepared before the transaction: on SQLite, BEGIN takes the write lock, and
    # the lock is then held for two INSERT statements, not for building them.
    inserts = [plain_insert.prepare([event]), plain_insert.prepare(deliveries)]
    counted = source if source is not None and tenant is None else None
    identity = _identity(fields)
    checks = []
    if config_version is not None:
        checks.append(("webhooks_config_check(%s)", [config_version]))
    try:
        if identity is not None and idempotency.spans_partitions():
            # Keys are unique per day's partition only (ingest.idempotency): lock the
            # key and look across the days in the write's own statement, or else (in a
            # caller's transaction) before the write in the same transaction.
            guard = idempotency.guard(identity, event.id)
            if not this_connection().in_atomic_block and _checked_write(
                inserts, counted, [guard, *checks]
            ):
                enqueue_on_commit(deliveries)
                return Accepted(event, created=True, deliveries=len(deliveries))
            if checks:
                raise config_cache.Stale("no one statement to check the version in")
            with transaction.atomic():
                idempotency.lock([identity])
                earlier = _stored_events({identity}).get(identity)
                if earlier is not None:
                    return Accepted(earlier, created=False, deliveries=0)
                _write(inserts, counted, own_transaction=True)
                enqueue_on_commit(deliveries)
        elif checks:
            if not _checked_write(inserts, counted, checks):
                raise config_cache.Stale("no one statement to check the version in")
            enqueue_on_commit(deliveries)
        else:
            _write(inserts, counted)
            enqueue_on_commit(deliveries)
    except IntegrityError:
        # A repeat (or two identical requests racing): answer with the event stored first.
        earlier = _existing(source, tenant, idempotency_key) if idempotency_key else None
        if earlier is None:
            raise
        return Accepted(earlier, created=False, deliveries=0)
    return Accepted(event, created=True, deliveries=len(deliveries))


def _checked_write(
    inserts: list[plain_insert.Prepared], counted: Source | None, checks: list[tuple[str, list]]
) -> bool:
    """`_write` with `checks`; a failed version check becomes config_cache.Stale."""
    try:
        return _write(inserts, counted, checks=checks)
    except DatabaseError as exc:
        if config_cache.is_stale(exc):
            raise config_cache.Stale(str(exc)) from exc
        raise


def _fallback_update(source: Source) -> tuple[str, list]:
    quote = connection.ops.quote_name
    column = quote("fallback_count")
    # Identifiers from model metadata, quoted; the value is a query parameter.
    return (
        f"UPDATE {quote(Source._meta.db_table)} SET {column} = {column} + 1"  # noqa: S608
        f" WHERE {quote('id')} = %s",
        [source.pk],
    )


def _write(
    inserts: list[plain_insert.Prepared],
    fallback_of: Source | None,
    *,
    own_transaction: bool = False,
    checks: list[tuple[str, list]] | None = None,
) -> bool:
    """The event, its deliveries and the source's fallback count, all or nothing.

    On PostgreSQL outside a transaction this is one statement in autocommit: committed
    when it returns, so the enqueue (on commit, hence at once) and the 202 still come
    after the commit, for one round trip instead of four (BEGIN, two INSERTs, COMMIT).
    Inside a caller's transaction the same statement runs under a savepoint, so that a
    duplicate key leaves that transaction usable for the look-up of the earlier event.
    `own_transaction`: the transaction (or savepoint) around is `_store`'s own, and a
    duplicate key leaves it anyway; a savepoint of our own would only add two round
    trips (SAVEPOINT, RELEASE) to every keyed event on partitioned PostgreSQL.
    `checks`: function calls (ingest.idempotency.guard's, the configuration's version
    check), run as the statement's main query, outside a transaction only: each may raise
    and roll the whole statement back. Returns False, having written nothing, when they
    cannot be one statement."""
    also = [_fallback_update(fallback_of)] if fallback_of is not None else []
    if checks:
        calls = ", ".join(call for call, _ in checks)
        also.append((f"SELECT {calls}", [value for _, params in checks for value in params]))
    statement = plain_insert.as_one_statement(inserts, also)
    if statement is not None and (own_transaction or not this_connection().in_atomic_block):
        plain_insert.execute_one_statement(inserts, statement)
        return True
    if checks:
        return False
    with transaction.atomic():
        if statement is not None:
            plain_insert.execute_one_statement(inserts, statement)
            return True
        plain_insert.execute(inserts)
        if fallback_of is not None:
            Source.objects.filter(pk=fallback_of.pk).update(fallback_count=F("fallback_count") + 1)
    return True


# --- batches ---------------------------------------------------------------------------------


def _identity(item: EventFields) -> tuple | None:
    """What an idempotency key is unique within: the source, or (no source) the tenant."""
    key = item.get("idempotency_key")
    if not key:
        return None
    source, tenant = item["source"], item["tenant"]
    if source is not None:
        return ("source", source.pk, key)
    if tenant is not None:
        return ("tenant", tenant.pk, key)
    return None  # no source and no tenant: no constraint makes such a key unique


_LOOKUP_CHUNK = 500  # keys per query: well within every database's parameter limit


def _stored_events(identities: set[tuple], skip: Partition | None = None) -> dict[tuple, Event]:
    """The events already stored under these (kind, scope pk, key) identities; on
    PostgreSQL not looking in the partition `skip`."""
    if vendor() == "postgresql":
        # Pair by pair (ingest.idempotency.stored_ids): the query below lets PostgreSQL's
        # planner read every row of the batch's tenants. The events found, if any, by pk.
        ids = idempotency.stored_ids(identities, skip)
        if not ids:
            return {}
        events = Event.objects.select_related("tenant").in_bulk(set(ids.values()))
        return {identity: events[pk] for identity, pk in ids.items()}
    found: dict[tuple, Event] = {}
    for kind, field in (("source", "source_id"), ("tenant", "tenant_id")):
        pairs = sorted((pk, key) for one_kind, pk, key in identities if one_kind == kind)
        for start in range(0, len(pairs), _LOOKUP_CHUNK):
            chunk = pairs[start : start + _LOOKUP_CHUNK]
            condition = Q(
                idempotency_key__in={key for _, key in chunk},
                **{f"{field}__in": {pk for pk, _ in chunk}},
            )
            if kind == "tenant":
                condition &= Q(source__isnull=True)
            for event in Event.objects.select_related("tenant").filter(condition):
                identity = (kind, getattr(event, field), event.idempotency_key)
                if identity in identities:
                    found[identity] = event
    return found


class _Endpoints:
    """Destinations for many events with one query for all their tenants' endpoints."""

    def __init__(self, items: list[EventFields]) -> None:
        tenant_ids = {
            item["tenant"].pk for item in items if item["tenant"] is not None and "to" not in item
        }
        self._by_tenant: dict[int, list[tuple[Endpoint, list[str]]]] = defaultdict(list)
        if tenant_ids:
            # An endpoint for operational events takes none of its tenant's own.
            endpoints = Endpoint.objects.filter(tenant_id__in=tenant_ids, operational_events="")
            for endpoint in endpoints.order_by("pk"):
                self._by_tenant[endpoint.tenant_id].append((endpoint, endpoint.event_type_filter()))
        self._shared: dict[int, list[Endpoint]] = {}

    def for_item(self, item: EventFields) -> list[Endpoint]:
        if "to" in item:
            return item["to"]
        source, tenant = item["source"], item["tenant"]
        if source is not None:
            if source.pk not in self._shared:
                self._shared[source.pk] = source_destinations(source)
            if self._shared[source.pk]:
                return self._shared[source.pk]
        if tenant is None:
            return []
        event_type = item["event_type"]
        return [
            endpoint
            for endpoint, wanted in self._by_tenant.get(tenant.pk, [])
            if not wanted or event_type in wanted
        ]


@dataclass
class _Plan:
    """What a batch will insert, built before the transaction opens."""

    results: list[Accepted]
    events: list[Event]
    deliveries: list[Delivery]
    fallbacks: dict[int, int]
    first_in_batch: dict[tuple, Event]  # the new events with a key, by their identity


def _plan_batch(items: list[EventFields], endpoints: "_Endpoints", *, look_up: bool) -> _Plan:
    identities = {identity for identity in map(_identity, items) if identity is not None}
    stored = _stored_events(identities) if identities and look_up else {}
    plan = _Plan([], [], [], defaultdict(int), {})
    first_in_batch = plan.first_in_batch
    received_at = timezone.now()
    for item in items:
        identity = _identity(item)
        earlier = None
        if identity is not None:
            earlier = stored.get(identity) or first_in_batch.get(identity)
        if earlier is not None:
            plan.results.append(Accepted(earlier, created=False, deliveries=0))
            continue
        event = _new_event(item, received_at)
        if identity is not None:
            first_in_batch[identity] = event
        deliveries = _deliveries_for(event, endpoints.for_item(item))
        plan.events.append(event)
        plan.deliveries.extend(deliveries)
        if item["source"] is not None and item["tenant"] is None:
            plan.fallbacks[item["source"].pk] += 1
        plan.results.append(Accepted(event, created=True, deliveries=len(deliveries)))
    return plan


def _refuse_stored_meanwhile(plan: _Plan) -> None:
    """Across time partitions only (ingest.idempotency): lock the keys the batch inserts,
    then look again whether one of them was stored since the plan's look-up. If so, the
    same as a unique constraint's collision: roll back and plan again."""
    identities = set(plan.first_in_batch)
    if not identities or not idempotency.spans_partitions():
        return
    idempotency.lock(list(identities))
    # Not in the partition the batch's rows go to, if one holds them all: its unique
    # indexes catch a key stored there meanwhile, and the day a flood fills is the one
    # whose statistics lag (docs/INGEST.md).
    ids = [event.id for event in plan.first_in_batch.values()]
    own = idempotency.own_partition(min(ids))
    if own is not None and own.upper is not None and max(ids) >= own.upper:
        own = None
    if _stored_events(identities, own):
        raise IntegrityError("an idempotency key of the batch was stored meanwhile")


def accept_many(items: list[EventFields]) -> list[Accepted]:
    """Several events (each the keyword arguments of `accept`) in one transaction.

    All or nothing. Same idempotency answers as `accept` one by one, a repeat within the batch
    included (it answers with the batch's first event of that key).

    The look-ups and the building of rows happen before the transaction, which holds only
    the inserts: on SQLite the write lock is held for as short a time as possible. The
    first attempt is optimistic, as `accept` is: it does not look the keys up (on
    PostgreSQL a whole batch's look-up costs about as much as its inserts), and the
    unique constraints catch a key stored before. A collision rolls the transaction back
    and the batch is planned again, this time with the look-up (which also finds a key a
    concurrent request stored meanwhile).
    """
    with tracing.span("webhook.accept", {"webhook.batch_size": len(items)}):
        return _accept_many(items)


def _accept_many(items: list[EventFields]) -> list[Accepted]:
    endpoints = _Endpoints(items)
    for attempt in range(_BULK_ATTEMPTS):
        plan = _plan_batch(items, endpoints, look_up=attempt > 0)
        # Events go in by idempotency key: concurrent batches that share keys then take
        # the unique index's row locks in one order, and cannot deadlock (in opposite
        # orders, PostgreSQL would abort one of two batches sending the same keys).
        events = sorted(
            plan.events, key=lambda e: (e.idempotency_key is None, e.idempotency_key or "")
        )
        inserts = [plain_insert.prepare(events), plain_insert.prepare(plan.deliveries)]
        try:
            with transaction.atomic():
                _refuse_stored_meanwhile(plan)
                plain_insert.execute(inserts)
                for source_pk, count in plan.fallbacks.items():
                    Source.objects.filter(pk=source_pk).update(
                        fallback_count=F("fallback_count") + count
                    )
                enqueue_on_commit(plan.deliveries)
        except IntegrityError:
            if attempt == _BULK_ATTEMPTS - 1:
                raise
            continue
        return plan.results
    raise AssertionError("unreachable")

"""Deliveries start to finish: load them, sign, POST, record, tell the scheduler.

The steps are separate so that a worker can run each at its own grain: one query loads
every delivery of a pick, each POST runs in its own slot, and the deliveries that finish
together are recorded in one transaction and acknowledged in one scheduler call.
"""

import logging
import threading
import time
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import OperationalError, close_old_connections, connection
from django.utils import timezone

from delivery import records
from delivery.connections import ConnectionPool
from delivery.models import Delivery
from delivery.policy import decide
from delivery.scheduler import Lease, Scheduler
from delivery.transport import post
from tenants.models import Endpoint, EndpointSecret
from webhooks.models import Event
from webhooks.signatures import sign_standard_webhooks

logger = logging.getLogger(__name__)
USER_AGENT = "fairhooks/0.1 (+webhook delivery)"
SECRETS_TTL_SECONDS = 5.0
RECORD_TRIES = 3
RECORD_RETRY_SECONDS = 0.1


@dataclass(frozen=True)
class Finished:
    """A leased delivery we are done with: attempted (`sent`), held because its endpoint
    is disabled (`held`), or neither: already finished elsewhere, or deleted."""

    lease: Lease
    sent: records.Sent | None = None
    held: Delivery | None = None


def build_headers(delivery: Delivery, secrets: list[str], now: float) -> dict[str, str]:
    """Standard Webhooks headers. webhook-id is the event id: the same on every try and
    for every endpoint, so receivers can drop duplicates."""
    event = delivery.event
    timestamp = int(now)
    headers = {
        "Content-Type": event.content_type or "application/octet-stream",
        "User-Agent": USER_AGENT,
        "webhook-id": event.id,
        "webhook-timestamp": str(timestamp),
    }
    if event.event_type:
        headers["webhook-event-type"] = event.event_type
    if secrets:
        headers["webhook-signature"] = sign_standard_webhooks(
            event.id, timestamp, bytes(event.payload), secrets
        )
    return headers


# What sending and recording read, per table; the rest of the rows stays unread (and
# deferred: reading another field would cost a query per row).
_LOADED_COLUMNS = {
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


def _select(model: type, columns: Sequence[str], count: int) -> str:
    """SELECT `columns` of `model`'s rows whose primary key is one of `count` parameters."""
    quote = connection.ops.quote_name
    return (
        f"SELECT {', '.join(quote(column) for column in columns)}"  # noqa: S608 - quoted
        f" FROM {quote(model._meta.db_table)}"  # model metadata; the ids are parameters
        f" WHERE {quote(model._meta.pk.column)} IN ({', '.join(['%s'] * count)})"
    )


def _rows(model: type, ids: Collection[object]) -> dict[object, Any]:
    """`model`'s rows with these primary keys, loaded columns only, through raw(): the
    ORM still converts each value (aware datetimes, booleans), but the SQL costs no
    compilation (select_related + only() compiled for ~40% of a feed's CPU)."""
    sql = _select(model, _LOADED_COLUMNS[model], len(ids))
    return {row.pk: row for row in model.objects.raw(sql, list(ids))}


def _plain_rows(model: type, ids: Collection[object]) -> dict[object, Any]:
    """Like _rows, for models whose loaded columns need no conversion from what either
    database returns (strings, integers, bytes): each row goes straight to from_db,
    skipping raw()'s per-row column mapping and converters (~19% of a worker's CPU in
    a profile, for the deliveries and events of every pick)."""
    # from_db takes the values in the model's field order.
    fields = [f for f in model._meta.concrete_fields if f.attname in _LOADED_COLUMNS[model]]
    with connection.cursor() as cursor:
        cursor.execute(_select(model, [f.column for f in fields], len(ids)), list(ids))
        rows = cursor.fetchall()
    names = [f.attname for f in fields]
    pk_at = names.index(model._meta.pk.attname)
    return {row[pk_at]: model.from_db(connection.alias, names, row) for row in rows}


def load_many(delivery_ids: Sequence[str]) -> dict[str, Delivery]:
    """The deliveries with their event and endpoint: one query per table."""
    if not delivery_ids:
        return {}
    deliveries = _plain_rows(Delivery, set(delivery_ids))
    events = _plain_rows(Event, {d.event_id for d in deliveries.values()})
    endpoints = _rows(Endpoint, {d.endpoint_id for d in deliveries.values()})
    loaded = {}
    for pk, delivery in deliveries.items():
        event, endpoint = events.get(delivery.event_id), endpoints.get(delivery.endpoint_id)
        if event is None or endpoint is None:
            continue  # deleted between the queries (CASCADE): the delivery is gone too
        delivery.event, delivery.endpoint = event, endpoint
        loaded[pk] = delivery
    return loaded


class SecretCache:
    """Endpoints' signing secrets, read at most every `ttl` seconds per endpoint: a
    rotation or a revocation reaches deliveries within `ttl` seconds."""

    def __init__(self, ttl: float = SECRETS_TTL_SECONDS) -> None:
        self.ttl = ttl
        self._entries: dict[int, tuple[float, list[tuple[str, datetime | None]]]] = {}
        self._lock = threading.Lock()

    def active(self, endpoint_ids: Iterable[int]) -> dict[int, list[str]]:
        """endpoint id -> its active secrets, for each of endpoint_ids."""
        now = time.monotonic()
        wanted = set(endpoint_ids)
        with self._lock:
            known = {pk: self._entries.get(pk) for pk in wanted}
        stale = [pk for pk, entry in known.items() if entry is None or entry[0] <= now]
        if stale:
            fresh: dict[int, list[tuple[str, datetime | None]]] = {pk: [] for pk in stale}
            rows = EndpointSecret.objects.filter(endpoint_id__in=stale).order_by("-created_at")
            for pk, secret, expires_at in rows.values_list("endpoint_id", "secret", "expires_at"):
                fresh[pk].append((secret, expires_at))
            with self._lock:
                for pk, secrets in fresh.items():
                    self._entries[pk] = (now + self.ttl, secrets)
                    known[pk] = self._entries[pk]
        moment = timezone.now()
        return {
            pk: [secret for secret, expires in entry[1] if expires is None or expires > moment]
            for pk, entry in known.items()
        }


def triage(lease: Lease, delivery: Delivery | None) -> Finished | None:
    """None if the delivery is to be sent; else what is done with it without sending."""
    if delivery is None or delivery.status not in Delivery.OPEN_STATUSES:
        # Already finished (a duplicate after a lease expiry) or deleted: nothing to send.
        return Finished(lease)
    if not delivery.endpoint.enabled:
        return Finished(lease, held=delivery)
    return None


def attempt(
    lease: Lease, delivery: Delivery, secrets: list[str], session: ConnectionPool
) -> Finished:
    """Sign and POST once, and judge the result; nothing is written yet."""
    endpoint = delivery.endpoint
    headers = build_headers(delivery, secrets, time.time())
    started_at = timezone.now()
    result = post(
        session,
        endpoint.url,
        bytes(delivery.event.payload),
        headers,
        connect_timeout=min(settings.DELIVERY_CONNECT_TIMEOUT, endpoint.timeout_seconds),
        total_timeout=endpoint.timeout_seconds,
        response_cap_bytes=settings.DELIVERY_RESPONSE_CAP_BYTES,
    )
    decision = decide(
        result,
        delivery.attempts + 1,
        schedule=settings.RETRY_SCHEDULE_SECONDS,
        jitter=settings.RETRY_JITTER,
        retry_after_max=settings.RETRY_AFTER_MAX_SECONDS,
    )
    shown_headers = {k: v for k, v in headers.items() if k != "webhook-signature"}
    return Finished(lease, sent=records.Sent(delivery, result, decision, started_at, shown_headers))


def settle(finished: Sequence[Finished], scheduler: Scheduler) -> list[str]:
    """Record a group in one transaction, then release its leases: retries each to its
    due time, all the rest in one ack. The database is written before the scheduler
    hears of it, so a crash in between only sends a delivery again (at least once).
    Returns the new status of each attempted delivery, in order."""
    attempted = [item for item in finished if item.sent is not None]
    held = [item.held for item in finished if item.held is not None]
    for tries_left in reversed(range(RECORD_TRIES)):
        try:
            recorded = records.record_many([item.sent for item in attempted], held=held)
            break
        except OperationalError as exc:
            # A deadlock or lock timeout rolled the whole group back: write it again,
            # rather than let every lease in it expire and every delivery go out twice.
            if not tries_left:
                raise
            logger.warning("recording %d deliveries failed, retrying: %s", len(finished), exc)
            close_old_connections()
            time.sleep(RECORD_RETRY_SECONDS)
    # Acks are counted by outcome in Redis (the /metrics counters): one call per outcome.
    acks: dict[str, list[Lease]] = {}
    for item in finished:
        if item.sent is None:
            acks.setdefault("held" if item.held is not None else "stale", []).append(item.lease)
    for item, outcome in zip(attempted, recorded, strict=True):
        if outcome.status == Delivery.RETRY_SCHEDULED and outcome.next_attempt_at is not None:
            scheduler.retry_later(item.lease, outcome.next_attempt_at.timestamp())
        else:
            acks.setdefault(outcome.status, []).append(item.lease)
        if outcome.status != Delivery.DELIVERED:
            reason = item.sent.decision.reason
            logger.info("delivery %s: %s (%s)", item.lease.delivery_id, outcome.status, reason)
    for outcome_name, leases in acks.items():
        scheduler.ack(leases, outcome=outcome_name)
    return [outcome.status for outcome in recorded]


def pause_if_asked(sent: records.Sent | None, scheduler: Scheduler) -> None:
    """A 429 or 503 with Retry-After pauses the whole endpoint, not just this delivery:
    its other queued work would only hit the same wall. Called as soon as the answer
    arrives, before the attempt is recorded: a worker keeps picking meanwhile, and
    every pick before the pause would be another request into the wall."""
    if sent is None:
        return
    wait = sent.result.retry_after_seconds
    if sent.result.status_code in (429, 503) and wait:
        wait = min(wait, settings.RETRY_AFTER_MAX_SECONDS)
        scheduler.pause_endpoint(sent.delivery.endpoint_id, time.time() + wait)

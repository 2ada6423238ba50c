"""Deliveries start to finish: load them, sign, POST, record, tell the scheduler.

The steps are separate so that a worker can run each at its own grain: one query loads
every delivery of a pick, each POST runs in its own slot, and the deliveries that finish
together are recorded in one transaction and acknowledged in one scheduler call.
"""

import logging
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.db import OperationalError, close_old_connections
from django.utils import timezone

from delivery import records
from delivery.connections import ConnectionPool
from delivery.models import Delivery
from delivery.policy import decide
from delivery.scheduler import Lease, Scheduler
from delivery.transport import post
from tenants.models import EndpointSecret
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

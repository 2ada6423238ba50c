"""One delivery, start to finish: load it, sign it, POST it, record it, tell the scheduler."""

import logging
import time
from datetime import datetime

import requests
from django.conf import settings
from django.utils import timezone

from delivery import records
from delivery.models import Delivery
from delivery.policy import decide
from delivery.scheduler import Lease, Scheduler
from delivery.transport import post
from webhooks.signatures import sign_standard_webhooks

logger = logging.getLogger(__name__)
USER_AGENT = "fairhooks/0.1 (+webhook delivery)"


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


def load(delivery_id: str) -> Delivery | None:
    return (
        Delivery.objects.select_related("event", "endpoint", "tenant")
        .prefetch_related("endpoint__secrets")
        .filter(pk=delivery_id)
        .first()
    )


def send(lease: Lease, scheduler: Scheduler, session: requests.Session) -> str:
    """Deliver one leased delivery; returns what became of it (for logs and tests)."""
    delivery = load(lease.delivery_id)
    if delivery is None or delivery.status not in Delivery.OPEN_STATUSES:
        # Already finished (a duplicate after a lease expiry) or deleted: nothing to send.
        scheduler.ack([lease])
        return "stale"
    if not delivery.endpoint.enabled:
        records.hold(delivery)
        scheduler.ack([lease])
        return Delivery.HELD
    now = time.time()
    headers = build_headers(delivery, delivery.endpoint.active_secrets(), now)
    started_at: datetime = timezone.now()
    result = post(
        session,
        delivery.endpoint.url,
        bytes(delivery.event.payload),
        headers,
        connect_timeout=min(settings.DELIVERY_CONNECT_TIMEOUT, delivery.endpoint.timeout_seconds),
        total_timeout=delivery.endpoint.timeout_seconds,
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
    recorded = records.record_attempt(
        delivery, result, decision, started_at=started_at, request_headers=shown_headers
    )
    if recorded.status == Delivery.RETRY_SCHEDULED and recorded.next_attempt_at is not None:
        scheduler.retry_later(lease, recorded.next_attempt_at.timestamp())
    else:
        scheduler.ack([lease])
    if recorded.status != Delivery.DELIVERED:
        logger.info("delivery %s: %s (%s)", delivery.id, recorded.status, decision.reason)
    return recorded.status

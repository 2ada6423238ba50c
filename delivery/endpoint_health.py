"""Endpoint health: count failures, disable a failing endpoint, hold and release its work.

Deliveries for a disabled endpoint are held (kept, not attempted); re-enabling puts
them back in their lane in their original order.
"""

from datetime import timedelta

from django.conf import settings
from django.db.models import F
from django.db.models.functions import Coalesce
from django.utils import timezone

from delivery.enqueueing import enqueue_on_commit
from delivery.models import Delivery
from tenants.models import Endpoint

SUCCESS_STAMP_INTERVAL = timedelta(seconds=60)


def record_success(endpoint: Endpoint) -> None:
    """Reset the failure streak; stamp last_success_at at most once a minute (no write per delivery)."""
    now = timezone.now()
    stale = endpoint.last_success_at is None or now - endpoint.last_success_at > SUCCESS_STAMP_INTERVAL
    if endpoint.consecutive_failures or endpoint.failing_since or stale:
        Endpoint.objects.filter(pk=endpoint.pk).update(
            consecutive_failures=0, failing_since=None, last_success_at=now
        )


def record_failure(endpoint: Endpoint, reason: str) -> bool:
    """Count a failure; disable the endpoint past the thresholds. True if it was disabled now."""
    now = timezone.now()
    Endpoint.objects.filter(pk=endpoint.pk).update(
        consecutive_failures=F("consecutive_failures") + 1,
        failing_since=Coalesce(F("failing_since"), now),
        last_failure_at=now,
    )
    fresh = Endpoint.objects.only("consecutive_failures", "failing_since", "enabled").get(pk=endpoint.pk)
    too_many = fresh.consecutive_failures >= settings.ENDPOINT_DISABLE_AFTER_FAILURES
    too_long = fresh.failing_since is not None and now - fresh.failing_since >= timedelta(
        days=settings.ENDPOINT_DISABLE_AFTER_DAYS
    )
    if fresh.enabled and (too_many or too_long):
        why = (
            f"{fresh.consecutive_failures} consecutive failures"
            if too_many
            else f"failing since {fresh.failing_since:%Y-%m-%d %H:%M} UTC"
        )
        return disable(endpoint, f"Disabled automatically: {why}; last error: {reason}")
    return False


def disable(endpoint: Endpoint, reason: str) -> bool:
    """Disable with a reason operators can read; True if this call disabled it."""
    changed = Endpoint.objects.filter(pk=endpoint.pk, enabled=True).update(
        enabled=False, disabled_reason=reason[:500], disabled_at=timezone.now()
    )
    return bool(changed)


def enable(endpoint: Endpoint) -> int:
    """Re-enable and release held deliveries in order; returns how many were released."""
    Endpoint.objects.filter(pk=endpoint.pk).update(
        enabled=True, disabled_reason="", disabled_at=None, consecutive_failures=0, failing_since=None
    )
    return release_held(endpoint)


def release_held(endpoint: Endpoint) -> int:
    held = list(
        Delivery.objects.filter(endpoint=endpoint, status=Delivery.HELD)
        .select_related("tenant", "endpoint")
        .order_by("id")
    )
    if not held:
        return 0
    Delivery.objects.filter(id__in=[d.id for d in held], status=Delivery.HELD).update(
        status=Delivery.PENDING, lane=Delivery.FRESH, next_attempt_at=None
    )
    for delivery in held:
        delivery.status, delivery.lane = Delivery.PENDING, Delivery.FRESH
    enqueue_on_commit(held)
    return len(held)

"""Endpoint health: count failures, disable a failing endpoint, hold and release its work.

Deliveries for a disabled endpoint are held (kept, not attempted); re-enabling puts
them back in their lane in their original order.
"""

from collections.abc import Sequence
from datetime import datetime, timedelta
from functools import partial

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.db.models.functions import Coalesce
from django.utils import timezone

from core import operational
from delivery.models import Delivery
from delivery.pipeline.enqueueing import enqueue_on_commit
from delivery.pipeline.policy import Action, Decision
from tenants.models import Endpoint

SUCCESS_STAMP_INTERVAL = timedelta(seconds=60)
# Endpoint pk -> when this process last stamped a success: rows loaded before that stamp
# still look stale, and must not cause a write per delivery.
_stamped: dict[int, datetime] = {}


def record_outcomes(outcomes: Sequence[tuple[Endpoint, Decision]], now: datetime) -> list[bool]:
    """The health effect of a group of attempts; True where an attempt disabled its
    endpoint. Each endpoint's outcomes apply in their order, its successes cost at most
    one write, and endpoints are written in ascending id: two workers recording at once
    then lock endpoint rows in the same order and cannot deadlock."""
    disabled = [False] * len(outcomes)
    by_endpoint: dict[int, list[int]] = {}
    for index, (endpoint, _) in enumerate(outcomes):
        by_endpoint.setdefault(endpoint.pk, []).append(index)
    for pk in sorted(by_endpoint):
        succeeded: Endpoint | None = None  # set while the latest outcome is a success
        failed = False
        for index in by_endpoint[pk]:
            endpoint, decision = outcomes[index]
            if decision.action == Action.DELIVERED:
                succeeded = endpoint
                continue
            if decision.action != Action.DISABLE_ENDPOINT and not decision.counts_as_failure:
                continue
            if succeeded is not None:
                _reset(succeeded, now)  # that success ended the failure streak first
                succeeded = None
            failed = True
            if decision.action == Action.DISABLE_ENDPOINT:
                reason = f"Disabled: {decision.reason} at {now:%Y-%m-%d %H:%M} UTC"
                disabled[index] = disable(endpoint, reason)
            else:
                disabled[index] = record_failure(endpoint, decision.reason)
        if succeeded is not None:
            if failed:  # the loaded row cannot know about this group's failures
                _reset(succeeded, now)
            else:
                record_success(succeeded, now)
    return disabled


def record_success(endpoint: Endpoint, now: datetime | None = None) -> None:
    """Reset the failure streak; stamp last_success_at at most once a minute, not per delivery."""
    now = now or timezone.now()
    stamps = [t for t in (endpoint.last_success_at, _stamped.get(endpoint.pk)) if t is not None]
    stale = not stamps or now - max(stamps) > SUCCESS_STAMP_INTERVAL
    if endpoint.consecutive_failures or endpoint.failing_since or stale:
        _reset(endpoint, now)


def _reset(endpoint: Endpoint, now: datetime) -> None:
    """End the failure streak; an endpoint that counted as failing has recovered."""
    changes = {"consecutive_failures": 0, "failing_since": None, "last_success_at": now}
    rows = Endpoint.objects.filter(pk=endpoint.pk)
    # The row decides, not the loaded copy: another worker's failures may be newer.
    failing = settings.ENDPOINT_FAILING_AFTER_FAILURES
    if rows.filter(consecutive_failures__gte=failing).update(**changes):
        operational.announce_endpoint(
            operational.ENDPOINT_RECOVERED, endpoint, {"recovered_at": now.isoformat()}
        )
    else:
        rows.update(**changes)
    transaction.on_commit(partial(_stamped.__setitem__, endpoint.pk, now))


def record_failure(endpoint: Endpoint, reason: str) -> bool:
    """Count a failure; disable the endpoint past the thresholds. True if it was disabled now."""
    now = timezone.now()
    Endpoint.objects.filter(pk=endpoint.pk).update(
        consecutive_failures=F("consecutive_failures") + 1,
        failing_since=Coalesce(F("failing_since"), now),
        last_failure_at=now,
    )
    fresh = Endpoint.objects.only("consecutive_failures", "failing_since", "enabled").get(
        pk=endpoint.pk
    )
    too_many = fresh.consecutive_failures >= settings.ENDPOINT_DISABLE_AFTER_FAILURES
    too_long = fresh.failing_since is not None and now - fresh.failing_since >= timedelta(
        days=settings.ENDPOINT_DISABLE_AFTER_DAYS
    )
    if fresh.consecutive_failures == settings.ENDPOINT_FAILING_AFTER_FAILURES:
        operational.announce_endpoint(
            operational.ENDPOINT_FAILING,
            endpoint,
            {
                "consecutive_failures": fresh.consecutive_failures,
                "failing_since": fresh.failing_since.isoformat() if fresh.failing_since else None,
                "last_error": reason[:500],
            },
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
    now = timezone.now()
    changed = Endpoint.objects.filter(pk=endpoint.pk, enabled=True).update(
        enabled=False, disabled_reason=reason[:500], disabled_at=now
    )
    if changed:
        operational.announce_endpoint(
            operational.ENDPOINT_DISABLED,
            endpoint,
            {"reason": reason[:500], "disabled_at": now.isoformat()},
        )
    return bool(changed)


def release_held(endpoint: Endpoint) -> int:
    """Put the endpoint's held deliveries back in their lanes, in their original order;
    returns how many. Runs when an endpoint is re-enabled (Endpoint.enable, or a save)."""
    held = list(
        Delivery.objects.filter(endpoint=endpoint, status=Delivery.Status.HELD)
        .select_related("tenant", "endpoint")
        .order_by("id")
    )
    if not held:
        return 0
    Delivery.objects.filter(id__in=[d.id for d in held], status=Delivery.Status.HELD).update(
        status=Delivery.Status.PENDING, lane=Delivery.Lane.FRESH, next_attempt_at=None
    )
    for delivery in held:
        delivery.status, delivery.lane = Delivery.Status.PENDING, Delivery.Lane.FRESH
    enqueue_on_commit(held)
    return len(held)

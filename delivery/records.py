"""Writing what happened: one Attempt row and the Delivery's new status, in one transaction."""

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from delivery import endpoint_health
from delivery.models import Attempt, Delivery
from delivery.policy import Decision
from delivery.transport import HttpResult

_STATUS_FOR_ACTION = {
    "delivered": Delivery.DELIVERED,
    "retry": Delivery.RETRY_SCHEDULED,
    "dead": Delivery.DEAD,
    "disable_endpoint": Delivery.HELD,
}
_OUTCOME_FOR_ACTION = {
    "delivered": Attempt.DELIVERED,
    "retry": Attempt.RETRY,
    "dead": Attempt.FAILED,
    "disable_endpoint": Attempt.FAILED,
}


@dataclass(frozen=True)
class Recorded:
    status: str
    next_attempt_at: datetime | None
    endpoint_disabled: bool


def record_attempt(
    delivery: Delivery,
    result: HttpResult,
    decision: Decision,
    *,
    started_at: datetime,
    request_headers: dict[str, str],
) -> Recorded:
    """Persist one attempt. Only an open delivery changes status, so a late duplicate
    (a lease that expired while its request was still running) cannot undo a success."""
    now = timezone.now()
    status = _STATUS_FOR_ACTION[decision.action]
    next_attempt_at = now + timedelta(seconds=decision.delay_seconds) if status == Delivery.RETRY_SCHEDULED else None
    changes: dict = {
        "status": status,
        "attempts": F("attempts") + 1,
        "last_error": "" if status == Delivery.DELIVERED else decision.reason[:500],
        "next_attempt_at": next_attempt_at,
        "updated_at": now,
    }
    if status == Delivery.DELIVERED:
        changes["delivered_at"] = now
    if status == Delivery.RETRY_SCHEDULED:
        changes["lane"] = Delivery.RETRY
    disabled = False
    with transaction.atomic():
        Attempt.objects.create(
            delivery_id=delivery.id,
            number=delivery.attempts + 1,
            started_at=started_at,
            duration_ms=result.duration_ms,
            status_code=result.status_code,
            outcome=_OUTCOME_FOR_ACTION[decision.action],
            error=result.error[:500],
            response_excerpt=result.response_excerpt,
            request_headers=request_headers,
        )
        Delivery.objects.filter(pk=delivery.pk, status__in=Delivery.OPEN_STATUSES).update(**changes)
        endpoint = delivery.endpoint
        if decision.action == "disable_endpoint":
            disabled = endpoint_health.disable(endpoint, f"Disabled: {decision.reason} at {now:%Y-%m-%d %H:%M} UTC")
        elif decision.counts_as_failure:
            disabled = endpoint_health.record_failure(endpoint, decision.reason)
        elif status == Delivery.DELIVERED:
            endpoint_health.record_success(endpoint)
    return Recorded(status=status, next_attempt_at=next_attempt_at, endpoint_disabled=disabled)


def hold(delivery: Delivery) -> None:
    """The endpoint is disabled: keep the delivery, attempt nothing, count nothing."""
    Delivery.objects.filter(pk=delivery.pk, status__in=Delivery.OPEN_STATUSES).update(
        status=Delivery.HELD, updated_at=timezone.now()
    )

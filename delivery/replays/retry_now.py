"""An operator's "retry now": a delivery waiting for its next retry goes out at once
instead of at its next_attempt_at, through its tenant's retry lane (so still in the
tenant's turns and under the endpoint's caps, never around them)."""

import enum
import logging

import redis
from django.utils import timezone

from delivery.models import Delivery
from delivery.scheduler import get_scheduler

logger = logging.getLogger(__name__)


class RetryNow(enum.Enum):
    """What became of the request; `message` is what the operator reads."""

    QUEUED = "queued in its tenant's retry lane: it goes out at the tenant's next turn"
    NOT_SCHEDULED = "not waiting for a retry (it is {status}): nothing changed"
    NOT_WAITING = (
        "no longer waiting for its retry time (a worker already queued or picked it, or "
        "it finished meanwhile): nothing changed, it is not sent twice"
    )
    NOT_IN_SCHEDULE = (
        "is not in the schedule yet (saved while Redis was unreachable): the maintenance "
        "sweep adds it at its next attempt time; nothing changed"
    )
    UNAVAILABLE = "not changed: the schedule (Redis) is unreachable, try again shortly"

    def message(self, delivery: Delivery) -> str:
        return f"Delivery {delivery.pk} " + self.value.format(
            status=delivery.get_status_display().lower()
        )


def retry_now(delivery: Delivery) -> RetryNow:
    """Move a retry_scheduled delivery from the delayed set into its lane, atomically in
    Redis (one script: a pick cannot promote it in between), then record the new time on
    the row. The row is read fresh: the page the operator pressed on may be stale."""
    current = Delivery.objects.filter(pk=delivery.pk).values("status", "needs_schedule").first()
    if current is None or current["status"] != Delivery.Status.RETRY_SCHEDULED:
        delivery.status = current["status"] if current else delivery.status
        return RetryNow.NOT_SCHEDULED
    if current["needs_schedule"]:
        # Not in Redis at all: promoting would find nothing, and the sweep enqueues it.
        return RetryNow.NOT_IN_SCHEDULE
    try:
        moved = get_scheduler().promote(delivery.pk, delivery.tenant_id, delivery.endpoint_id)
    except redis.RedisError as exc:
        logger.warning("retry now of delivery %s: Redis unavailable (%s)", delivery.pk, exc)
        return RetryNow.UNAVAILABLE
    if not moved:
        return RetryNow.NOT_WAITING
    # The row says when the attempt is due, like the schedule now does. Only while it is
    # still waiting: a worker that took it meanwhile writes its own outcome.
    Delivery.objects.filter(pk=delivery.pk, status=Delivery.Status.RETRY_SCHEDULED).update(
        next_attempt_at=timezone.now()
    )
    return RetryNow.QUEUED

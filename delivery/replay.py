"""Sending finished deliveries again: dead letters replayed, delivered ones resent. Both go
back into the tenant's lane, so they go out at the tenant's normal pace (its turns), never
as a storm, and keep their webhook-id (the event's id), so receivers can deduplicate."""

from collections.abc import Iterable

from django.db import transaction

from delivery.enqueueing import enqueue_on_commit
from delivery.models import Delivery

# Held deliveries are not here: they wait for their endpoint to be enabled again and then
# resume by themselves. Open ones are already on their way.
RESENDABLE = (Delivery.Status.DEAD, Delivery.Status.DELIVERED)


def replay(deliveries: Iterable[Delivery]) -> int:
    """Make dead deliveries pending again with a fresh retry schedule; returns how many."""
    return _send_again(deliveries, (Delivery.Status.DEAD,))


def resend(deliveries: Iterable[Delivery]) -> int:
    """Send dead or delivered deliveries again (a new attempt, the same webhook-id);
    returns how many were queued. Any other status is left alone and not counted."""
    return _send_again(deliveries, RESENDABLE)


def _send_again(deliveries: Iterable[Delivery], statuses: tuple[str, ...]) -> int:
    # The Attempt history is kept; `attempts` restarts so the delivery gets the whole
    # retry schedule again (Attempt.number counts from the last replay).
    ids = [delivery.id for delivery in deliveries if delivery.status in statuses]
    with transaction.atomic():
        Delivery.objects.filter(id__in=ids, status__in=statuses).update(
            status=Delivery.Status.PENDING,
            lane=Delivery.Lane.FRESH,
            attempts=0,
            next_attempt_at=None,
            delivered_at=None,
            last_error="",
        )
        queued = list(
            Delivery.objects.filter(id__in=ids, status=Delivery.Status.PENDING)
            .select_related("tenant", "endpoint")
            .order_by("id")
        )
        enqueue_on_commit(queued)
    return len(queued)

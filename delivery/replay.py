"""Replaying dead letters: back into the tenant's lane, so a replay goes out at the
tenant's normal pace (its turns), never as a storm."""

from collections.abc import Iterable

from django.db import transaction

from delivery.enqueueing import enqueue_on_commit
from delivery.models import Delivery


def replay(deliveries: Iterable[Delivery]) -> int:
    """Make dead deliveries pending again with a fresh retry schedule; returns how many.

    The Attempt history is kept; `attempts` restarts so the replay gets the whole retry
    schedule (Attempt.number counts from the last replay).
    """
    ids = [delivery.id for delivery in deliveries if delivery.status == Delivery.Status.DEAD]
    with transaction.atomic():
        Delivery.objects.filter(id__in=ids, status=Delivery.Status.DEAD).update(
            status=Delivery.Status.PENDING,
            lane=Delivery.Lane.FRESH,
            attempts=0,
            next_attempt_at=None,
        )
        replayed = list(
            Delivery.objects.filter(id__in=ids, status=Delivery.Status.PENDING)
            .select_related("tenant", "endpoint")
            .order_by("id")
        )
        enqueue_on_commit(replayed)
    return len(replayed)

"""Sending finished deliveries again: dead letters replayed, delivered ones resent. Both go
back into the tenant's lane, so they go out at the tenant's normal pace (its turns), never
as a storm, and keep their webhook-id (the event's id), so receivers can deduplicate."""

from collections import Counter
from collections.abc import Iterable

from django.db import transaction

from delivery.models import Delivery
from delivery.pipeline.enqueueing import enqueue_on_commit
from tenants import audit
from tenants.models import AuditEntry

# Held deliveries are not here: they wait for their endpoint to be enabled again and then
# resume by themselves. Open ones are already on their way.
RESENDABLE = (Delivery.Status.DEAD, Delivery.Status.DELIVERED)


def replay(deliveries: Iterable[Delivery], *, actor=None, via: str | None = None) -> int:
    """Make dead deliveries pending again with a fresh retry schedule; returns how many.
    With `via` (an operator's or a tenant admin's act), each tenant's share is audited."""
    queued = _send_again(deliveries, (Delivery.Status.DEAD,))
    if via is not None:
        for tenant, count in Counter(delivery.tenant for delivery in queued).items():
            audit.record(
                actor=actor,
                action=AuditEntry.Action.DEAD_LETTERS_REPLAYED,
                via=via,
                tenant=tenant,
                target="dead letters",
                count=count,
            )
    return len(queued)


def resend(deliveries: Iterable[Delivery]) -> int:
    """Send dead or delivered deliveries again (a new attempt, the same webhook-id);
    returns how many were queued. Any other status is left alone and not counted."""
    return len(_send_again(deliveries, RESENDABLE))


def _send_again(deliveries: Iterable[Delivery], statuses: tuple[str, ...]) -> list[Delivery]:
    # The Attempt history is kept; `attempts` restarts so the delivery gets the whole
    # retry schedule again (Attempt.number counts from the last replay).
    ids = [delivery.id for delivery in deliveries if delivery.status in statuses]
    with transaction.atomic():
        # An event whose payload retention removed has nothing left to send.
        Delivery.objects.filter(
            id__in=ids, status__in=statuses, event__payload_pruned_at__isnull=True
        ).update(
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
    return queued

"""Putting committed deliveries into the schedule, and what to do when Redis is away.

The database row is the truth. Deliveries enter Redis only after their transaction
commits (a worker must never pick an id whose row it cannot read yet). If Redis is
unreachable then, the rows are flagged `needs_schedule` and the sweeper adds them
later: the sender already has its 202 and nothing is lost.
"""

import logging
from collections.abc import Iterable, Sequence

import redis
from django.db import transaction

from core import tracing
from core.outage_log import OutageLog
from delivery import scheduler
from delivery.models import Delivery
from delivery.scheduler import Item, get_scheduler

logger = logging.getLogger(__name__)
# Every accepted event would say it while Redis is down: once a minute, with a count.
_redis_down = OutageLog(logger)

# The one place the database's lanes meet the scheduler's words for them: the scheduler
# is a library of its own (no Django, no models) and names its lanes itself.
SCHEDULER_LANE = {Delivery.Lane.FRESH: scheduler.FRESH, Delivery.Lane.RETRY: scheduler.RETRY}
_FRESH_LANE = SCHEDULER_LANE[Delivery.Lane.FRESH]
_RETRY_LANE = SCHEDULER_LANE[Delivery.Lane.RETRY]


def item_for(delivery: Delivery) -> Item:
    """The scheduler's view of a delivery; needs `tenant` and `endpoint` loaded."""
    return items_for([delivery])[0]


def items_for(deliveries: Iterable[Delivery]) -> list[Item]:
    """item_for() of each delivery. What comes from a delivery's tenant and endpoint is
    worked out once per pair, since a publish batch's 500 deliveries mostly share a few
    (docs/INGEST.md has the figures). Pairs are told apart by pk: one call's deliveries
    were loaded together, so two copies of one tenant or endpoint hold the same values."""
    lanes: dict[tuple, tuple] = {}
    items = []
    for delivery in deliveries:
        pair = (delivery.tenant_id, delivery.endpoint_id)
        lane = lanes.get(pair)
        if lane is None:
            lane = lanes[pair] = _lane_of(delivery)
        (tenant_id, endpoint_id, weight, caps, retry_caps, endpoint_rate, tenant_rate, adaptive) = (
            lane
        )
        retrying = delivery.status == Delivery.Status.RETRY_SCHEDULED
        due_at = None
        if retrying and delivery.next_attempt_at:
            due_at = delivery.next_attempt_at.timestamp()
        items.append(
            Item(
                delivery.id,
                tenant_id,
                endpoint_id,
                weight,
                caps,
                retry_caps,
                _RETRY_LANE if retrying else _FRESH_LANE,
                due_at,
                endpoint_rate,
                tenant_rate,
                adaptive,
            )
        )
    return items


def _lane_of(delivery: Delivery) -> tuple:
    """Item's fields after the id that depend on the tenant and endpoint alone."""
    tenant, endpoint = delivery.tenant, delivery.endpoint
    return (
        tenant.pk if tenant else None,
        endpoint.pk,
        tenant.weight if tenant else 1,
        endpoint.in_flight_cap,
        endpoint.retry_max_in_flight,
        endpoint.effective_rate_per_second(),
        # The fallback lane (no tenant) has no tenant rate: it is many unknown senders.
        tenant.effective_rate_per_second() if tenant else None,
        endpoint.adapts_concurrency,
    )


def enqueue_now(deliveries: Sequence[Delivery]) -> bool:
    """Enqueue committed deliveries; on a Redis failure flag them for the sweeper."""
    if not deliveries:
        return True
    try:
        with tracing.span("webhook.enqueue", {"webhook.deliveries": len(deliveries)}):
            get_scheduler().enqueue(items_for(deliveries))
    except redis.RedisError as exc:
        # With shards, those that answered have their deliveries already: flag the rest
        # only, or the sweeper would enqueue those twice.
        ids = getattr(exc, "pending", None) or [delivery.id for delivery in deliveries]
        Delivery.objects.filter(id__in=ids).update(needs_schedule=True)
        _redis_down.warn(
            "Redis unavailable (%s): %d deliveries left for the sweeper", exc, len(ids)
        )
        return False
    return True


def enqueue_on_commit(deliveries: Iterable[Delivery]) -> None:
    """Enqueue once the surrounding transaction commits (immediately outside one)."""
    pending = [delivery for delivery in deliveries if delivery.status == Delivery.Status.PENDING]
    if pending:
        transaction.on_commit(lambda: enqueue_now(pending))

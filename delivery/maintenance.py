"""Maintenance run as RQ jobs: keep the Redis schedule in step with the database.

The database is the truth. If Redis lost the schedule (restart without persistence,
FLUSHALL, failover) its epoch marker is gone, and the whole schedule is rebuilt from
the open deliveries. Deliveries committed while Redis was unreachable are flagged
`needs_schedule` and added here.
"""

import logging
from collections.abc import Callable, Iterator

from django.db.models import QuerySet
from redis.exceptions import LockError
from redis.lock import Lock

from delivery.enqueueing import get_scheduler, item_for
from delivery.history import sample_quietly
from delivery.models import Delivery
from delivery.partitions import maintain_quietly
from delivery.replay_window import feed_replays
from delivery.retention import prune_quietly
from tenants.models import Tenant

logger = logging.getLogger(__name__)
BATCH_SIZE = 1000
# A rebuild holds a lock for this long, renewed after every batch: a rebuilder that dies
# frees it this late, and a live one never loses it to a slow batch.
REBUILD_LOCK_SECONDS = 120


class RebuildInProgress(Exception):
    """Another process is rebuilding the schedule: a second rebuild would clear what the
    first has enqueued so far while the first goes on, and enqueue deliveries twice."""


def _batches(queryset: QuerySet) -> Iterator[list[Delivery]]:
    """Keyset pagination by id (ids are time-ordered, so lanes keep arrival order)."""
    last_id = ""
    while True:
        batch = list(queryset.filter(id__gt=last_id).order_by("id")[:BATCH_SIZE])
        if not batch:
            return
        yield batch
        last_id = batch[-1].id


def rebuild_lock() -> Lock:
    scheduler = get_scheduler()
    return scheduler.connection.lock(
        scheduler.keys.rebuild_lock, timeout=REBUILD_LOCK_SECONDS, blocking=False
    )


def rebuild_schedule(progress: Callable[[int], None] | None = None) -> int:
    """Clear the schedule and enqueue every open delivery again; returns how many.
    Raises RebuildInProgress, changing nothing, while another rebuild runs."""
    lock = rebuild_lock()
    if not lock.acquire():
        raise RebuildInProgress("another process is rebuilding the schedule")
    try:
        return _rebuild(lock, progress)
    finally:
        try:
            lock.release()
        except LockError:
            logger.warning("the schedule rebuild outlasted its lock; another may have overlapped")


def _rebuild(lock: Lock, progress: Callable[[int], None] | None) -> int:
    scheduler = get_scheduler()
    scheduler.clear()
    for tenant in Tenant.objects.filter(is_active=False):
        scheduler.set_tenant(
            tenant.pk,
            weight=tenant.weight,
            paused=True,
            rate_per_second=tenant.effective_rate_per_second(),
        )
    open_deliveries = Delivery.objects.filter(
        status__in=Delivery.OPEN_STATUSES, endpoint__enabled=True
    ).select_related("tenant", "endpoint")
    count = 0
    for batch in _batches(open_deliveries):
        scheduler.enqueue([item_for(delivery) for delivery in batch])
        Delivery.objects.filter(id__in=[d.id for d in batch], needs_schedule=True).update(
            needs_schedule=False
        )
        count += len(batch)
        lock.extend(REBUILD_LOCK_SECONDS, replace_ttl=True)
        if progress:
            progress(count)
    scheduler.start_epoch()
    logger.warning("schedule rebuilt from the database: %d open deliveries", count)
    return count


def schedule_flagged() -> int:
    """Enqueue deliveries committed while Redis was unreachable."""
    scheduler = get_scheduler()
    flagged = Delivery.objects.filter(needs_schedule=True).select_related("tenant", "endpoint")
    count = 0
    for batch in _batches(flagged):
        open_ones = [d for d in batch if d.status in Delivery.OPEN_STATUSES]
        if open_ones:
            scheduler.enqueue([item_for(delivery) for delivery in open_ones])
        Delivery.objects.filter(id__in=[d.id for d in batch]).update(needs_schedule=False)
        count += len(open_ones)
    return count


def sweep() -> dict[str, int]:
    """The periodic job: rebuild after a Redis loss, else schedule what was left out.
    It also samples the dashboards' history (delivery.history), which gates itself to
    one sample per HISTORY_SAMPLE_SECONDS and never fails the sweep. Window replays get
    their next chunk here (delivery.replay_window), so they are fed at the sweep's pace,
    and expired history is pruned in bounded batches (delivery.retention)."""
    if get_scheduler().epoch() is None:
        try:
            result = {"rebuilt": rebuild_schedule(), "flagged": 0}
        except RebuildInProgress:
            # Its epoch is set when it finishes; flagged deliveries wait for that too.
            logger.info("schedule rebuild already running elsewhere; not starting another")
            result = {"rebuilt": 0, "flagged": 0}
    else:
        result = {"rebuilt": 0, "flagged": schedule_flagged()}
        # Not right after a rebuild: its epoch may not be set yet, and the chunk would
        # be enqueued into a schedule still being rebuilt (it is fed next sweep).
        result.update(feed_replays())
    sample_quietly()
    # PostgreSQL: the days ahead exist before rows need them (a catalog look a minute).
    result.update(maintain_quietly())
    # Last, in its own short transactions and within RETENTION_SWEEP_SECONDS: history
    # that has outlived its retention (delivery.retention); never open work.
    result.update(prune_quietly())
    return result

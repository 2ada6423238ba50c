"""Maintenance run as RQ jobs: keep the Redis schedule in step with the database.

The database is the truth. If Redis lost the schedule (restart without persistence,
FLUSHALL, failover) its epoch marker is gone, and the whole schedule is rebuilt from
the open deliveries. Deliveries committed while Redis was unreachable are flagged
`needs_schedule` and added here.
"""

import logging
import time
from collections.abc import Callable, Iterator, Sequence

import redis
from django.db.models import QuerySet
from django.dispatch import Signal
from redis.exceptions import LockError
from redis.lock import Lock

from delivery.models import Delivery
from delivery.pipeline.enqueueing import items_for
from delivery.replays.window import feed_replays
from delivery.scheduler import Scheduler, ShardsUnavailable, get_scheduler
from delivery.upkeep.partitions import maintain_quietly
from delivery.upkeep.retention import prune_quietly
from delivery.upkeep.sampling import sample_quietly
from tenants.models import Tenant

logger = logging.getLogger(__name__)
# Sent once per sweep, after the schedule is repaired; the layers above listen.
swept = Signal()
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


def rebuild_lock(shard: Scheduler | None = None) -> Lock:
    """The lock of one shard's rebuild (the first shard's by default): shards are rebuilt
    each on its own, so a lost shard never waits for, or clears, another."""
    shard = shard or get_scheduler().shards[0]
    return shard.connection.lock(
        shard.keys.rebuild_lock, timeout=REBUILD_LOCK_SECONDS, blocking=False
    )


def rebuild_schedule(
    progress: Callable[[int], None] | None = None, *, shards: Sequence[Scheduler] | None = None
) -> int:
    """Clear the schedule's shards (all, or `shards`) and enqueue every open delivery again,
    each into its shard; returns how many. Raises RebuildInProgress while another process
    rebuilds one of them: that one is left alone, the others are rebuilt all the same."""
    count, busy = 0, []
    for shard in get_scheduler().shards if shards is None else shards:
        lock = rebuild_lock(shard)
        if not lock.acquire():
            busy.append(shard.shard)
            continue
        try:
            done = count
            count += _rebuild(shard, lock, progress and (lambda n, done=done: progress(done + n)))
        finally:
            try:
                lock.release()
            except LockError:
                logger.warning("a schedule rebuild outlasted its lock; another may have overlapped")
    if busy:
        raise RebuildInProgress(f"another process is rebuilding the schedule (shards {busy})")
    return count


def _rebuild(shard: Scheduler, lock: Lock, progress: Callable[[int], None] | None) -> int:
    router = get_scheduler()
    shard.clear()
    for tenant in Tenant.objects.filter(is_active=False):
        shard.set_tenant(
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
        # Every shard's rebuild reads all open rows: rebuilds are rare, and the shard of a
        # row is a function of its endpoint that only the scheduler knows.
        mine = [d for d in batch if router.shard_for(d.endpoint_id) is shard]
        shard.enqueue(items_for(mine))
        Delivery.objects.filter(id__in=[d.id for d in mine], needs_schedule=True).update(
            needs_schedule=False
        )
        count += len(mine)
        lock.extend(REBUILD_LOCK_SECONDS, replace_ttl=True)
        if progress:
            progress(count)
    shard.start_epoch()
    if count:
        logger.warning(
            "schedule shard %d rebuilt from the database: %d open deliveries", shard.shard, count
        )
    else:
        # A first start, or nothing was open: there was nothing to lose.
        logger.info("schedule shard %d started: no open deliveries in the database", shard.shard)
    return count


def schedule_flagged() -> int:
    """Enqueue deliveries committed while Redis was unreachable. With shards, those of a
    shard still unreachable stay flagged for the next sweep; the rest are scheduled."""
    scheduler = get_scheduler()
    flagged = Delivery.objects.filter(needs_schedule=True).select_related("tenant", "endpoint")
    count = 0
    for batch in _batches(flagged):
        open_ones = [d for d in batch if d.status in Delivery.OPEN_STATUSES]
        pending: set[str] = set()
        if open_ones:
            try:
                scheduler.enqueue(items_for(open_ones))
            except ShardsUnavailable as exc:
                pending = set(exc.pending)
        done = [d.id for d in batch if d.id not in pending]
        Delivery.objects.filter(id__in=done).update(needs_schedule=False)
        count += len(open_ones) - len(pending)
    return count


def _lost_shards() -> list[Scheduler]:
    """Shards whose schedule is gone (no epoch). One that does not answer is not lost as
    far as we know: it is skipped this sweep, the others are looked after."""
    shards = get_scheduler().shards
    lost = []
    for shard in shards:
        try:
            if shard.epoch() is None:
                lost.append(shard)
        except redis.RedisError as exc:
            if len(shards) == 1:
                raise  # as ever: this sweep fails, the next one looks again
            logger.warning("scheduler shard %d unavailable to the sweep: %s", shard.shard, exc)
    return lost


def build_before_picking(wait_seconds: float = REBUILD_LOCK_SECONDS) -> int:
    """A new Redis has no schedule yet (no epoch): build it from the database before a
    worker's engine picks anything, so that the first sweep never rebuilds under leases
    (which would hand out again what is in flight). While another process builds it,
    wait for that. Returns how many deliveries this call enqueued."""
    deadline = time.monotonic() + wait_seconds
    while True:
        lost = _lost_shards()
        if not lost:
            return 0
        try:
            return rebuild_schedule(shards=lost)
        except RebuildInProgress:
            if time.monotonic() > deadline:
                logger.warning("the schedule is still being built elsewhere; starting anyway")
                return 0
            time.sleep(0.2)


def sweep() -> dict[str, int]:
    """The periodic job: rebuild after a Redis loss, else schedule what was left out.
    It also samples the dashboards' history (delivery.upkeep.sampling), which gates itself to
    one sample per HISTORY_SAMPLE_SECONDS and never fails the sweep. Window replays get
    their next chunk here (delivery.replays.window), so they are fed at the sweep's pace,
    and expired history is pruned in bounded batches (delivery.upkeep.retention)."""
    lost = _lost_shards()
    if lost:
        try:
            result = {"rebuilt": rebuild_schedule(shards=lost), "flagged": 0}
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
    # The read side judges what changed for the tenants (dashboards.pacing_news); a
    # receiver's failure is its own, never the sweep's.
    for _, failure in swept.send_robust(sender=sweep):
        if isinstance(failure, Exception):
            logger.warning("a sweep receiver failed: %s", failure)
    # PostgreSQL: the days ahead exist before rows need them (a catalog look a minute).
    result.update(maintain_quietly())
    # Last, in its own short transactions and within RETENTION_SWEEP_SECONDS: history
    # that has outlived its retention (delivery.upkeep.retention); never open work.
    result.update(prune_quietly())
    return result

"""The process's one scheduler, built from settings on first use.

Every caller that needs the schedule (workers, ingest, upkeep, the read side) asks here,
so a process holds one connection pool for it. SCHEDULER_SHARDS > 1 gives a
ShardedScheduler, the same face over several shards.
"""

from core import redis_connection

from .scheduler import Scheduler
from .sharded import ShardedScheduler

_scheduler: Scheduler | ShardedScheduler | None = None


def get_scheduler() -> Scheduler | ShardedScheduler:
    """The process's scheduler, built from settings the first time it is asked for."""
    global _scheduler
    if _scheduler is None:
        from django.conf import settings

        kind = ShardedScheduler if settings.SCHEDULER_SHARDS > 1 else Scheduler
        _scheduler = kind.from_settings(redis_connection.scheduler())
    return _scheduler


def install_scheduler(scheduler: Scheduler | ShardedScheduler) -> None:
    """Use this scheduler from now on (a test's clock, the simulation's own Redis)."""
    global _scheduler
    _scheduler = scheduler


def reset_scheduler() -> None:
    """Forget the cached Scheduler and its client (tests that change settings, or after a
    fork)."""
    global _scheduler
    _scheduler = None
    redis_connection.forget()

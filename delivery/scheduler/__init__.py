"""The fair scheduler: the only module that knows a Redis key of the schedule.

Usage: ``get_scheduler()`` (the process's one, from settings) or
``Scheduler.from_settings(connection)`` then enqueue / pick / ack / retry_later / renew /
wait, and pause_endpoint after a Retry-After; operators use set_tenant / set_endpoint
(weights, pauses, caps, rates) / snapshot; rebuilds use epoch / start_epoch / clear.
Several shards (split by endpoint): ``ShardedScheduler``, the same face over S Schedulers.
Design and guarantees: docs/SCHEDULER.md.
"""

from .access import get_scheduler, install_scheduler, reset_scheduler
from .scheduler import Scheduler
from .sharded import ShardedScheduler, ShardsUnavailable, shard_index
from .snapshot import DEFAULT_AGE_BUCKETS
from .values import (
    FRESH,
    RETRY,
    EndpointAnswers,
    EndpointRow,
    EndpointState,
    Item,
    Lease,
    PickResult,
    Snapshot,
    TenantRow,
)

__all__ = [
    "DEFAULT_AGE_BUCKETS",
    "FRESH",
    "RETRY",
    "EndpointAnswers",
    "EndpointRow",
    "EndpointState",
    "Item",
    "Lease",
    "PickResult",
    "Scheduler",
    "ShardedScheduler",
    "ShardsUnavailable",
    "Snapshot",
    "TenantRow",
    "get_scheduler",
    "install_scheduler",
    "reset_scheduler",
    "shard_index",
]

"""Which Redis Cluster master serves each shard of the schedule, and a warning when shards
crowd onto fewer masters than they could use.

A shard's keys share one hash tag, so one slot, so one master. Consecutive tags fall in
slots the hash scatters: on three masters with the usual even slot ranges, tags 0, 1 and 2
land on two of them (slots 13907, 9842, 5649), and the third master serves no shard at
all. Nothing breaks, but a third of the cluster is idle. A process says so when it first
uses the schedule, with a SCHEDULER_SHARD that spreads the shards (docs/SCHEDULER.md,
"Shards").
"""

import logging
from collections.abc import Sequence

from redis.cluster import RedisCluster

from .keys import Keys

logger = logging.getLogger(__name__)
# How far spreading_base looks: a few thousand tags cover any cluster's slot ranges.
SEARCH_LIMIT = 10_000


def masters_of(client: RedisCluster, tags: Sequence[int]) -> dict[int, str]:
    """Each tag's master ("host:port"), from the client's slot map (no round trip)."""
    return {tag: client.get_node_from_key(Keys(tag).stats).name for tag in tags}


def spreading_base(client: RedisCluster, count: int, start: int = 0) -> int | None:
    """The first SCHEDULER_SHARD from `start` on whose `count` consecutive tags reach as
    many masters as there are shards (or masters, if fewer); None if none within reach."""
    reach = min(count, len(client.get_primaries()))
    for base in range(start, start + SEARCH_LIMIT):
        if len(set(masters_of(client, range(base, base + count)).values())) >= reach:
            return base
    return None


def crowding(client: RedisCluster, tags: Sequence[int]) -> str | None:
    """Why these shards use fewer masters than they could, with the fix; None if they
    spread as far as they can."""
    placed = masters_of(client, tags)
    used, masters = len(set(placed.values())), len(client.get_primaries())
    if used >= min(len(tags), masters):
        return None
    by_master: dict[str, list[int]] = {}
    for tag, master in placed.items():
        by_master.setdefault(master, []).append(tag)
    where = "; ".join(
        f"{master}: {', '.join(map(str, shards))}" for master, shards in sorted(by_master.items())
    )
    base = spreading_base(client, len(tags), start=min(tags))
    old = ",".join(str(tag) for tag in tags if base is None or not base <= tag < base + len(tags))
    fix = (
        f" SCHEDULER_SHARD={base} spreads them: stop the workers, set it, then run"
        f" `manage.py rebuild_lanes --forget-shards {old}`."
        if base is not None
        else ""
    )
    idle = masters - used
    return (
        f"the schedule's {len(tags)} shards (tags {min(tags)}-{max(tags)}) land on {used} of"
        f" the cluster's {masters} masters ({where}); {idle} serve{'s' if idle == 1 else ''}"
        f" none.{fix}"
    )


def warn_if_crowded(client: RedisCluster, tags: Sequence[int]) -> None:
    """Log crowding()'s warning, if any. The slot map may be unreadable here (a cluster
    still forming): the shards work regardless, so that is only noted."""
    try:
        problem = crowding(client, tags)
    except Exception as error:  # advice only: it never stops a process
        logger.info("could not check where the scheduler's shards live: %s", error)
        return
    if problem:
        logger.warning("Redis Cluster: %s", problem)

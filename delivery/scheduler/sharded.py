"""S shards of one schedule, split by destination endpoint, behind the Scheduler's face.

Each shard is a whole Scheduler under its own hash tag (`wh:{<base + i>}:`), so on a Redis
Cluster each shard's keys live in one slot and every script stays atomic. An endpoint
lives on exactly one shard (a stable hash of its id), so everything a script decides on
for it (its caps, rate, Retry-After pause, and the turns of the tenants sharing it) is
in that shard. See docs/SCHEDULER.md, "Shards", for what becomes approximate.
"""

import logging
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

import redis
from redis.cluster import RedisCluster

from . import placement, snapshot
from .scheduler import Scheduler
from .values import (
    EndpointAnswers,
    EndpointState,
    Item,
    Lease,
    PickResult,
    Snapshot,
    TenantRow,
)

logger = logging.getLogger(__name__)
T = TypeVar("T")
# A shard that failed is skipped by this process's picks for this long, so that one
# unreachable shard costs the others a connect timeout every few seconds, not per pick.
DOWN_SECONDS = 2.0
# On a cluster the shards' wake-up lists live in different slots, and one BLPOP may not
# span slots: a worker then waits on one shard at a time, this long, turn by turn.
CLUSTER_WAKE_POLL_SECONDS = 0.25
_GOLDEN, _MASK_64 = 0x9E3779B97F4A7C15, (1 << 64) - 1  # 2^64 / the golden ratio


def shard_index(endpoint_id: int, shards: int) -> int:
    """Fibonacci hashing of the id: stable across processes, hosts and restarts (unlike
    hash()), and even for the small consecutive ids a new install has (a CRC of the
    decimal id spreads those unevenly over the shards)."""
    mixed = (int(endpoint_id) * _GOLDEN) & _MASK_64
    return (mixed >> 32) % shards


class ShardsUnavailable(redis.RedisError):
    """Some shards failed. `pending` holds what did not reach its shard (delivery ids for
    enqueue), so a caller retries those alone: the others are in place already."""

    def __init__(self, message: str, pending: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.pending = list(pending)


class ShardedScheduler:
    def __init__(self, shards: Sequence[Scheduler], pick_from: Sequence[int] = ()) -> None:
        """`pick_from`: the indexes of the shards this process picks from (and waits on);
        empty means all. Every other call goes to whichever shard it concerns."""
        if len(shards) < 2:
            raise ValueError("a ShardedScheduler needs two shards or more; use a Scheduler")
        if not all(0 <= index < len(shards) for index in pick_from):
            raise ValueError(f"pick_from {list(pick_from)} names a shard that does not exist")
        self.shards = list(shards)
        self._pickable = sorted(set(pick_from)) or list(range(len(shards)))
        self.connection = shards[0].connection
        self.mode = shards[0].mode
        self._start = 0  # the shard a pick asks first: rotated so none starves
        self._wake_turn = 0  # on a cluster, the shard whose wake-ups a wait watches
        self._down_until = [0.0] * len(shards)

    @classmethod
    def from_settings(cls, connection: "redis.Redis | RedisCluster") -> "ShardedScheduler":
        """SCHEDULER_SHARDS shards with tags SCHEDULER_SHARD, SCHEDULER_SHARD + 1, ..."""
        from django.conf import settings

        base = settings.SCHEDULER_SHARD
        shards = [
            Scheduler.from_settings(connection, shard=base + i)
            for i in range(settings.SCHEDULER_SHARDS)
        ]
        if isinstance(connection, RedisCluster):
            placement.warn_if_crowded(connection, [shard.shard for shard in shards])
        return cls(shards, pick_from=settings.SCHEDULER_PICK_SHARDS)

    def shard_for(self, endpoint_id: int) -> Scheduler:
        return self.shards[shard_index(endpoint_id, len(self.shards))]

    # --- routing helpers ---------------------------------------------------------------

    def _grouped(self, values: Iterable[T], endpoint_of: Callable[[T], int]):
        groups: dict[int, list[T]] = defaultdict(list)
        for value in values:
            groups[shard_index(endpoint_of(value), len(self.shards))].append(value)
        return groups

    def _each(self, groups: dict[int, list[T]], call: Callable[[Scheduler, list[T]], object]):
        """Call every shard with its group, even after one fails (the others' work is
        done), then raise ShardsUnavailable with the groups that failed."""
        results, failed, errors = [], [], []
        for index, group in groups.items():
            try:
                results.append(call(self.shards[index], group))
            except redis.RedisError as exc:
                self._went_down(index, exc)
                failed += group
                errors.append(exc)
        if errors:
            raise ShardsUnavailable(f"{len(errors)} shard(s) failed: {errors[0]}", failed) from (
                errors[0]
            )
        return results

    def _went_down(self, index: int, exc: Exception) -> None:
        self._down_until[index] = time.monotonic() + DOWN_SECONDS
        logger.warning("scheduler shard %d unavailable: %s", self.shards[index].shard, exc)

    # --- the Scheduler's face ------------------------------------------------------------

    def enqueue(self, items: Sequence[Item]) -> None:
        """One round trip per shard the batch touches. ShardsUnavailable.pending lists
        the delivery ids that did not reach their shard (the rest are enqueued)."""
        try:
            self._each(self._grouped(items, lambda i: i.endpoint_id), Scheduler.enqueue)
        except ShardsUnavailable as exc:
            exc.pending = [item.delivery_id for item in exc.pending]
            raise

    def pick(self, worker_id: str, max_items: int = 1) -> PickResult:
        """Shards in turn, starting one further each pick, until max_items are leased: a
        pick asks one shard when that one has enough work, and every shard is asked first
        as often as any other. A shard that fails is skipped for DOWN_SECONDS while the
        others are served; only when none answers does the pick raise."""
        count = len(self._pickable)
        order = [self._pickable[(self._start + step) % count] for step in range(count)]
        self._start = (self._start + 1) % count
        leases: list[Lease] = []
        waits: list[float] = []
        error: Exception | None = None
        now = time.monotonic()
        for index in order:
            if self._down_until[index] > now:
                continue
            try:
                result = self.shards[index].pick(worker_id, max(1, max_items) - len(leases))
            except redis.RedisError as exc:
                self._went_down(index, exc)
                error = exc
                continue
            leases += result.leases
            waits.append(result.wait_seconds)
            if len(leases) >= max_items:
                break
        if not waits:
            raise ShardsUnavailable(f"no scheduler shard answered: {error or 'all marked down'}")
        return PickResult(leases=leases, wait_seconds=0.0 if leases else min(waits))

    def ack(self, leases: Sequence[Lease], *, outcome: str = "done") -> list[str]:
        groups = self._grouped(leases, _endpoint)
        lost = self._each(groups, lambda shard, group: shard.ack(group, outcome=outcome))
        return [i for ids in lost for i in ids]

    def answered(self, leases: Sequence[Lease], answers: Sequence[EndpointAnswers] = ()) -> int:
        """Each shard its leases and its endpoints' answers, one round trip each."""
        groups = self._grouped(leases, _endpoint)
        answers_of: dict[Scheduler, list[EndpointAnswers]] = {}
        for index, group in self._grouped(answers, lambda answer: answer.endpoint_id).items():
            groups.setdefault(index, [])
            answers_of[self.shards[index]] = group

        def call(shard: Scheduler, group: list[Lease]) -> int:
            return shard.answered(group, answers_of.get(shard, ()))

        return sum(self._each(groups, call))

    def renew(self, leases: Sequence[Lease]) -> list[str]:
        lost = self._each(self._grouped(leases, _endpoint), Scheduler.renew)
        return [i for ids in lost for i in ids]

    def retry_later(self, lease: Lease, due_at: float) -> bool:
        return self.shard_for(lease.endpoint_id).retry_later(lease, due_at)

    def retry_later_many(self, retries: Sequence[tuple[Lease, float]]) -> list[bool]:
        """One round trip per shard; in the order given. ShardsUnavailable.pending holds
        the (lease, due_at) pairs whose shard failed (the others are done)."""
        groups = self._grouped(retries, lambda pair: pair[0].endpoint_id)
        done: dict[str, bool] = {}

        def call(shard: Scheduler, group: list[tuple[Lease, float]]) -> None:
            for (lease, _), result in zip(group, shard.retry_later_many(group), strict=True):
                done[lease.delivery_id] = result

        self._each(groups, call)
        return [done[lease.delivery_id] for lease, _ in retries]

    def promote(self, delivery_id: str, tenant_id: int | None, endpoint_id: int) -> bool:
        return self.shard_for(endpoint_id).promote(delivery_id, tenant_id, endpoint_id)

    def set_endpoint(self, endpoint_id: int, **config) -> None:
        self.shard_for(endpoint_id).set_endpoint(endpoint_id, **config)

    def endpoint_state(self, endpoint_id: int) -> EndpointState | None:
        return self.shard_for(endpoint_id).endpoint_state(endpoint_id)

    def pause_endpoint(self, endpoint_id: int, until: float) -> bool:
        return self.shard_for(endpoint_id).pause_endpoint(endpoint_id, until)

    def set_tenant(self, tenant_id: int | None, **config) -> None:
        """Every shard: a tenant may have lanes on any of them. Its weight and pause are
        exact on each; its rate is enforced per shard (see docs/SCHEDULER.md, Shards)."""
        for shard in self.shards:
            shard.set_tenant(tenant_id, **config)

    def wait(self, timeout: float) -> None:
        """Until any shard pushes a wake-up. On one server a single BLPOP watches every
        shard's list; on a cluster (lists in different slots) one shard at a time, in
        short turns."""
        if timeout <= 0:
            return
        first, *others = (self.shards[index] for index in self._pickable)
        if not isinstance(self.connection, RedisCluster):
            first.wait(timeout, also=[shard.keys.wake for shard in others])
            return
        self._wake_turn = (self._wake_turn + 1) % len(self._pickable)
        watched = self.shards[self._pickable[self._wake_turn]]
        watched.wait(min(timeout, CLUSTER_WAKE_POLL_SECONDS))

    def snapshot(
        self, top_n: int = 20, age_buckets: Sequence[float] = snapshot.DEFAULT_AGE_BUCKETS
    ) -> Snapshot:
        """One bounded script per shard, merged (see merge_snapshots)."""
        return merge_snapshots([shard.snapshot(top_n, age_buckets) for shard in self.shards], top_n)

    def age_histogram(self, buckets: Sequence[float]) -> dict[float, int]:
        return self.snapshot(top_n=0, age_buckets=buckets).age_histogram

    def counters(self) -> dict[str, int]:
        totals: dict[str, int] = defaultdict(int)
        for shard in self.shards:
            for name, value in shard.counters().items():
                totals[name] += value
        return dict(totals)

    def epoch(self) -> str | None:
        """None if any shard lost its schedule (maintenance rebuilds those one by one)."""
        epochs = [shard.epoch() for shard in self.shards]
        return None if None in epochs else min(epochs)

    def start_epoch(self) -> str:
        epochs = [shard.start_epoch() for shard in self.shards]
        return epochs[0]

    def clear(self) -> None:
        for shard in self.shards:
            shard.clear()


def _endpoint(lease: Lease) -> int:
    return lease.endpoint_id


def merge_snapshots(parts: Sequence[Snapshot], top_n: int) -> Snapshot:
    """Totals add up. A tenant with lanes on several shards is one row, its counts summed
    over the shards that listed it and its age the oldest: the top-N oldest tenants overall
    are among the shards' top-N, so the rows are the right ones. Tenant counts and the age
    histogram count (tenant, shard) pairs: a tenant backlogged on two shards counts twice.
    An endpoint lives on one shard, so its rows are exact."""
    tenants: dict[int | None, TenantRow] = {}
    for row in (row for part in parts for row in part.tenants):
        seen = tenants.get(row.tenant_id)
        tenants[row.tenant_id] = row if seen is None else _merged_tenant(seen, row)
    oldest = sorted(tenants.values(), key=lambda row: -row.oldest_age_seconds)[:top_n]
    endpoints = [row for part in parts for row in part.endpoints]
    held = [row for row in endpoints if row.rate_limited and not row.in_flight]
    busiest = sorted((row for row in endpoints if row not in held), key=lambda r: -r.in_flight)
    return Snapshot(
        active_tenants=sum(part.active_tenants for part in parts),
        backlogged_tenants=sum(part.backlogged_tenants for part in parts),
        fresh_depth=sum(part.fresh_depth for part in parts),
        retry_depth=sum(part.retry_depth for part in parts),
        delayed_depth=sum(part.delayed_depth for part in parts),
        in_flight=sum(part.in_flight for part in parts),
        fallback_enqueued_total=sum(part.fallback_enqueued_total for part in parts),
        fallback_depth=sum(part.fallback_depth for part in parts),
        deferrals_total=sum(part.deferrals_total for part in parts),
        oldest_age_seconds=max(part.oldest_age_seconds for part in parts),
        tenants=oldest,
        endpoints=busiest[:top_n] + held[:top_n],
        age_histogram={
            bound: sum(part.age_histogram.get(bound, 0) for part in parts)
            for bound in parts[0].age_histogram
        },
        rate_waits_total=sum(part.rate_waits_total for part in parts),
    )


def _merged_tenant(a: TenantRow, b: TenantRow) -> TenantRow:
    return TenantRow(
        tenant_id=a.tenant_id,
        fresh=a.fresh + b.fresh,
        retry=a.retry + b.retry,
        delayed=a.delayed + b.delayed,
        in_flight=a.in_flight + b.in_flight,
        oldest_age_seconds=max(a.oldest_age_seconds, b.oldest_age_seconds),
        weight=a.weight,
        paused=a.paused or b.paused,
        rate_per_second=a.rate_per_second,
        rate_limited=a.rate_limited or b.rate_limited,
    )

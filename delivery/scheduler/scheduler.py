"""The fair scheduler's face: every Redis key and script of the schedule is behind it.

Each method is one Lua script, so one round trip and one atomic step (see
docs/SCHEDULER.md for the data structures and the guarantees).
"""

import contextlib
import math
import re
from collections.abc import Callable, Sequence
from typing import Any

import redis
from redis.cluster import RedisCluster

from core.ids import ULID_LENGTH, new_ulid

from . import keys, protocol, scripts, snapshot
from .values import RETRY, EndpointAnswers, EndpointState, Item, Lease, PickResult, Snapshot

MODES = ("fair", "fifo")
_OUTCOME = re.compile(r"[a-z_]{1,32}")
# Requests per second a rate may be: token clocks run on epoch seconds (~1.8e9), exact to
# a fraction of a microsecond, so intervals stay well above that.
MAX_RATE = 10_000.0
# The shortest BLPOP a wait asks for: over a millisecond, so that no server reads it as 0
# (see wait()).
MIN_BLOCK_SECONDS = 0.002


def _rate(value: float | None, what: str) -> str:
    """A rate as a script argument: "" for none (None or 0 = unlimited)."""
    if value is None or value == 0:
        return ""
    rate = float(value)
    if not 0 < rate <= MAX_RATE:  # also refuses NaN
        raise ValueError(f"{what} must be None (unlimited) or in (0, {MAX_RATE:g}], not {value!r}")
    return repr(rate)


class Scheduler:
    def __init__(
        self,
        connection: "redis.Redis | RedisCluster",
        *,
        mode: str = "fair",
        shard: int = 0,
        turn_size: int = 1,
        retry_min_share: float = 0.1,
        fallback_weight: int = 1,
        lease_seconds: float = 30,
        clock: Callable[[], float] | None = None,
        promote_limit: int = 64,
        reclaim_limit: int = 16,
        wake_limit: int = 32,
    ) -> None:
        """`clock` is for tests: None means every script reads the Redis server's clock,
        so workers on different hosts agree on lease deadlines and token times. The limits
        bound how many due retries, expired leases and rate/pause wake-ups one pick
        handles, keeping each pick O(1)-ish."""
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
        if turn_size < 1 or fallback_weight < 1 or lease_seconds <= 0:
            raise ValueError("turn_size, fallback_weight and lease_seconds must be positive")
        if not 0 <= retry_min_share <= 1:
            raise ValueError("retry_min_share must be between 0 and 1")
        self.connection = connection
        self.mode = mode
        self.shard = shard
        self.turn_size = turn_size
        self.retry_min_share = retry_min_share
        self.fallback_weight = fallback_weight
        self.lease_seconds = lease_seconds
        self.keys = keys.Keys(shard)
        self._clock = clock
        self._limits = (promote_limit, reclaim_limit, wake_limit)
        self._scripts = scripts.register_all(connection)

    @classmethod
    def from_settings(
        cls, connection: "redis.Redis | RedisCluster", shard: int | None = None
    ) -> "Scheduler":
        """A scheduler on `connection`, configured from django.conf.settings read now (the
        scheduler itself needs no Django: this is its one door to it). `shard` overrides
        SCHEDULER_SHARD (a ShardedScheduler builds one Scheduler per tag)."""
        from django.conf import settings

        return cls(
            connection,
            mode=settings.SCHEDULER_MODE,
            shard=settings.SCHEDULER_SHARD if shard is None else shard,
            turn_size=settings.SCHEDULER_TURN_SIZE,
            retry_min_share=settings.SCHEDULER_RETRY_MIN_SHARE,
            fallback_weight=settings.SCHEDULER_FALLBACK_WEIGHT,
            lease_seconds=settings.LEASE_SECONDS,
        )

    @property
    def shards(self) -> list["Scheduler"]:
        """The shards of the schedule, each rebuilt on its own: just this one (a
        ShardedScheduler has several); so maintenance treats both alike."""
        return [self]

    def shard_for(self, endpoint_id: int) -> "Scheduler":
        return self

    def _run(self, name: str, args: Sequence[object]) -> Any:
        """Run a script with the common arguments, then `args` (packed by a record of
        protocol.py, whose names the script reads)."""
        now = -1.0 if self._clock is None else self._clock()
        common = protocol.CALL.pack(
            {"prefix": self.keys.prefix, "now": repr(now), "mode": self.mode}
        )
        return self._scripts[name](keys=[self.keys.stats], args=[*common, *args])

    def enqueue(self, items: Sequence[Item]) -> None:
        """Put a batch of deliveries in the schedule: one round trip, atomically.
        Not idempotent: enqueue each delivery once (a rebuild starts from clear())."""
        if not items:
            return
        args: list[object] = []
        for item in items:
            if len(item.delivery_id) != ULID_LENGTH:
                raise ValueError(f"delivery_id must be a ULID, got {item.delivery_id!r}")
            weight = self.fallback_weight if item.tenant_id is None else item.weight
            if weight < 1 or item.max_in_flight < 0 or item.retry_max_in_flight < 0:
                raise ValueError(f"bad weight or caps in {item!r}")
            args += protocol.ITEM.pack(
                {
                    "id": item.delivery_id,
                    "tenant": keys.tenant_token(item.tenant_id),
                    "endpoint": int(item.endpoint_id),
                    "weight": weight,
                    "max_in_flight": item.max_in_flight,
                    "retry_max_in_flight": item.retry_max_in_flight,
                    "kind": keys.KIND_OF_LANE[item.lane],
                    "due": "" if item.due_at is None else repr(float(item.due_at)),
                    "endpoint_rate": _rate(item.endpoint_rate, "endpoint_rate"),
                    "tenant_rate": _rate(item.tenant_rate, "tenant_rate"),
                    "adaptive": "1" if item.adaptive else "0",
                }
            )
        self._run("enqueue", args)

    def pick(self, worker_id: str, max_items: int = 1) -> PickResult:
        """Lease up to max_items deliveries, one tenant turn at a time, in one round trip.
        The same script first promotes due retries, reclaims expired leases and wakes what
        a rate or a pause held back once its token is due (each bounded). When nothing is
        ready, wait_seconds is the time until the next of those events (at most 5 s)."""
        promote_limit, reclaim_limit, wake_limit = self._limits
        arguments = protocol.PICK.pack(
            {
                "worker": worker_id.replace("|", "_"),
                "max_items": max(1, max_items),
                "turn_size": self.turn_size,
                "retry_share_ppm": round(self.retry_min_share * 1_000_000),
                "fallback_weight": self.fallback_weight,
                "lease_seconds": repr(float(self.lease_seconds)),
                "promote_limit": promote_limit,
                "reclaim_limit": reclaim_limit,
                "wake_limit": wake_limit,
            }
        )
        reply = protocol.PICK_REPLY.unpack(self._run(f"pick_{self.mode}", arguments))
        until = float(snapshot.text(reply["deadline"]))
        return PickResult(
            leases=[_lease(snapshot.text(member), until) for member in reply["members"]],
            wait_seconds=float(snapshot.text(reply["wait_seconds"])),
        )

    def ack(self, leases: Sequence[Lease], *, outcome: str = "done") -> list[str]:
        """Finished (delivered, dead, held): drop the leases and free their slots, in one
        round trip, counting them under `outcome` (see counters). Returns the ids whose
        lease was already lost: those were reclaimed and will be handed out again, so the
        worker must check the row before sending."""
        if not _OUTCOME.fullmatch(outcome):
            raise ValueError(f"outcome must be a short lower-case word, not {outcome!r}")
        if not leases:
            return []
        arguments = protocol.ACK.pack({"outcome": outcome}, rest=list(map(_member, leases)))
        return [snapshot.text(i) for i in self._run("ack", arguments)]

    def answered(self, leases: Sequence[Lease], answers: Sequence[EndpointAnswers] = ()) -> int:
        """The requests of these leases are over: free their endpoint slots now, in one
        round trip, while the leases stay until ack or retry_later. A worker that records
        its outcomes some milliseconds later then does not hold its endpoints' caps on
        answered requests meanwhile; if it dies first, the leases expire and the deliveries
        are handed out again, as any dead worker's are. `answers`, one per endpoint, say
        how those requests went: an adaptive endpoint's in-flight limit moves on them (see
        docs/SCHEDULER.md, "Adaptive limits"). Returns how many slots were freed (a lease
        already lost or answered frees none)."""
        if not leases and not answers:
            return 0
        signals = [
            value
            for answer in answers
            for value in protocol.ENDPOINT_ANSWERS.pack(
                {
                    "endpoint": int(answer.endpoint_id),
                    "ok": int(answer.ok),
                    "overloaded": int(answer.overloaded),
                    "latency_ms": f"{float(answer.latency_ms):.3f}",
                }
            )
        ]
        arguments = protocol.ANSWERED.pack(
            {"signals": len(answers)}, rest=[*signals, *map(_member, leases)]
        )
        return int(self._run("answered", arguments))

    def retry_later(self, lease: Lease, due_at: float) -> bool:
        """Free the slot and hold the delivery until due_at, when it enters its tenant's
        retry lane. False if the lease was lost already (nothing was changed)."""
        return self.retry_later_many([(lease, due_at)])[0]

    def retry_later_many(self, retries: Sequence[tuple[Lease, float]]) -> list[bool]:
        """retry_later for each (lease, due_at), in one round trip; in order, False for a
        lease that was lost already."""
        if not retries:
            return []
        pairs = [
            value
            for lease, due in retries
            for value in protocol.RETRY_PAIR.pack(
                {"member": _member(lease), "due": repr(float(due))}
            )
        ]
        return [
            bool(done)
            for done in self._run("retry_later", protocol.RETRY_LATER.pack({}, rest=pairs))
        ]

    def promote(self, delivery_id: str, tenant_id: int | None, endpoint_id: int) -> bool:
        """Retry now: a delivery held until its retry time enters its tenant's retry lane
        at once (behind what that lane holds already, so still at the tenant's pace).
        False if it was not held (a pick promoted it already, a worker has it, it finished
        or it is not in the schedule): nothing changed, so it is never sent twice."""
        member = "|".join(
            (
                delivery_id,
                keys.tenant_token(tenant_id),
                str(int(endpoint_id)),
                keys.KIND_OF_LANE[RETRY],
            )
        )
        return bool(self._run("promote", protocol.PROMOTE.pack({"member": member})))

    def renew(self, leases: Sequence[Lease]) -> list[str]:
        """Push the deadlines lease_seconds ahead; returns the ids whose lease was lost."""
        if not leases:
            return []
        arguments = protocol.RENEW.pack(
            {"lease_seconds": repr(float(self.lease_seconds))}, rest=list(map(_member, leases))
        )
        reply = protocol.RENEW_REPLY.unpack(self._run("renew", arguments))
        return [snapshot.text(i) for i in reply["lost"]]

    def wait(self, timeout: float, *, also: Sequence[str] = ()) -> None:
        """Sleep until an enqueue, ack or retry pushes a wake-up, or timeout passes:
        blocked work costs no CPU. `also`: more wake-up lists on the same server (other
        shards' `keys.wake`), any of which ends the wait."""
        if timeout <= 0:
            return
        # Block for less than the client's socket timeout, which would otherwise cut the
        # wait short and drop the connection (the next command would reconnect).
        limit = self.connection.get_connection_kwargs().get("socket_timeout")
        if limit:
            timeout = max(0.01, min(timeout, limit * 0.8))
        # Redis before 7 truncates a BLPOP timeout to whole milliseconds and takes 0 for
        # "block forever": a wait under a millisecond (work due that soon) would then
        # sleep until some other wake-up came, maybe never on an idle system.
        timeout = max(timeout, MIN_BLOCK_SECONDS)
        with contextlib.suppress(redis.TimeoutError):
            self.connection.blpop([self.keys.wake, *also], timeout=timeout)

    def set_tenant(
        self,
        tenant_id: int | None,
        *,
        weight: int,
        paused: bool,
        rate_per_second: float | None = None,
    ) -> None:
        """Apply an operator's change. A paused tenant keeps its lanes but gets no turns;
        on resume it continues from where it stood in the turn order.

        `rate_per_second` (None = unlimited) caps how fast the tenant's deliveries start,
        across all its endpoints, even while workers are idle: out of tokens, the tenant
        leaves the turn order until its next one is due (other tenants get its turns), then
        rejoins where it stood. Like the weight, it is also carried by each Item, so pass
        the full configuration: None removes a rate."""
        if weight < 1:
            raise ValueError("weight must be at least 1")
        arguments = protocol.SET_TENANT.pack(
            {
                "tenant": keys.tenant_token(tenant_id),
                "weight": weight,
                "paused": "1" if paused else "0",
                "rate": _rate(rate_per_second, "rate_per_second"),
            }
        )
        self._run("set_tenant", arguments)

    def set_endpoint(
        self,
        endpoint_id: int,
        *,
        max_in_flight: int,
        retry_max_in_flight: int,
        rate_per_second: float | None = None,
        adaptive: bool = False,
    ) -> None:
        """New caps and rate; a raised cap or rate un-parks waiting lanes at once.
        `adaptive` as Item's: max_in_flight is then the adaptive limit's ceiling.

        A cap bounds the requests open at once; `rate_per_second` (None = unlimited)
        bounds how many start per second, as a token bucket (GCRA) with a burst of
        max(1, floor(rate)) requests (one second's worth) after a quiet spell: over any
        window of W seconds, at most rate * W + burst start. A lane without a token parks
        until its token is due (a pick wakes it): never an attempt, and no other endpoint
        or tenant waits for it. Like the caps, it is also carried by each Item."""
        if max_in_flight < 0 or retry_max_in_flight < 0:
            raise ValueError("caps cannot be negative")
        arguments = protocol.SET_ENDPOINT.pack(
            {
                "endpoint": int(endpoint_id),
                "max_in_flight": max_in_flight,
                "retry_max_in_flight": retry_max_in_flight,
                "rate": _rate(rate_per_second, "rate_per_second"),
                "adaptive": "1" if adaptive else "0",
            }
        )
        self._run("set_endpoint", arguments)

    def pause_endpoint(self, endpoint_id: int, until: float) -> bool:
        """Start no request to the endpoint before `until` (epoch seconds), e.g. after a 429
        or 503 with Retry-After. Its lanes sleep until then, other endpoints are unaffected,
        and requests in flight finish as they will. A pause only ever extends (the later
        end wins); it survives the endpoint going idle but not a rebuild (clear()). With a
        rate, the endpoint resumes at that rate, without a burst. False if `until` has
        passed already (nothing changed)."""
        if not math.isfinite(until):
            raise ValueError(f"until must be a finite epoch time, not {until!r}")
        arguments = protocol.PAUSE_ENDPOINT.pack(
            {"endpoint": int(endpoint_id), "paused_until": repr(float(until))}
        )
        return bool(self._run("pause_endpoint", arguments))

    def snapshot(
        self, top_n: int = 20, age_buckets: Sequence[float] = snapshot.DEFAULT_AGE_BUCKETS
    ) -> Snapshot:
        """Totals, the top_n oldest tenants and busiest endpoints, and a histogram of all
        tenants' backlog ages: a bounded number of Redis operations at any tenant count."""
        arguments = protocol.SNAPSHOT.pack(
            {"top_n": max(0, top_n)}, rest=[repr(float(bound)) for bound in age_buckets]
        )
        reply = self._run("snapshot", arguments)
        return snapshot.decode(reply, tuple(age_buckets))

    def endpoint_state(self, endpoint_id: int) -> EndpointState | None:
        """The endpoint's requests in flight, its cap and, while its limit adapts, the
        limit and the latencies it moves on; None when the schedule holds nothing of it
        (an idle endpoint has no row: its limit starts anew with its next delivery)."""
        reply = protocol.ENDPOINT_STATE_REPLY.unpack(
            self._run(
                "endpoint_state", protocol.ENDPOINT_STATE.pack({"endpoint": int(endpoint_id)})
            )
        )
        if reply["in_flight"] is None:
            return None
        return EndpointState(
            in_flight=int(float(reply["in_flight"])),
            max_in_flight=int(float(reply["max_in_flight"])),
            retry_budget=snapshot.optional(reply["retry_budget"]) or 0.0,
            retry_budget_cap=snapshot.optional(reply["retry_budget_cap"]) or 0.0,
            **snapshot.adaptive_fields(reply),
        )

    def age_histogram(self, buckets: Sequence[float]) -> dict[float, int]:
        """Bound (seconds) -> number of tenants whose oldest queued work is at most that old."""
        return self.snapshot(top_n=0, age_buckets=buckets).age_histogram

    def counters(self) -> dict[str, int]:
        """Leases finished so far, by ack outcome, plus "retry" for retry_later: kept in
        Redis because worker processes come and go and would lose in-process counts."""
        stats = self.connection.hgetall(self.keys.stats)
        # Only the out: fields are counters; others (the virtual time V) may be fractional.
        fields = {snapshot.text(k): v for k, v in stats.items()}
        return {k[4:]: int(v) for k, v in fields.items() if k.startswith("out:")}

    def epoch(self) -> str | None:
        """The marker set after the last rebuild; None means Redis lost the schedule."""
        value = self.connection.get(self.keys.epoch)
        return None if value is None else snapshot.text(value)

    def start_epoch(self) -> str:
        value = new_ulid()
        self.connection.set(self.keys.epoch, value)
        return value

    def clear(self) -> None:
        """Delete every key of this shard's schedule (before a rebuild from the database),
        atomically: enqueues racing the rebuild see all of the old schedule or none."""
        self._scripts["clear"](keys=[self.keys.stats], args=[self.keys.prefix + "*"])


def _member(lease: Lease) -> str:
    return keys.lease_member(
        lease.delivery_id, lease.tenant_id, lease.endpoint_id, lease.lane, lease.token
    )


def _lease(member: str, deadline: float) -> Lease:
    delivery_id, tenant, endpoint, kind, token = member.split("|", 4)
    return Lease(
        delivery_id=delivery_id,
        tenant_id=keys.tenant_id_of(tenant),
        endpoint_id=int(endpoint),
        lane=keys.LANE_OF_KIND[kind],
        deadline=deadline,
        token=token,
    )

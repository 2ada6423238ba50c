"""Random sequences of enqueue / pick / answered / ack / retry_later / renew / crashes (lease
expiry on a fake clock) / pauses / cap changes / endpoint and tenant rates / Retry-After pauses,
checked against a model after every step: nothing lost, nothing handed out twice, first
attempts in arrival order per lane, caps never exceeded at hand-out, no hand-out beyond a
rate (a GCRA model of each endpoint and tenant) or during an endpoint's pause, and the
schedule's structural invariants. The drain at the end follows wait_seconds on the fake
clock with the rates still on: everything comes out, without spinning."""

import dataclasses
import itertools
import math

from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from core import redis_connection
from core.ids import new_ulid
from delivery.scheduler import EndpointAnswers, Item, Scheduler
from tests.scheduler_helpers import (
    FakeClock,
    assert_no_tenant_keys,
    check_invariants,
    endpoint_row,
)

TENANTS = (1, 2, 3, None)
ENDPOINTS = (1, 2, 3)
LEASE_SECONDS = 10
ID_TIME = new_ulid()[:10]  # a ULID is 10 chars of time + 16 of anything unique
RATES = (None, None, 0.5, 2, 5)
RETRY_BUDGET_FLOOR = 1  # tokens a second: lua/lib.lua's


def us(seconds: float) -> int:
    return math.floor(seconds * 1e6 + 0.5)


class Bucket:
    """The GCRA of lua/lib.lua, redone in Python (integer microseconds, burst max(1,
    floor(rate))). Its clock never runs ahead of the scheduler's: a pause only pushes that
    one on, and it clamps wherever the scheduler may. So a hand-out the scheduler makes
    must conform here too."""

    def __init__(self) -> None:
        self.tat = 0

    @staticmethod
    def interval(rate: float) -> int:
        return max(1, us(1 / rate))

    @classmethod
    def tolerance(cls, rate: float) -> int:
        return (max(1, math.floor(rate + 1e-9)) - 1) * cls.interval(rate)

    def take(self, rate: float | None, now: float) -> bool:
        if rate is None:
            return True
        conforms = self.tat <= us(now) + self.tolerance(rate)
        self.tat = max(self.tat, us(now)) + self.interval(rate)
        return conforms

    def clamp(self, rate: float | None, now: float) -> None:
        if rate is not None:
            self.tat = min(self.tat, us(now) + self.tolerance(rate) + self.interval(rate))


class ScheduleMachine(RuleBasedStateMachine):
    mode = "fair"

    def __init__(self, url: str) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.sched = Scheduler(
            redis_connection.connect(url),
            mode=self.mode,
            shard=42,
            clock=self.clock,
            lease_seconds=LEASE_SECONDS,
            reclaim_limit=2,
            promote_limit=3,
        )
        self.sched.clear()
        self.caps = {1: (1, 1), 2: (2, 1), 3: (3, 2)}
        self.adaptive = {1: False, 2: False, 3: True}  # in-flight limit adapts under the cap
        self.queued: set[str] = set()  # every delivery not acked yet
        self.held = {}  # token -> the Lease as we believe it stands
        self.arrivals = {}  # (tenant, endpoint) -> fresh ids in arrival order
        self.ids = itertools.count()  # deterministic ids: replays must behave the same
        self.first_handed = {}  # (tenant, endpoint) -> how many of those were handed out
        self.endpoint_rates = dict.fromkeys(ENDPOINTS)  # None = unlimited
        self.tenant_rates = dict.fromkeys(TENANTS)
        self.paused_tenants: set[int] = set()
        self.holds = dict.fromkeys(ENDPOINTS, 0.0)  # endpoint -> paused until
        self.buckets = {("e", e): Bucket() for e in ENDPOINTS}
        self.buckets.update({("t", t): Bucket() for t in TENANTS})

    @rule(
        tenant=st.sampled_from(TENANTS),
        endpoint=st.sampled_from(ENDPOINTS),
        n=st.integers(1, 4),
        retry=st.booleans(),
        delay=st.sampled_from((None, None, 5, 30)),
        weight=st.sampled_from((1, 2, 4)),
    )
    def enqueue(self, tenant, endpoint, n, retry, delay, weight):
        due = None if delay is None else self.clock.now + delay
        m, rm = self.caps[endpoint]
        lane = "retry" if retry else "fresh"
        ids = [f"{ID_TIME}{next(self.ids):016d}" for _ in range(n)]
        erate, trate = self.endpoint_rates[endpoint], self.tenant_rates[tenant]
        adaptive = self.adaptive[endpoint]
        items = [
            Item(i, tenant, endpoint, weight, m, rm, lane, due, erate, trate, adaptive) for i in ids
        ]
        self.sched.enqueue(items)
        self.buckets[("e", endpoint)].clamp(erate, self.clock.now)  # items carry the rates
        self.buckets[("t", tenant)].clamp(trate, self.clock.now)
        self.queued.update(item.delivery_id for item in items)
        if not retry and due is None:
            self.arrivals.setdefault((tenant, endpoint), []).extend(
                item.delivery_id for item in items
            )

    @rule(max_items=st.integers(1, 5))
    def pick(self, max_items):
        result = self.sched.pick("w", max_items)
        for lease in result.leases:
            assert lease.delivery_id in self.queued, "handed out an acked delivery"
            for token, other in list(self.held.items()):
                if other.delivery_id == lease.delivery_id:
                    assert other.deadline <= self.clock.now, "handed out twice"
                    del self.held[token]  # expired and reclaimed: that lease is lost
            self.held[lease.token] = lease
            self._check_arrival_order(lease)
            self._check_rates(lease)
        self._check_caps(result.leases)
        if result.wait_seconds > 0:
            assert self.sched.pick("w", 5).leases == [], "told to sleep with work ready"

    def _check_arrival_order(self, lease):
        lane = self.arrivals.get((lease.tenant_id, lease.endpoint_id), [])
        done = self.first_handed.get((lease.tenant_id, lease.endpoint_id), 0)
        if lease.delivery_id in lane[done:]:  # a first attempt: must be the next in line
            assert self.mode == "fifo" or lane[done] == lease.delivery_id
            self.first_handed[(lease.tenant_id, lease.endpoint_id)] = done + 1

    def _check_rates(self, lease):
        now, e, t = self.clock.now, lease.endpoint_id, lease.tenant_id
        assert now >= self.holds[e] - 1e-6, f"endpoint {e} served during its pause"
        assert self.buckets[("e", e)].take(self.endpoint_rates[e], now), f"endpoint {e} rate"
        assert self.buckets[("t", t)].take(self.tenant_rates[t], now), f"tenant {t} rate"

    def _check_caps(self, granted):
        """A lease is granted only below the caps, so wherever this pick granted one, the
        endpoint is within its caps now (leases from before a cap was lowered may exceed
        it, but then nothing more of that kind may be granted)."""
        r, keys = self.sched.connection, self.sched.keys
        answered = r.smembers(keys.prefix + "answered")  # over: they hold no slot
        leases = [m.decode().split("|") for m in r.zrange(keys.leases, 0, -1) if m not in answered]
        for e in {lease.endpoint_id for lease in granted}:
            row = endpoint_row(self.sched, e)
            m, rm = int(row["m"]), int(row["rm"])
            if row["al"] > 0:  # an adaptive limit: between 1 and the cap, and it binds
                assert 1 <= row["al"] <= max(m, 1)
                m = min(m, math.floor(row["al"]))
            assert sum(1 for x in leases if x[2] == str(e)) <= m
            if any(lease.endpoint_id == e and lease.lane == "retry" for lease in granted):
                assert sum(1 for x in leases if x[2] == str(e) and x[3] == "r") <= rm

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def ack(self, data):
        tokens = data.draw(st.lists(st.sampled_from(sorted(self.held)), min_size=1, unique=True))
        leases = [self.held.pop(token) for token in tokens]
        lost = set(self.sched.ack(leases))
        for lease in leases:
            if lease.delivery_id in lost:
                assert lease.deadline <= self.clock.now, "a live lease was lost"
            else:
                self.queued.discard(lease.delivery_id)

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def answered(self, data):
        """Requests over, not yet recorded: their slots free up, the leases stay."""
        tokens = data.draw(st.lists(st.sampled_from(sorted(self.held)), min_size=1, unique=True))
        # With how each endpoint's requests went: adaptive limits move on these.
        answers = data.draw(
            st.lists(
                st.builds(
                    EndpointAnswers,
                    st.sampled_from(ENDPOINTS),
                    st.integers(0, 3),
                    st.integers(0, 2),
                    st.sampled_from((5.0, 80.0, 900.0)),
                ),
                max_size=2,
                unique_by=lambda answer: answer.endpoint_id,
            )
        )
        self.sched.answered([self.held[token] for token in tokens], answers)

    @precondition(lambda self: self.held)
    @rule(data=st.data(), delay=st.sampled_from((0, 3, 20)))
    def retry_later(self, data, delay):
        lease = self.held.pop(data.draw(st.sampled_from(sorted(self.held))))
        if not self.sched.retry_later(lease, self.clock.now + delay):
            assert lease.deadline <= self.clock.now, "a live lease was lost"

    @precondition(lambda self: self.held)
    @rule()
    def renew(self):
        lost = set(self.sched.renew(list(self.held.values())))
        for token, lease in list(self.held.items()):
            if lease.delivery_id in lost:
                assert lease.deadline <= self.clock.now
                del self.held[token]
            else:
                deadline = self.clock.now + LEASE_SECONDS
                self.held[token] = dataclasses.replace(lease, deadline=deadline)

    @rule(seconds=st.sampled_from((1, 4, 11)))
    def time_passes(self, seconds):
        """Leases not acked or renewed in time are a crashed worker's: reclaimed later."""
        self.clock.advance(seconds)

    @rule(tenant=st.sampled_from((1, 2, 3)), paused=st.booleans())
    def pause_or_resume(self, tenant, paused):
        self._set_tenant(tenant, paused=paused)

    @rule(tenant=st.sampled_from(TENANTS), rate=st.sampled_from(RATES))
    def change_tenant_rate(self, tenant, rate):
        self.tenant_rates[tenant] = rate
        self._set_tenant(tenant)

    def _set_tenant(self, tenant, paused=None):
        if paused is not None:
            (self.paused_tenants.add if paused else self.paused_tenants.discard)(tenant)
        rate = self.tenant_rates[tenant]
        self.sched.set_tenant(
            tenant, weight=1, paused=tenant in self.paused_tenants, rate_per_second=rate
        )
        self.buckets[("t", tenant)].clamp(rate, self.clock.now)

    @rule(endpoint=st.sampled_from(ENDPOINTS), m=st.integers(0, 3), rm=st.integers(0, 2))
    def change_caps(self, endpoint, m, rm):
        self.caps[endpoint] = (m, rm)
        self._set_endpoint(endpoint)

    @rule(endpoint=st.sampled_from(ENDPOINTS), on=st.booleans())
    def change_adaptive(self, endpoint, on):
        self.adaptive[endpoint] = on
        self._set_endpoint(endpoint)

    @rule(endpoint=st.sampled_from(ENDPOINTS), rate=st.sampled_from(RATES))
    def change_endpoint_rate(self, endpoint, rate):
        self.endpoint_rates[endpoint] = rate
        self._set_endpoint(endpoint)

    def _set_endpoint(self, endpoint):
        m, rm = self.caps[endpoint]
        rate = self.endpoint_rates[endpoint]
        self.sched.set_endpoint(
            endpoint,
            max_in_flight=m,
            retry_max_in_flight=rm,
            rate_per_second=rate,
            adaptive=self.adaptive[endpoint],
        )
        self.buckets[("e", endpoint)].clamp(rate, self.clock.now)

    @rule(endpoint=st.sampled_from(ENDPOINTS), seconds=st.sampled_from((0.5, 3, 12)))
    def retry_after(self, endpoint, seconds):
        """A 429 with Retry-After: nothing to the endpoint until then."""
        until = self.clock.now + seconds
        assert self.sched.pause_endpoint(endpoint, until)
        self.holds[endpoint] = max(self.holds[endpoint], until)

    @rule(seconds=st.sampled_from((0.1, 0.25)))
    def a_moment_passes(self, seconds):
        """Rates live on sub-second times: tokens come due between picks."""
        self.clock.advance(seconds)

    @invariant()
    def no_free_room_is_held_hostage(self):
        """A lane parked on an endpoint that has a free slot and a token right now must
        have a rival for it in the rotation of a tenant that can take its turn (not
        paused, not asleep for its rate), or a wake-up due now: else rate-limited or
        paused tenants would slow the others down."""
        if self.mode != "fair":
            return
        r, keys = self.sched.connection, self.sched.keys
        vt = {t.decode() for t in r.zrange(keys.vt, 0, -1)}
        due_now = {m.decode() for m in r.zrangebyscore(keys.due, "-inf", self.clock.now + 1e-6)}
        for key in r.scan_iter(match=keys.prefix + "park:*"):
            _, e, k = key.decode()[len(keys.prefix) :].split(":")
            if f"e{e}" in due_now or self._room(e, k) <= 0:
                continue
            rivals = {t for t in vt if e.encode() in r.lrange(f"{keys.prefix}rot:{t}:{k}", 0, -1)}
            assert rivals, f"endpoint {e} has room, its parked {k}-lanes wait for nothing"

    def _room(self, e, k) -> float:
        """min(free slots for kind k, whether a token is ready): the scripts' capacity()."""
        r, keys = self.sched.connection, self.sched.keys
        row = endpoint_row(self.sched, e)
        m, rm, ri, rate = (row.get(name) for name in ("m", "rm", "ri", "rr"))
        if row.get("al", 0) > 0:  # an adaptive limit under the cap is the one that binds
            m = min(m, math.floor(row["al"]))
        free = int(m or 0) - int(r.zscore(keys.busy, e) or 0)
        if k == "r":
            free = min(free, int(rm or 0) - int(ri or 0), math.floor(self._retry_budget(row, m)))
        now, hold = us(self.clock.now), r.zscore(keys.hold, e)
        if not rate:
            return free if hold is None or hold <= self.clock.now + 1e-6 else 0
        rate = float(rate)
        tat = max(int(r.zscore(keys.tat, f"e{e}") or 0), now)
        if hold is not None:
            tat = max(tat, us(hold) + Bucket.tolerance(rate))
        return free if now + Bucket.tolerance(rate) - tat >= 0 else 0

    def _retry_budget(self, row: dict, limit: float) -> float:
        """The tokens of the endpoint's retry budget now, as lib.lua's retry_budget: twice
        the in-flight limit when full (`bs` 0), else refilled by one a second since `bs`."""
        cap = 2 * max(1, int(limit or 0))
        if not row.get("bs"):
            return cap
        return min(cap, row["bt"] + (self.clock.now - row["bs"]) * RETRY_BUDGET_FLOOR)

    @invariant()
    def nothing_lost_or_duplicated(self):
        ids = check_invariants(self.sched)
        assert max(ids.values(), default=1) == 1, "a delivery is in two places"
        assert set(ids) == self.queued, "a delivery was lost or resurrected"

    def teardown(self):
        """Release the operators' brakes and drain with the rates and pauses still on,
        sleeping wait_seconds on the fake clock: all work comes out, no pick spins, and
        once the token clocks have caught up with now, no tenant key is left."""
        for tenant in (1, 2, 3):
            self._set_tenant(tenant, paused=False)
        for endpoint in ENDPOINTS:
            self.caps[endpoint] = (3, 2)
            self._set_endpoint(endpoint)
        self.clock.advance(1000)
        # A pick that hands out nothing yet says "look again now" has upkeep pending (due
        # retries to promote, leases to reclaim: a few per pick), so it makes progress.
        # Without progress it would spin: far more of those than there is work.
        look_again, work = 0, len(self.queued)
        for _ in range(3000):
            result = self.sched.pick("drain", 20)
            for lease in result.leases:
                self._check_rates(lease)
            self.sched.ack(result.leases)
            self.queued.difference_update(lease.delivery_id for lease in result.leases)
            if not self.queued:
                break
            if not result.leases and result.wait_seconds == 0:
                look_again += 1
                assert look_again <= work + 10, "a pick spins"
            self.clock.advance(result.wait_seconds)
        assert not self.queued, "work left behind under rates or pauses"
        self.clock.advance(100)
        self.sched.pick("drain")  # forgets the token clocks that have caught up
        assert_no_tenant_keys(self.sched)
        self.sched.clear()
        self.sched.connection.close()


class FifoScheduleMachine(ScheduleMachine):
    mode = "fifo"


PROFILE = {
    "stateful_step_count": 40,
    "deadline": None,
    "suppress_health_check": [HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
}
# The model checks the scripts' logic on the plain Redis; on the cluster the same runs check
# that every step stays on its slot's node and that the cluster client carries the scripts,
# which the first examples already exercise: fewer of them keep the fast suite fast.
EXAMPLES = {"fair": {False: 100, True: 40}, "fifo": {False: 40, True: 15}}  # by "is a cluster"


def check_properties(machine: type[ScheduleMachine], url: str) -> None:
    examples = EXAMPLES[machine.mode][redis_connection.is_cluster_url(url)]
    run_state_machine_as_test(
        lambda: machine(url), settings=hypothesis_settings(max_examples=examples, **PROFILE)
    )


def test_fair_schedule_properties(scheduler_redis_url):
    check_properties(ScheduleMachine, scheduler_redis_url)


def test_fifo_schedule_properties(scheduler_redis_url):
    check_properties(FifoScheduleMachine, scheduler_redis_url)

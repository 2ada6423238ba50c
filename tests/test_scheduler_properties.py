"""Random sequences of enqueue / pick / ack / retry_later / renew / crashes (lease expiry
on a fake clock) / pauses / cap changes, checked against a model after every step:
nothing lost, nothing handed out twice, first attempts in arrival order per lane, caps
never exceeded at hand-out, and the schedule's structural invariants."""

import dataclasses
import itertools

import redis
from django.conf import settings
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from delivery.scheduler import Item, Scheduler
from tests.test_scheduler import FakeClock, assert_no_tenant_keys, check_invariants
from webhooks.ids import new_ulid

TENANTS = (1, 2, 3, None)
ENDPOINTS = (1, 2, 3)
LEASE_SECONDS = 10
ID_TIME = new_ulid()[:10]  # a ULID is 10 chars of time + 16 of anything unique


class ScheduleMachine(RuleBasedStateMachine):
    mode = "fair"

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.sched = Scheduler(
            redis.Redis.from_url(settings.REDIS_URL),
            mode=self.mode,
            shard=42,
            clock=self.clock,
            lease_seconds=LEASE_SECONDS,
            reclaim_limit=2,
            promote_limit=3,
        )
        self.sched.clear()
        self.caps = {1: (1, 1), 2: (2, 1), 3: (3, 2)}
        self.queued: set[str] = set()  # every delivery not acked yet
        self.held = {}  # token -> the Lease as we believe it stands
        self.arrivals = {}  # (tenant, endpoint) -> fresh ids in arrival order
        self.ids = itertools.count()  # deterministic ids: replays must behave the same
        self.first_handed = {}  # (tenant, endpoint) -> how many of those were handed out

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
        items = [Item(i, tenant, endpoint, weight, m, rm, lane, due) for i in ids]
        self.sched.enqueue(items)
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
        self._check_caps(result.leases)
        if result.wait_seconds > 0:
            assert self.sched.pick("w", 5).leases == [], "told to sleep with work ready"

    def _check_arrival_order(self, lease):
        lane = self.arrivals.get((lease.tenant_id, lease.endpoint_id), [])
        done = self.first_handed.get((lease.tenant_id, lease.endpoint_id), 0)
        if lease.delivery_id in lane[done:]:  # a first attempt: must be the next in line
            assert self.mode == "fifo" or lane[done] == lease.delivery_id
            self.first_handed[(lease.tenant_id, lease.endpoint_id)] = done + 1

    def _check_caps(self, granted):
        """A lease is granted only below the caps, so wherever this pick granted one, the
        endpoint is within its caps now (leases from before a cap was lowered may exceed
        it, but then nothing more of that kind may be granted)."""
        r, keys = self.sched.connection, self.sched.keys
        leases = [m.decode().split("|") for m in r.zrange(keys.leases, 0, -1)]
        for e in {lease.endpoint_id for lease in granted}:
            m, rm = (int(v) for v in r.hmget(keys.endpoint(e), "m", "rm"))
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
        self.sched.set_tenant(tenant, weight=1, paused=paused)

    @rule(endpoint=st.sampled_from(ENDPOINTS), m=st.integers(0, 3), rm=st.integers(0, 2))
    def change_caps(self, endpoint, m, rm):
        self.caps[endpoint] = (m, rm)
        self.sched.set_endpoint(endpoint, max_in_flight=m, retry_max_in_flight=rm)

    @invariant()
    def nothing_lost_or_duplicated(self):
        ids = check_invariants(self.sched)
        assert max(ids.values(), default=1) == 1, "a delivery is in two places"
        assert set(ids) == self.queued, "a delivery was lost or resurrected"

    def teardown(self):
        """Release every brake and drain: all work comes out and no tenant key is left."""
        for tenant in (1, 2, 3):
            self.sched.set_tenant(tenant, weight=1, paused=False)
        for endpoint in ENDPOINTS:
            self.sched.set_endpoint(endpoint, max_in_flight=3, retry_max_in_flight=2)
        self.clock.advance(1000)
        for _ in range(200):
            leases = self.sched.pick("drain", 20).leases
            if not leases and not self.sched.snapshot().delayed_depth:
                break
            self.sched.ack(leases)
            self.queued.difference_update(lease.delivery_id for lease in leases)
        assert not self.queued
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
ScheduleMachine.TestCase.settings = hypothesis_settings(max_examples=100, **PROFILE)
FifoScheduleMachine.TestCase.settings = hypothesis_settings(max_examples=40, **PROFILE)
TestFairScheduleProperties = ScheduleMachine.TestCase
TestFifoScheduleProperties = FifoScheduleMachine.TestCase

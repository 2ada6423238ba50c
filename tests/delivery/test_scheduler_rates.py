"""Dispatch-time rate limits and Retry-After pauses, against a real Redis.

Rate arithmetic runs on the scheduler's injectable clock (FakeClock), so the shared
machine's noise cannot move the numbers; two tests use the Redis server's clock over a
few real seconds, reading each dispatch's time from its lease (server time, not client
time) with tolerances that hold under load.
"""

import threading
import time
from collections import Counter

import pytest

from core.ids import new_ulid
from delivery.scheduler import FRESH, RETRY, Item, Lease, Scheduler
from tests.scheduler_helpers import (
    T0,
    FakeClock,
    assert_no_tenant_keys,
    batch,
    check_invariants,
    endpoint_row,
    script_command,
)

WIDE = 1000  # a cap that never binds: these tests are about rates


def run(
    sched: Scheduler, clock: FakeClock, seconds: float, max_items: int = 10
) -> tuple[list[tuple[float, Lease]], int]:
    """A worker on the fake clock for `seconds`: pick, ack at once, then do what
    Scheduler.wait does: return at once if a wake-up token is waiting, else sleep exactly
    wait_seconds. Returns (time, lease) of every dispatch, and the picks it took. A pick
    that hands out nothing and gives no time to sleep would be a spin: it fails the test."""
    end = clock.now + seconds
    out: list[tuple[float, Lease]] = []
    picks = 0
    while clock.now < end:
        result = sched.pick("w", max_items)
        picks += 1
        out += [(clock.now, lease) for lease in result.leases]
        sched.ack(result.leases)
        if result.wait_seconds > 0:
            if not sched.connection.lpop(sched.keys.wake):
                clock.advance(result.wait_seconds)
        else:
            assert result.leases, "a pick with nothing to hand out said not to sleep"
    return [(t, lease) for t, lease in out if t < end], picks


def times_of(dispatched, **match) -> list[float]:
    return [
        t
        for t, lease in dispatched
        if all(getattr(lease, name) == value for name, value in match.items())
    ]


def most_in_any_window(times: list[float], window: float) -> int:
    """The most dispatches in any half-open window of `window` seconds."""
    best, start = 0, 0
    for end in range(len(times)):
        while times[end] - times[start] >= window - 1e-6:  # fake-clock sums: ~0.25 us off
            start += 1
        best = max(best, end - start + 1)
    return best


def burst_of(rate: float) -> int:
    """What the scheduler allows at once after a quiet spell: max(1, rate), rounded down."""
    return max(1, int(rate))


# --- an endpoint's rate ------------------------------------------------------------------


@pytest.mark.parametrize("rate", [0.5, 2.5, 5, 40])
def test_an_endpoint_rate_holds_within_ten_percent_over_a_window(redis_conn, rate):
    clock = FakeClock()
    sched = Scheduler(redis_conn, clock=clock)
    sched.enqueue(batch(1, 1, int(rate * 30) + 10, max_in_flight=WIDE, endpoint_rate=rate))

    dispatched, picks = run(sched, clock, 20)

    times = times_of(dispatched)
    assert times[: burst_of(rate)] == [T0] * burst_of(rate)  # the burst, then the pace
    steady = [t for t in times if T0 + 4 <= t < T0 + 14]  # ten seconds after the burst
    assert rate * 10 * 0.9 <= len(steady) <= rate * 10 * 1.1, len(steady)
    # The bucket's promise, over any window: at most rate x window + burst.
    for window in (1, 2, 5):
        assert most_in_any_window(times, window) <= rate * window + burst_of(rate)
    assert picks <= len(times) + 2  # no spinning: every pick but the last hands one out
    check_invariants(sched)


def test_measured_real_time_rate_is_within_ten_percent(redis_conn):
    """The Redis server's clock, about 3.5 real seconds at 20/s; each dispatch's server time
    is its lease deadline minus the lease length. A late worker loses nothing: the bucket
    keeps the time it was owed (up to its burst)."""
    rate, lease_seconds = 20.0, 30.0
    sched = Scheduler(redis_conn, lease_seconds=lease_seconds)
    sched.enqueue(batch(1, 1, 400, max_in_flight=WIDE, endpoint_rate=rate))

    dispatched: list[float] = []
    end = time.monotonic() + 3.5
    while time.monotonic() < end:
        result = sched.pick("w", 10)
        dispatched += [lease.deadline - lease_seconds for lease in result.leases]
        sched.ack(result.leases)
        if result.wait_seconds > 0:
            sched.wait(result.wait_seconds)

    steady = dispatched[burst_of(rate) :]  # after the first burst
    measured = (len(steady) - 1) / (steady[-1] - steady[0])
    assert rate * 0.9 <= measured <= rate * 1.1, measured
    elapsed = dispatched[-1] - dispatched[0]
    assert len(dispatched) <= rate * elapsed + burst_of(rate) + 1


def test_several_workers_share_one_endpoint_rate(redis_conn):
    """Three threads pick concurrently in real time: the rate is one bucket in Redis, not
    one per worker."""
    rate, lease_seconds = 25.0, 30.0
    sched = Scheduler(redis_conn, lease_seconds=lease_seconds)
    sched.enqueue(batch(1, 1, 400, max_in_flight=WIDE, endpoint_rate=rate))
    dispatched: list[float] = []
    lock = threading.Lock()
    end = time.monotonic() + 3.0

    def worker(name: str) -> None:
        while time.monotonic() < end:
            result = sched.pick(name, 5)
            with lock:
                dispatched.extend(lease.deadline - lease_seconds for lease in result.leases)
            sched.ack(result.leases)
            if result.wait_seconds > 0:
                time.sleep(result.wait_seconds)

    threads = [threading.Thread(target=worker, args=(f"w{i}",)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    dispatched.sort()
    steady = dispatched[burst_of(rate) :]
    measured = (len(steady) - 1) / (steady[-1] - steady[0])
    assert rate * 0.9 <= measured <= rate * 1.1, measured
    assert most_in_any_window(dispatched, 1.0) <= rate + burst_of(rate)


def test_a_rate_limited_endpoint_slows_no_other_endpoint_or_tenant(redis_conn):
    clock = FakeClock()
    sched = Scheduler(redis_conn, clock=clock)
    sched.enqueue(batch(1, 1, 50, max_in_flight=WIDE, endpoint_rate=1))
    sched.enqueue(batch(1, 2, 50, max_in_flight=WIDE))
    sched.enqueue(batch(2, 3, 50, max_in_flight=WIDE))

    order = []
    while leases := sched.pick("w").leases:  # all at one instant: no token comes due
        order += leases
        sched.ack(leases)

    # Turns still alternate between the tenants; tenant 1's go to its other lane.
    assert [lease.tenant_id for lease in order[:100]] == [1, 2] * 50
    assert Counter(lease.endpoint_id for lease in order) == {1: 1, 2: 50, 3: 50}
    result = sched.pick("w", 10)
    assert result.leases == [] and result.wait_seconds == pytest.approx(1.0, abs=1e-5)
    assert sched.snapshot().deferrals_total == 0  # a rate wait is not a cap deferral
    check_invariants(sched)


def test_rate_tokens_of_a_shared_endpoint_go_by_tenant_weight(redis_conn):
    """The gateway case with a rate instead of a cap: parked lanes share its tokens by
    weight, as they share a capped endpoint's slots."""
    clock = FakeClock()
    sched = Scheduler(redis_conn, clock=clock)
    sched.enqueue(batch(1, 7, 400, weight=1, max_in_flight=WIDE, endpoint_rate=10))
    sched.enqueue(batch(2, 7, 400, weight=2, max_in_flight=WIDE, endpoint_rate=10))

    dispatched, _ = run(sched, clock, 30, max_items=1)

    shares = Counter(lease.tenant_id for _, lease in dispatched)
    total = shares[1] + shares[2]
    assert 300 <= total <= 311
    assert 0.9 * total / 3 <= shares[1] <= 1.1 * total / 3, shares


def test_retries_and_fresh_work_share_the_endpoint_rate(redis_conn):
    clock = FakeClock()
    sched = Scheduler(redis_conn, clock=clock, retry_min_share=0.5)
    rated = {"max_in_flight": WIDE, "retry_max_in_flight": WIDE, "endpoint_rate": 4}
    sched.enqueue(batch(1, 1, 100, **rated) + batch(1, 1, 100, lane="retry", **rated))

    dispatched, _ = run(sched, clock, 10)

    assert len(dispatched) == 4 + 4 * 10 - 1  # the burst, then one per 0.25 s before 10 s
    assert Counter(lease.lane for _, lease in dispatched)["retry"] >= 15


# --- a tenant's rate ----------------------------------------------------------------------


def test_a_rate_limited_tenant_slows_no_other_and_others_fill_its_idle_turns(redis_conn):
    clock = FakeClock()
    sched = Scheduler(redis_conn, clock=clock)
    sched.enqueue(batch(1, 1, 100, max_in_flight=WIDE, tenant_rate=2))
    sched.enqueue(batch(2, 2, 100, max_in_flight=WIDE) + batch(3, 3, 100, max_in_flight=WIDE))

    first = sched.pick("w", 50).leases
    sched.ack(first)

    # Work-conserving: the rated tenant takes its burst and leaves the turn order, so
    # the same pick fills up with the others instead of coming back short.
    assert len(first) == 50
    assert Counter(lease.tenant_id for lease in first)[1] == 2
    assert sched.snapshot().tenants[0].rate_limited  # "a rate limit is what paces you"
    dispatched, _ = run(sched, clock, 10, max_items=50)
    others = [lease for _, lease in dispatched if lease.tenant_id != 1]
    assert len(others) == 200 - 48  # all of theirs, in the first instant
    assert all(t == T0 for t, lease in dispatched if lease.tenant_id != 1)
    assert len(times_of(dispatched, tenant_id=1)) == 2 * 10 - 1  # one per 0.5 s after
    check_invariants(sched)


def test_a_tenant_rate_spans_all_its_endpoints(redis_conn):
    clock = FakeClock()
    sched = Scheduler(redis_conn, clock=clock)
    for endpoint in (1, 2, 3):
        sched.enqueue(batch(1, endpoint, 60, max_in_flight=WIDE, tenant_rate=3))

    dispatched, _ = run(sched, clock, 20)

    times = times_of(dispatched)
    steady = [t for t in times if T0 + 5 <= t < T0 + 15]
    assert 27 <= len(steady) <= 33
    assert most_in_any_window(times, 1) <= 3 + 3
    per_endpoint = Counter(lease.endpoint_id for _, lease in dispatched)
    assert max(per_endpoint.values()) - min(per_endpoint.values()) <= 1  # still rotated


def test_a_tenant_and_its_endpoint_rate_both_hold(redis_conn):
    clock = FakeClock()
    sched = Scheduler(redis_conn, clock=clock)
    sched.enqueue(batch(1, 1, 100, max_in_flight=WIDE, endpoint_rate=1, tenant_rate=5))
    sched.enqueue(batch(1, 2, 100, max_in_flight=WIDE, tenant_rate=5))

    dispatched, _ = run(sched, clock, 10)

    assert len(times_of(dispatched, endpoint_id=1)) <= 1 * 10 + 1
    assert 5 * 10 <= len(dispatched) <= 5 * 10 + 5  # the tenant's rate, all of it used


def test_a_tenant_asleep_for_its_rate_rejoins_where_it_stood(redis_conn):
    """Leaving the turn order for a token costs no place in it: back at max(its score, V),
    it alternates with its peer again at once."""
    clock = FakeClock()
    sched = Scheduler(redis_conn, clock=clock)
    sched.enqueue(batch(1, 1, 50, max_in_flight=WIDE, tenant_rate=1))
    sched.enqueue(batch(2, 2, 500, max_in_flight=WIDE))

    order = []
    for _ in range(40):
        order += [lease.tenant_id for lease in sched.pick("w", 3).leases]
        clock.advance(0.5)

    assert order.count(1) == 20  # its rate, exactly (one token per second)
    assert order.count(2) == 120 - 20  # every turn it could not use
    check_invariants(sched)


def test_a_tenant_asleep_for_its_rate_holds_no_free_slot_hostage(redis_conn):
    """Endpoint 7 (cap 1) is shared. When its slot frees, the first parked lane in line
    belongs to a tenant asleep for its rate: the slot must go to the next one, now."""
    clock = FakeClock()
    sched = Scheduler(redis_conn, clock=clock)
    sched.enqueue(batch(1, 7, 5, max_in_flight=1))
    sched.enqueue(batch(2, 7, 5, max_in_flight=1, tenant_rate=0.1))
    sched.enqueue(batch(2, 8, 5, max_in_flight=WIDE, tenant_rate=0.1))
    first = sched.pick("w", 5).leases  # 1 on e7 (full), 2 parks on e7, spends its token on e8
    assert [(x.tenant_id, x.endpoint_id) for x in first] == [(1, 7), (2, 8)]

    sched.ack(first)

    assert [(x.tenant_id, x.endpoint_id) for x in sched.pick("w", 5).leases] == [(1, 7)]
    check_invariants(sched)


def test_a_tenant_that_falls_asleep_gives_up_the_slot_it_was_offered(redis_conn):
    """Offered a freed slot while out of tokens (but not yet asleep: its rotation had
    emptied), the tenant falls asleep at its next turn and hands the slot on."""
    clock = FakeClock()
    sched = Scheduler(redis_conn, clock=clock)
    sched.enqueue(batch(1, 7, 5, max_in_flight=1))
    sched.enqueue(batch(2, 7, 5, max_in_flight=1, tenant_rate=0.1))
    sched.enqueue(batch(2, 8, 1, max_in_flight=WIDE, tenant_rate=0.1))
    first = sched.pick("w", 5).leases
    assert [(x.tenant_id, x.endpoint_id) for x in first] == [(1, 7), (2, 8)]

    sched.ack(first)  # offers e7's slot to tenant 2's lane, first in line

    assert [(x.tenant_id, x.endpoint_id) for x in sched.pick("w", 5).leases] == [(1, 7)]
    check_invariants(sched)


# --- configuration changes -------------------------------------------------------------------


def test_raising_or_removing_a_rate_unparks_at_once(redis_conn):
    clock = FakeClock()
    sched = Scheduler(redis_conn, clock=clock)
    sched.enqueue(batch(1, 1, 10, max_in_flight=WIDE, endpoint_rate=0.1))
    sched.enqueue(batch(2, 2, 10, max_in_flight=WIDE, tenant_rate=0.1))
    assert len(sched.pick("w", 20).leases) == 2

    sched.set_endpoint(1, max_in_flight=WIDE, retry_max_in_flight=1, rate_per_second=None)
    sched.set_tenant(2, weight=1, paused=False, rate_per_second=None)

    assert Counter(x.tenant_id for x in sched.pick("w", 20).leases) == {1: 9, 2: 9}
    check_invariants(sched)


def test_a_clock_earned_at_a_slow_rate_holds_a_faster_one_back_one_interval_at_most(
    redis_conn,
):
    clock = FakeClock()
    sched = Scheduler(redis_conn, clock=clock)
    sched.enqueue(batch(1, 1, 10, max_in_flight=WIDE, endpoint_rate=0.01))
    assert len(sched.pick("w", 5).leases) == 1  # the next token would be 100 s away

    sched.enqueue(batch(1, 1, 1, max_in_flight=WIDE, endpoint_rate=10))  # an item carries it

    result = sched.pick("w", 5)
    assert result.leases == [] and result.wait_seconds == pytest.approx(0.1, abs=1e-5)
    clock.advance(0.1)
    assert len(sched.pick("w", 5).leases) == 1


def test_lowering_a_rate_takes_effect_from_the_next_token(redis_conn):
    clock = FakeClock()
    sched = Scheduler(redis_conn, clock=clock)
    sched.enqueue(batch(1, 1, 100, max_in_flight=WIDE, endpoint_rate=10))
    assert len(sched.pick("w", 50).leases) == 10

    sched.set_endpoint(1, max_in_flight=WIDE, retry_max_in_flight=1, rate_per_second=1)
    dispatched, _ = run(sched, clock, 10)

    assert 9 <= len(dispatched) <= 11


def test_items_carry_rates_so_a_rebuild_restores_them(redis_conn):
    clock = FakeClock()
    sched = Scheduler(redis_conn, clock=clock)
    work = batch(1, 1, 5, max_in_flight=WIDE, endpoint_rate=1) + batch(
        2, 2, 5, max_in_flight=WIDE, tenant_rate=1
    )
    sched.enqueue(work)
    sched.pick("w", 10)

    sched.clear()  # Redis lost the schedule: rebuild from the rows
    sched.enqueue(work)

    assert len(sched.pick("w", 10).leases) == 2  # one token each, as configured
    snap = sched.snapshot()
    assert {row.tenant_id: row.rate_per_second for row in snap.tenants} == {1: None, 2: 1.0}
    assert {row.endpoint_id: row.rate_per_second for row in snap.endpoints} == {1: 1.0, 2: None}


def test_rates_are_validated(redis_conn):
    sched = Scheduler(redis_conn)
    with pytest.raises(ValueError):
        sched.enqueue(batch(1, 1, 1, endpoint_rate=-1))
    with pytest.raises(ValueError):
        sched.set_endpoint(1, max_in_flight=1, retry_max_in_flight=1, rate_per_second=1e9)
    with pytest.raises(ValueError):
        sched.set_tenant(1, weight=1, paused=False, rate_per_second=float("nan"))
    with pytest.raises(ValueError):
        sched.pause_endpoint(1, float("inf"))
    sched.enqueue(batch(1, 1, 3, endpoint_rate=0, tenant_rate=0))  # 0 = unlimited
    assert len(sched.pick("w", 3).leases) == 2  # only the cap of 2 holds


# --- Retry-After pauses -----------------------------------------------------------------------


def test_pause_endpoint_pauses_and_resumes_on_time(redis_conn):
    clock = FakeClock()
    sched = Scheduler(redis_conn, clock=clock)
    sched.enqueue(batch(1, 1, 5, max_in_flight=WIDE) + batch(2, 2, 5, max_in_flight=WIDE))
    (lease,) = sched.pick("w").leases
    assert lease.endpoint_id == 1

    assert sched.pause_endpoint(1, T0 + 30)  # the 429 said Retry-After: 30
    sched.ack([lease])

    during = sched.pick("w", 20)
    assert Counter(x.endpoint_id for x in during.leases) == {2: 5}  # others unaffected
    sched.ack(during.leases)
    assert during.wait_seconds == 5  # the most a worker sleeps without a look
    row = next(r for r in sched.snapshot().endpoints if r.endpoint_id == 1)
    assert row.paused_until == T0 + 30 and row.rate_limited and row.in_flight == 0
    clock.advance(29.99)
    almost = sched.pick("w", 20)
    assert almost.leases == [] and almost.wait_seconds == pytest.approx(0.01, abs=1e-5)
    clock.advance(0.01)
    assert len(sched.pick("w", 20).leases) == 4  # no rate: all of it at once
    assert next(r for r in sched.snapshot().endpoints if r.endpoint_id == 1).paused_until is None
    check_invariants(sched)


def test_a_paused_rate_limited_endpoint_resumes_at_its_rate_without_a_burst(redis_conn):
    clock = FakeClock()
    sched = Scheduler(redis_conn, clock=clock)
    sched.enqueue(batch(1, 1, 100, max_in_flight=WIDE, endpoint_rate=10))
    sched.ack(sched.pick("w", 1).leases)
    sched.pause_endpoint(1, T0 + 5)

    dispatched, _ = run(sched, clock, 7)

    times = times_of(dispatched)
    assert min(times) == T0 + 5
    assert most_in_any_window(times, 0.5) <= 5  # one per 0.1 s, no burst of 10
    assert 19 <= len(times) <= 21


def test_the_next_token_wakes_a_parked_lane_while_the_last_one_is_in_flight(redis_conn):
    """Two tenants wait on a paused endpoint with a rate of one per 2 s. The pause ends,
    the one token goes to a tenant whose lane it empties, and that lease stays in flight:
    the other tenant's lane must still be offered the next token when it is due, not
    only when the lease ends (found by the property test, hypothesis)."""
    clock = FakeClock()
    sched = Scheduler(redis_conn, clock=clock)
    sched.pause_endpoint(3, T0 + 0.5)
    sched.enqueue(batch(1, 3, 1, max_in_flight=WIDE, endpoint_rate=0.5))
    sched.enqueue(batch(2, 3, 1, max_in_flight=WIDE, endpoint_rate=0.5))
    clock.advance(0.6)
    (first,) = sched.pick("w", 10).leases  # held, not acked: in flight
    assert first.tenant_id == 1
    clock.advance(2.0)
    (second,) = sched.pick("w", 10).leases
    assert second.tenant_id == 2
    check_invariants(sched)


def test_a_pause_only_extends_and_outlives_an_idle_endpoint(redis_conn):
    clock = FakeClock()
    sched = Scheduler(redis_conn, clock=clock)
    assert sched.pause_endpoint(3, T0 + 10)  # nothing queued for it yet
    assert sched.pause_endpoint(3, T0 + 5)  # an earlier end does not shorten it
    assert not sched.pause_endpoint(3, T0 - 1)  # already over: nothing to do
    sched.enqueue(batch(1, 3, 2, max_in_flight=WIDE))

    assert sched.pick("w", 5).leases == []
    clock.advance(9.9)
    assert sched.pick("w", 5).leases == []
    clock.advance(0.1)
    assert len(sched.pick("w", 5).leases) == 2


def test_a_pause_holds_retries_due_during_it(redis_conn):
    clock = FakeClock()
    sched = Scheduler(redis_conn, clock=clock)
    sched.enqueue(batch(1, 1, 1, max_in_flight=WIDE))
    (lease,) = sched.pick("w").leases
    sched.retry_later(lease, T0 + 2)  # what sending.py does after a 429 ...
    sched.pause_endpoint(1, T0 + 20)  # ... then the pause, from Retry-After

    clock.advance(3)
    assert sched.pick("w").leases == []  # due, but the endpoint is paused
    clock.advance(17)
    assert [x.lane for x in sched.pick("w").leases] == ["retry"]


def test_real_time_pause_resumes_on_time(redis_conn):
    lease_seconds = 30.0
    sched = Scheduler(redis_conn, lease_seconds=lease_seconds)
    sched.enqueue(batch(1, 1, 3, max_in_flight=WIDE))
    paused_at = float(redis_conn.time()[0]) + redis_conn.time()[1] / 1e6
    sched.pause_endpoint(1, paused_at + 0.5)

    resumed = None
    deadline = time.monotonic() + 5
    while resumed is None and time.monotonic() < deadline:
        result = sched.pick("w", 5)
        if result.leases:
            resumed = result.leases[0].deadline - lease_seconds
        else:
            assert result.wait_seconds > 0
            sched.wait(result.wait_seconds)

    assert resumed is not None
    assert paused_at + 0.5 <= resumed <= paused_at + 0.5 + 1.0  # generous: a shared machine


# --- no spinning, snapshot, modes, keys -------------------------------------------------------


def test_wait_seconds_points_at_the_next_due_token(redis_conn):
    clock = FakeClock()
    sched = Scheduler(redis_conn, clock=clock)
    sched.enqueue(batch(1, 1, 100, max_in_flight=WIDE, endpoint_rate=4))
    sched.enqueue(batch(2, 2, 20, max_in_flight=WIDE, tenant_rate=0.4))

    burst = sched.pick("w", 10)
    assert len(burst.leases) == 4 + 1
    # Both came back short with nothing else ready: sleep until the first token is due.
    assert burst.wait_seconds == pytest.approx(0.25, abs=1e-5)
    clock.advance(0.249)
    early = sched.pick("w", 10)
    assert early.leases == [] and early.wait_seconds == pytest.approx(0.001, abs=1e-5)
    clock.advance(0.001)
    assert [x.endpoint_id for x in sched.pick("w", 10).leases] == [1]

    redis_conn.delete(sched.keys.wake)  # count only the picks the loop itself causes
    dispatched, picks = run(sched, clock, 10, max_items=1)
    assert len(dispatched) == 4 * 10 - 1 + 4  # both rates, to the token
    assert picks <= len(dispatched) + 1
    assert sched.snapshot().rate_waits_total > 0


def test_snapshot_reports_rates_pauses_and_what_paces_whom(redis_conn):
    clock = FakeClock()
    sched = Scheduler(redis_conn, clock=clock)
    sched.enqueue(batch(1, 1, 5, max_in_flight=WIDE, tenant_rate=2))
    sched.enqueue(batch(2, 2, 5, max_in_flight=WIDE, endpoint_rate=1))
    sched.enqueue(batch(3, 3, 5, max_in_flight=WIDE))
    sched.pause_endpoint(3, T0 + 60)
    sched.pick("w", 20)

    snap = sched.snapshot()

    tenants = {row.tenant_id: row for row in snap.tenants}
    assert (tenants[1].rate_per_second, tenants[1].rate_limited) == (2.0, True)
    assert (tenants[2].rate_per_second, tenants[2].rate_limited) == (None, False)
    endpoints = {row.endpoint_id: row for row in snap.endpoints}
    assert endpoints[2].rate_per_second == 1.0 and endpoints[2].rate_limited
    assert endpoints[2].parked_lanes == 1 and endpoints[2].in_flight == 1
    assert endpoints[3].paused_until == T0 + 60 and endpoints[3].in_flight == 0
    assert endpoints[3].rate_limited and endpoints[3].rate_per_second is None
    assert endpoints[1].rate_per_second is None and not endpoints[1].rate_limited
    assert snap.rate_waits_total >= 3 and snap.deferrals_total == 0


def test_fifo_mode_honours_rates_and_pauses_naively(redis_conn):
    clock = FakeClock()
    sched = Scheduler(redis_conn, mode="fifo", clock=clock)
    sched.enqueue(batch(1, 1, 30, max_in_flight=WIDE, endpoint_rate=2))
    sched.enqueue(batch(2, 2, 30, max_in_flight=WIDE, tenant_rate=1))
    sched.enqueue(batch(3, 3, 3, max_in_flight=WIDE))
    sched.pause_endpoint(3, T0 + 5)
    redis_conn.delete(sched.keys.wake)  # FIFO wakes a sleeper per enqueued delivery

    dispatched, picks = run(sched, clock, 10)

    per_endpoint = Counter(lease.endpoint_id for _, lease in dispatched)
    assert per_endpoint == {1: 2 + 2 * 10 - 1, 2: 1 + 10 - 1, 3: 3}
    assert min(times_of(dispatched, endpoint_id=3)) == T0 + 5
    assert picks <= 2 * len(dispatched)


def test_a_drain_with_rates_and_pauses_leaves_no_keys(redis_conn):
    clock = FakeClock()
    sched = Scheduler(redis_conn, clock=clock)
    sched.enqueue(batch(1, 1, 20, max_in_flight=2, endpoint_rate=5, tenant_rate=3))
    sched.enqueue(batch(2, 1, 20, max_in_flight=2, endpoint_rate=5))
    sched.enqueue(batch(None, 2, 10, lane="retry", retry_max_in_flight=1, endpoint_rate=0.5))
    sched.pause_endpoint(2, T0 + 3)

    dispatched, _ = run(sched, clock, 60)
    assert len(dispatched) == 50
    clock.advance(5)  # every token clock has caught up with now: nothing left to keep
    assert sched.pick("w").leases == []

    assert_no_tenant_keys(sched)


def test_without_rates_nothing_new_is_stored_and_a_pick_is_still_one_round_trip(
    redis_conn, monkeypatch
):
    sched = Scheduler(redis_conn)
    sched.enqueue(batch(1, 1, 20) + batch(2, 2, 20))
    sched.ack(sched.pick("w", 4).leases)
    expected = script_command(sched)
    calls = []
    real = redis_conn.execute_command
    monkeypatch.setattr(
        redis_conn, "execute_command", lambda *a, **k: calls.append(a[0]) or real(*a, **k)
    )

    sched.ack(sched.pick("w", 4).leases)

    assert calls == [expected] * 2
    keys = sched.keys
    assert not redis_conn.exists(keys.tat, keys.due, keys.hold)
    assert endpoint_row(sched, 1).get("rr", 0) == 0  # no rate


# --- the database side: models, item_for, signals --------------------------------------------


@pytest.mark.django_db
def test_database_rates_reach_the_schedule(settings, django_capture_on_commit_callbacks):
    from delivery.models import Delivery
    from delivery.pipeline.enqueueing import item_for
    from delivery.scheduler import get_scheduler, reset_scheduler
    from tenants.models import Endpoint, Tenant

    reset_scheduler()
    settings.TENANT_DEFAULT_RATE_PER_SECOND = 7.0
    with django_capture_on_commit_callbacks(execute=True):
        defaulted = Tenant.objects.create(key="a.example")
        unlimited = Tenant.objects.create(key="b.example", rate_limit_per_second=0)
        endpoint = Endpoint.objects.create(
            tenant=defaulted, url="https://a.example/hook", rate_limit_per_second="2.5"
        )
    assert defaulted.effective_rate_per_second() == 7.0
    assert unlimited.effective_rate_per_second() is None
    assert endpoint.effective_rate_per_second() == 2.5

    item = item_for(Delivery(id=new_ulid(), tenant=defaulted, endpoint=endpoint))
    assert (item.endpoint_rate, item.tenant_rate) == (2.5, 7.0)
    fallback = item_for(Delivery(id=new_ulid(), tenant=None, endpoint=endpoint))
    assert fallback.tenant_rate is None  # the fallback lane is many senders: no tenant rate

    scheduler = get_scheduler()
    scheduler.enqueue([item])
    with django_capture_on_commit_callbacks(execute=True):
        endpoint.rate_limit_per_second = None
        endpoint.save()
        defaulted.rate_limit_per_second = 1
        defaulted.save()
    snap = scheduler.snapshot()
    assert snap.endpoints == [] or snap.endpoints[0].rate_per_second is None
    assert snap.tenants[0].rate_per_second == 1.0
    reset_scheduler()


@pytest.mark.django_db
def test_items_for_a_group_are_each_delivery_s_own(settings):
    """items_for works out a tenant's and an endpoint's part once per pair: deliveries
    of two tenants on one endpoint, one endpoint of another cap, the fallback lane and a
    retry due later must each still carry their own."""
    from django.utils import timezone

    from delivery.models import Delivery
    from delivery.pipeline.enqueueing import item_for, items_for
    from tenants.models import Endpoint, Tenant

    settings.TENANT_DEFAULT_RATE_PER_SECOND = 0
    heavy = Tenant.objects.create(key="heavy.example", weight=3, rate_limit_per_second=4)
    light = Tenant.objects.create(key="light.example")
    shared = Endpoint.objects.create(tenant=heavy, url="https://a.example/hook", max_in_flight=5)
    other = Endpoint.objects.create(
        tenant=light, url="https://b.example/hook", max_in_flight=1, rate_limit_per_second=2
    )
    due = timezone.now() + timezone.timedelta(seconds=30)
    group = [
        Delivery(id=new_ulid(), tenant=heavy, endpoint=shared),
        Delivery(id=new_ulid(), tenant=light, endpoint=shared),
        Delivery(id=new_ulid(), tenant=light, endpoint=other),
        Delivery(id=new_ulid(), tenant=None, endpoint=shared),
        Delivery(
            id=new_ulid(),
            tenant=heavy,
            endpoint=shared,
            status=Delivery.Status.RETRY_SCHEDULED,
            next_attempt_at=due,
        ),
        Delivery(id=new_ulid(), tenant=heavy, endpoint=shared),
    ]
    items = items_for(group)
    assert items == [item_for(delivery) for delivery in group]
    assert [(i.tenant_id, i.endpoint_id, i.weight, i.max_in_flight) for i in items] == [
        (heavy.pk, shared.pk, 3, 5),
        (light.pk, shared.pk, 1, 5),
        (light.pk, other.pk, 1, 1),
        (None, shared.pk, 1, 5),
        (heavy.pk, shared.pk, 3, 5),
        (heavy.pk, shared.pk, 3, 5),
    ]
    assert [(i.endpoint_rate, i.tenant_rate) for i in items] == [
        (None, 4.0),
        (None, None),
        (2.0, None),
        (None, None),
        (None, 4.0),
        (None, 4.0),
    ]
    assert [i.lane for i in items] == [FRESH, FRESH, FRESH, FRESH, RETRY, FRESH]
    assert items[4].due_at == due.timestamp() and items[5].due_at is None
    assert [i.delivery_id for i in items] == [d.id for d in group]


def test_an_item_without_rates_is_unlimited():
    item = Item(new_ulid(), 1, 1)
    assert (item.endpoint_rate, item.tenant_rate) == (None, None)

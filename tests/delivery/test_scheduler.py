"""The fair scheduler's behaviour, against a real Redis (db 15, flushed per test)."""

import threading
import time
from collections import Counter

import pytest
from redis.crc import key_slot

from core import redis_connection
from core.ids import new_ulid
from delivery.scheduler import Item, Scheduler
from tests.scheduler_helpers import (
    GLOBAL_KEYS,
    T0,
    FakeClock,
    assert_no_tenant_keys,
    batch,
    check_invariants,
    dispatch_order,
    drain,
    schedule_keys,
    script_command,
)


def test_every_delivery_is_handed_out_once_and_a_drain_leaves_no_keys(scheduler_conn):
    sched = Scheduler(scheduler_conn)
    work = batch(1, 10, 30) + batch(2, 11, 5) + batch(None, 10, 4) + batch(3, 12, 7, lane="retry")
    sched.enqueue(work)
    assert sum(check_invariants(sched).values()) == len(work)

    handed = [lease.delivery_id for lease in drain(sched, max_items=7)]

    assert sorted(handed) == sorted(item.delivery_id for item in work)
    assert_no_tenant_keys(sched)
    others = [k for k in scheduler_conn.scan_iter() if not k.startswith(b"wh:test-")]
    assert len(others) <= len(GLOBAL_KEYS)  # DBSIZE, minus the test harness's markers


def test_every_key_carries_the_shard_hash_tag(scheduler_conn):
    sched = Scheduler(scheduler_conn, shard=7)
    sched.enqueue(batch(1, 1, 3, max_in_flight=1) + batch(None, 2, 1))
    lease = sched.pick("w").leases[0]
    sched.retry_later(lease, time.time() + 60)
    sched.pick("w", 5)
    sched.start_epoch()

    mine = {k.decode() for k in scheduler_conn.scan_iter() if not k.startswith(b"wh:test-")}
    assert mine and all(k.startswith("wh:{7}:") for k in mine)
    # One cluster slot for all of them, the rebuild's lock included: on a Redis Cluster a
    # script may only touch the slot of the key it declares (the stats hash).
    slots = {key_slot(k.encode()) for k in (*mine, sched.keys.rebuild_lock)}
    assert slots == {key_slot(sched.keys.stats.encode())}


def test_first_attempts_keep_arrival_order_within_a_tenant_endpoint_pair(scheduler_conn):
    sched = Scheduler(scheduler_conn, turn_size=2)
    lanes = {(t, e): batch(t, e, 20) for t in (1, 2) for e in (5, 6)}
    for i in range(20):  # interleave the arrivals of the four pairs
        sched.enqueue([lane[i] for lane in lanes.values()])

    order = [(lease.tenant_id, lease.endpoint_id, lease.delivery_id) for lease in drain(sched)]

    for (t, e), lane in lanes.items():
        assert [i for lt, le, i in order if (lt, le) == (t, e)] == [x.delivery_id for x in lane]


# --- fairness -------------------------------------------------------------------------


def test_equal_tenants_share_dispatches_evenly_however_many_events_or_endpoints(scheduler_conn):
    sched = Scheduler(scheduler_conn)
    sched.enqueue(batch(1, 1, 900, max_in_flight=100))  # one endpoint, a flood
    for e in range(10, 16):  # six endpoints
        sched.enqueue(batch(2, e, 60, max_in_flight=100))
    for e in range(20, 23):  # three endpoints, a trickle each
        sched.enqueue(batch(3, e, 40, max_in_flight=100))

    shares = Counter(lease.tenant_id for lease in dispatch_order(sched, 300))

    assert all(90 <= shares[t] <= 110 for t in (1, 2, 3)), shares


def test_weight_w_gets_w_turns_per_lap(scheduler_conn):
    sched = Scheduler(scheduler_conn)
    for tenant, weight in ((1, 1), (2, 2), (3, 4)):
        sched.enqueue(batch(tenant, tenant, 600, weight=weight, max_in_flight=100))

    shares = Counter(lease.tenant_id for lease in dispatch_order(sched, 700))

    assert 90 <= shares[1] <= 110 and 180 <= shares[2] <= 220 and 360 <= shares[3] <= 440


def test_quiet_tenant_waits_at_most_one_lap(scheduler_conn):
    sched = Scheduler(scheduler_conn)
    sched.enqueue(batch(1, 1, 2000, max_in_flight=100))
    for tenant in range(2, 10):
        sched.enqueue(batch(tenant, tenant, 50, max_in_flight=100))
    dispatch_order(sched, 37)  # somewhere in the middle of a lap

    sched.enqueue(batch(99, 99, 1))
    order = dispatch_order(sched, 10)

    lap = 10  # tenants backlogged, the newcomer included
    assert 99 in [lease.tenant_id for lease in order[:lap]]


def test_turn_size_hands_a_tenant_that_many_deliveries_per_turn(scheduler_conn):
    sched = Scheduler(scheduler_conn, turn_size=3)
    sched.enqueue(batch(1, 1, 30, max_in_flight=10) + batch(2, 2, 30, max_in_flight=10))

    tenants = [lease.tenant_id for lease in dispatch_order(sched, 12)]

    assert tenants == [1, 1, 1, 2, 2, 2, 1, 1, 1, 2, 2, 2]


def test_one_pick_hands_out_several_leases_one_per_turn(scheduler_conn):
    sched = Scheduler(scheduler_conn)
    for tenant in (1, 2, 3):
        sched.enqueue(batch(tenant, tenant, 10, max_in_flight=10))

    leases = sched.pick("w", max_items=6).leases

    assert [lease.tenant_id for lease in leases] == [1, 2, 3, 1, 2, 3]


def test_a_contended_endpoint_shares_its_slots_by_tenant_weight(scheduler_conn):
    """The gateway case: every tenant posts to the same destination, capped at one."""
    sched = Scheduler(scheduler_conn)
    sched.enqueue(batch(1, 7, 400, weight=1, max_in_flight=1))
    sched.enqueue(batch(2, 7, 400, weight=2, max_in_flight=1))
    sched.enqueue(batch(3, 7, 400, weight=1, max_in_flight=1))

    shares = Counter(lease.tenant_id for lease in dispatch_order(sched, 400))

    assert 90 <= shares[1] <= 110 and 180 <= shares[2] <= 220 and 90 <= shares[3] <= 110


# --- endpoint caps --------------------------------------------------------------------


def test_capped_endpoint_blocks_neither_the_tenants_other_endpoints_nor_other_tenants(
    scheduler_conn,
):
    sched = Scheduler(scheduler_conn)
    sched.enqueue(batch(1, 1, 10, max_in_flight=1) + batch(1, 2, 3, max_in_flight=5))
    sched.enqueue(batch(2, 1, 3, max_in_flight=1) + batch(2, 3, 3, max_in_flight=5))

    leases = sched.pick("w", max_items=20).leases

    per_endpoint = Counter(lease.endpoint_id for lease in leases)
    assert per_endpoint == {1: 1, 2: 3, 3: 3}
    snap = sched.snapshot()
    assert snap.in_flight == 7 and snap.fresh_depth == 12
    assert snap.deferrals_total >= 1  # tenant 2's lane found endpoint 1 full: no lease
    assert {row.endpoint_id: row.parked_lanes for row in snap.endpoints}[1] == 2
    check_invariants(sched)


def test_when_all_work_is_capped_pick_returns_nothing_and_says_how_long_to_sleep(scheduler_conn):
    sched = Scheduler(scheduler_conn)
    sched.enqueue(batch(1, 1, 5, max_in_flight=2))
    held = sched.pick("w", max_items=5).leases
    assert len(held) == 2

    result = sched.pick("w", max_items=5)
    deferrals = sched.snapshot().deferrals_total

    assert result.leases == [] and result.wait_seconds > 0
    assert sched.pick("w").leases == []  # no spinning: the lane is parked, not retried
    assert sched.snapshot().deferrals_total == deferrals
    sched.ack(held[:1])
    assert len(sched.pick("w", max_items=5).leases) == 1


def test_raising_a_cap_unparks_waiting_lanes_at_once(scheduler_conn):
    sched = Scheduler(scheduler_conn)
    sched.enqueue(batch(1, 1, 5, max_in_flight=1) + batch(2, 1, 5, max_in_flight=1))
    assert len(sched.pick("w", 10).leases) == 1

    sched.set_endpoint(1, max_in_flight=3, retry_max_in_flight=1)

    assert len(sched.pick("w", 10).leases) == 2
    check_invariants(sched)


def test_a_cap_carried_by_a_later_enqueue_also_unparks(scheduler_conn):
    sched = Scheduler(scheduler_conn)
    sched.enqueue(batch(1, 1, 5, max_in_flight=1))
    sched.pick("w", 10)

    sched.enqueue(batch(2, 1, 1, max_in_flight=4))

    assert len(sched.pick("w", 10).leases) == 3


# --- leases ---------------------------------------------------------------------------


def test_an_expired_lease_returns_its_delivery_to_the_head_of_its_lane(scheduler_conn):
    clock = FakeClock()
    sched = Scheduler(scheduler_conn, clock=clock, lease_seconds=10)
    work = batch(1, 1, 3, max_in_flight=1)
    sched.enqueue(work)
    (crashed,) = sched.pick("w1").leases
    assert sched.pick("w2").leases == []  # slot taken

    clock.advance(11)
    (again,) = sched.pick("w2").leases

    assert again.delivery_id == work[0].delivery_id and again.token != crashed.token
    assert sched.snapshot().in_flight == 1  # the dead worker's slot was freed, not leaked
    assert sched.ack([crashed]) == [crashed.delivery_id]  # too late: no effect
    assert sched.snapshot().in_flight == 1
    assert sched.ack([again]) == []
    check_invariants(sched)


def test_renew_keeps_a_lease_alive_and_reports_lost_ones(scheduler_conn):
    clock = FakeClock()
    sched = Scheduler(scheduler_conn, clock=clock, lease_seconds=10)
    sched.enqueue(batch(1, 1, 1) + batch(2, 2, 1))
    kept, dropped = sched.pick("w", 2).leases

    for _ in range(3):
        clock.advance(8)
        assert sched.renew([kept]) == []
    clock.advance(8)
    sched.pick("other")  # reclaims `dropped` (its deadline passed long ago)

    assert sched.renew([kept, dropped]) == [dropped.delivery_id]
    assert sched.ack([kept]) == []


def test_a_crashed_workers_leases_are_reclaimed_a_bounded_number_per_pick(scheduler_conn):
    clock = FakeClock()
    sched = Scheduler(scheduler_conn, clock=clock, lease_seconds=5, reclaim_limit=4)
    sched.enqueue(batch(1, 1, 10, max_in_flight=10))
    assert len(sched.pick("dies", 10).leases) == 10
    clock.advance(6)

    first = sched.pick("w", 1)

    assert sched.snapshot().in_flight == 10 - 4 + 1
    assert first.wait_seconds == 0
    assert len(drain(sched)) == 10 - 1


def test_an_answered_lease_frees_its_endpoint_slot_but_stays_until_acknowledged(scheduler_conn):
    sched = Scheduler(scheduler_conn)
    sched.enqueue(batch(1, 1, 3, max_in_flight=1) + batch(2, 1, 3, max_in_flight=1))
    (first,) = sched.pick("w", 5).leases
    assert sched.pick("w", 5).leases == []  # the cap holds the second back

    assert sched.answered([first]) == 1
    (second,) = sched.pick("w", 5).leases

    assert second.tenant_id != first.tenant_id  # the parked lane got the slot, by turns
    assert sched.snapshot().in_flight == 2  # both leases live: neither is recorded yet
    assert sched.answered([first]) == 0  # answering twice frees nothing more
    check_invariants(sched)
    assert sched.ack([first]) == []  # the ack drops the lease without freeing a slot again
    assert sched.pick("w", 5).leases == []  # `second` still holds the only slot
    check_invariants(sched)
    assert sched.answered([second]) == 1 and sched.retry_later(second, due_at=T0)
    assert len(sched.pick("w", 5).leases) == 1
    check_invariants(sched)


def test_an_answered_lease_of_a_dead_worker_comes_back_without_freeing_its_slot_twice(
    scheduler_conn,
):
    clock = FakeClock()
    sched = Scheduler(scheduler_conn, clock=clock, lease_seconds=5)
    work = batch(1, 1, 3, lane="retry", max_in_flight=2, retry_max_in_flight=2)
    sched.enqueue(work)
    dead, alive = sched.pick("dies", 5).leases
    sched.answered([dead])  # the worker died after the answer, before recording it
    (third,) = sched.pick("w", 5).leases
    clock.advance(6)
    assert sched.renew([alive, third]) == []

    # The pick reclaims `dead`: its delivery is queued again, but the slot it freed when
    # answered is not freed a second time, so the cap still counts `alive` and `third`.
    assert sched.pick("w", 5).leases == []
    check_invariants(sched)
    assert sched.answered([dead]) == 0  # too late: the lease is gone
    sched.ack([third])
    (again,) = sched.pick("w", 5).leases

    assert again.delivery_id == dead.delivery_id == work[0].delivery_id
    check_invariants(sched)


def test_one_call_of_many_leases_answers_and_releases_each_as_a_call_of_one_would(
    scheduler_conn,
):
    """answered, ack and retry_later take a worker's whole group: lost leases, leases
    named twice, and leases answered or not must each come out as alone."""
    clock = FakeClock()
    sched = Scheduler(scheduler_conn, clock=clock)
    sched.enqueue(batch(1, 1, 7, max_in_flight=7, retry_max_in_flight=7))
    a, b, c, d, e, f, _still_held = sched.pick("w", 7).leases
    assert sched.ack([c]) == []  # c's lease is spent before the batches below

    assert sched.answered([a]) == 1
    assert sched.answered([a, b, c, a, b]) == 1  # a was answered, c is gone, b counts once
    check_invariants(sched)
    assert sched.ack([a, b, c, d, a], outcome="delivered") == [c.delivery_id, a.delivery_id]
    check_invariants(sched)  # a and b freed their slots when answered, d when acked
    assert sched.retry_later_many([(e, clock.now + 5), (f, clock.now + 5), (e, clock.now)]) == [
        True,
        True,
        False,
    ]
    check_invariants(sched)

    snapshot = sched.snapshot()
    assert (snapshot.in_flight, snapshot.delayed_depth) == (1, 2)  # g, and e and f
    assert sched.counters() == {"done": 1, "delivered": 3, "retry": 2}  # c; a, b, d; e, f
    clock.advance(6)
    assert {lease.delivery_id for lease in sched.pick("w", 7).leases} == {
        e.delivery_id,
        f.delivery_id,
    }
    check_invariants(sched)


def test_one_call_gives_back_each_endpoint_s_slots_and_leaves_the_others_busy(scheduler_conn):
    """Slots freed by one call are written per endpoint at once (a flood's one endpoint,
    or many): each endpoint's in-flight count drops by its own leases, one that is left
    with none leaves the busy set, and its parked lane gets the slot."""
    sched = Scheduler(scheduler_conn)
    sched.enqueue(batch(1, 1, 2, max_in_flight=2) + batch(2, 2, 3, max_in_flight=3))
    sched.enqueue(batch(3, 3, 2, max_in_flight=1, retry_max_in_flight=1, lane="retry"))
    leases = sched.pick("w", 10).leases
    by_endpoint = Counter(lease.endpoint_id for lease in leases)
    assert by_endpoint == {1: 2, 2: 3, 3: 1}  # endpoint 3's second waits for its one slot

    one_of_2 = next(lease for lease in leases if lease.endpoint_id == 2)
    answered = [lease for lease in leases if lease.endpoint_id in (1, 3)] + [one_of_2]
    assert sched.answered(answered) == 4
    check_invariants(sched)  # the busy set counts only the leases not answered
    busy = scheduler_conn.zrange(sched.keys.busy, 0, -1, withscores=True)
    assert busy == [(b"2", 2.0)]
    (waiting,) = sched.pick("w", 10).leases
    assert (waiting.endpoint_id, waiting.lane) == (3, "retry")

    assert sched.ack([lease for lease in leases if lease.endpoint_id == 2] + [waiting]) == []
    check_invariants(sched)
    assert scheduler_conn.zrange(sched.keys.busy, 0, -1) == []


# --- retries --------------------------------------------------------------------------


def test_retry_later_waits_in_the_delayed_set_then_enters_the_retry_lane(scheduler_conn):
    clock = FakeClock()
    sched = Scheduler(scheduler_conn, clock=clock)
    sched.enqueue(batch(1, 1, 1))
    (lease,) = sched.pick("w").leases

    assert sched.retry_later(lease, due_at=clock.now + 30)
    early = sched.pick("w")
    assert early.leases == [] and 0 < early.wait_seconds <= 5
    assert sched.snapshot().delayed_depth == 1
    clock.advance(31)
    (retry,) = sched.pick("w").leases

    assert (retry.delivery_id, retry.lane) == (lease.delivery_id, "retry")
    assert sched.retry_later(lease, due_at=clock.now) is False  # the old lease is spent


def test_retry_later_many_holds_each_until_due_in_one_call_and_reports_lost_leases(
    scheduler_conn,
):
    clock = FakeClock()
    sched = Scheduler(scheduler_conn, clock=clock)
    sched.enqueue(batch(1, 1, 2) + batch(2, 2, 1))
    first, second, third = sched.pick("w", 3).leases
    sched.ack([second])  # its lease is spent: nothing of it may change

    done = sched.retry_later_many(
        [(first, clock.now + 10), (second, clock.now + 10), (third, clock.now + 20)]
    )

    assert done == [True, False, True]
    snapshot = sched.snapshot()
    assert (snapshot.in_flight, snapshot.delayed_depth) == (0, 2)
    clock.advance(11)
    (retried,) = sched.pick("w", 3).leases
    assert retried.delivery_id == first.delivery_id
    sched.ack([retried])
    clock.advance(10)
    (last,) = sched.pick("w", 3).leases
    assert (last.delivery_id, last.lane) == (third.delivery_id, "retry")
    assert sched.retry_later_many([]) == []
    check_invariants(sched)


def test_retries_get_at_least_their_minimum_share_while_fresh_is_backlogged(scheduler_conn):
    sched = Scheduler(scheduler_conn, retry_min_share=0.2)
    sched.enqueue(batch(1, 1, 400, max_in_flight=100, retry_max_in_flight=100))
    sched.enqueue(batch(1, 2, 400, lane="retry", max_in_flight=100, retry_max_in_flight=100))

    lanes = Counter(lease.lane for lease in dispatch_order(sched, 300))

    assert 54 <= lanes["retry"] <= 66  # 20% ± 10%


def test_retries_get_everything_once_fresh_is_empty(scheduler_conn):
    sched = Scheduler(scheduler_conn, retry_min_share=0.1)
    sched.enqueue(batch(1, 1, 10, max_in_flight=100))
    sched.enqueue(batch(1, 2, 100, lane="retry", max_in_flight=100, retry_max_in_flight=100))

    lanes = [lease.lane for lease in dispatch_order(sched, 50)]

    assert lanes.count("fresh") == 10 and lanes[-30:] == ["retry"] * 30


def test_retries_to_an_endpoint_are_held_to_retry_max_in_flight(scheduler_conn):
    sched = Scheduler(scheduler_conn, retry_min_share=1.0)
    sched.enqueue(batch(1, 1, 5, max_in_flight=4, retry_max_in_flight=1))
    sched.enqueue(batch(1, 1, 5, lane="retry", max_in_flight=4, retry_max_in_flight=1))

    leases = sched.pick("w", 10).leases

    assert Counter(lease.lane for lease in leases) == {"retry": 1, "fresh": 3}
    retry = next(lease for lease in leases if lease.lane == "retry")
    sched.ack([retry])
    assert [lease.lane for lease in sched.pick("w", 10).leases] == ["retry"]
    assert sched.pick("w", 10).leases == []  # endpoint full: 3 fresh + 1 retry
    sched.ack([next(lease for lease in leases if lease.lane == "fresh")])
    assert [lease.lane for lease in sched.pick("w", 10).leases] == ["fresh"]  # retry cap full


# --- fallback, FIFO, pause --------------------------------------------------------------


def test_fallback_lane_has_its_own_weighted_turns_and_a_counter(scheduler_conn):
    sched = Scheduler(scheduler_conn, fallback_weight=2)
    sched.enqueue(batch(None, 1, 300, max_in_flight=100) + batch(1, 1, 300, max_in_flight=100))

    order = dispatch_order(sched, 150)

    shares = Counter(lease.tenant_id for lease in order)
    assert 90 <= shares[None] <= 110 and 45 <= shares[1] <= 55
    assert scheduler_conn.exists(sched.keys.lane(None, 1, "fresh"))  # a lane of its own
    snap = sched.snapshot()
    assert snap.fallback_enqueued_total == 300 and snap.fallback_depth == 300 - shares[None]
    assert next(row for row in snap.tenants if row.tenant_id is None).weight == 2


def test_fifo_mode_serves_everything_in_arrival_order(scheduler_conn):
    sched = Scheduler(scheduler_conn, mode="fifo")
    flood = batch(1, 1, 50, max_in_flight=10)
    sched.enqueue(flood)
    sched.enqueue(batch(2, 2, 1))

    order = dispatch_order(sched, 51)

    assert [lease.delivery_id for lease in order[:50]] == [i.delivery_id for i in flood]
    assert order[50].tenant_id == 2
    assert_no_tenant_keys(sched)


def test_fifo_mode_defers_capped_deliveries_and_still_drains(scheduler_conn):
    sched = Scheduler(scheduler_conn, mode="fifo")
    sched.enqueue(batch(1, 1, 5, max_in_flight=1) + batch(2, 2, 2))

    leases = sched.pick("w", 10).leases

    assert Counter(lease.endpoint_id for lease in leases) == {1: 1, 2: 2}
    assert sched.snapshot().deferrals_total == 4
    sched.ack(leases)
    assert len(drain(sched, max_items=1)) == 4
    check_invariants(sched)


def test_paused_tenant_gets_no_turns_and_resumes_where_it_was(scheduler_conn):
    sched = Scheduler(scheduler_conn)
    paused_work = batch(1, 1, 6, max_in_flight=10)
    sched.enqueue(paused_work + batch(2, 2, 20, max_in_flight=10))
    first = dispatch_order(sched, 4)

    sched.set_tenant(1, weight=1, paused=True)
    during = dispatch_order(sched, 10)
    assert {lease.tenant_id for lease in during} == {2}
    row = next(row for row in sched.snapshot().tenants if row.tenant_id == 1)
    assert row.paused and row.fresh == 4
    check_invariants(sched)
    sched.set_tenant(1, weight=1, paused=False)
    after = dispatch_order(sched, 8)

    tenant_1 = [lease.delivery_id for lease in first + after if lease.tenant_id == 1]
    assert tenant_1 == [item.delivery_id for item in paused_work]
    # Back in the rotation at the current virtual time: alternating again at once.
    assert min(Counter(lease.tenant_id for lease in after[:6]).values()) >= 2


def test_pausing_does_not_strand_slots_handed_to_the_paused_tenant(scheduler_conn):
    sched = Scheduler(scheduler_conn)
    sched.enqueue(batch(1, 1, 3, max_in_flight=1) + batch(2, 1, 3, max_in_flight=1))
    (lease,) = sched.pick("w", 5).leases
    sched.ack([lease])  # un-parks the next lane in line
    waiting = 2 if lease.tenant_id == 1 else 1

    sched.set_tenant(3 - waiting, weight=1, paused=True)

    assert [x.tenant_id for x in sched.pick("w", 5).leases] == [waiting]


# --- snapshot, wake-ups, epochs ---------------------------------------------------------


def test_snapshot_reports_a_known_scenario(scheduler_conn):
    clock = FakeClock()
    now_ms = int(T0 * 1000)
    sched = Scheduler(scheduler_conn, clock=clock)

    def aged(tenant, endpoint, seconds_old, **fields):
        return Item(new_ulid(now_ms - seconds_old * 1000), tenant, endpoint, **fields)

    sched.enqueue([aged(1, 1, 300, max_in_flight=1), aged(1, 1, 200, max_in_flight=1)])
    sched.enqueue([aged(2, 2, 100, weight=4, max_in_flight=3), aged(2, 2, 50, max_in_flight=3)])
    sched.enqueue([aged(None, 3, 10), aged(3, 1, 20, max_in_flight=1)])
    sched.set_tenant(3, weight=1, paused=True)
    _, t2, _ = sched.pick("w", 3).leases  # one turn each; tenant 3 is paused
    sched.retry_later(t2, due_at=T0 + 60)

    snap = sched.snapshot(top_n=2, age_buckets=(30, 150, 250))

    assert (snap.fresh_depth, snap.retry_depth, snap.delayed_depth, snap.in_flight) == (3, 0, 1, 2)
    assert (snap.active_tenants, snap.backlogged_tenants) == (4, 3)
    assert (snap.fallback_enqueued_total, snap.fallback_depth) == (1, 0)
    assert snap.oldest_age_seconds == pytest.approx(200, abs=0.01)
    assert [(r.tenant_id, r.fresh, r.in_flight, r.weight) for r in snap.tenants] == [
        (1, 1, 1, 1),
        (2, 1, 0, 1),
    ]
    assert snap.tenants[1].delayed == 1 and snap.tenants[1].oldest_age_seconds == 50
    assert snap.age_histogram == {30: 1, 150: 2, 250: 3}
    endpoint_1 = next(row for row in snap.endpoints if row.endpoint_id == 1)
    assert (endpoint_1.in_flight, endpoint_1.max_in_flight, endpoint_1.parked_lanes) == (1, 1, 1)
    assert sched.age_histogram([100]) == {100: 2}


def test_snapshot_is_one_bounded_call_at_thousands_of_tenants(scheduler_conn, monkeypatch):
    sched = Scheduler(scheduler_conn)
    for start in range(0, 5000, 1000):
        sched.enqueue(
            [Item(new_ulid(), t, 1, max_in_flight=10) for t in range(start, start + 1000)]
        )
    sched.snapshot()  # load the script
    expected = script_command(sched)
    calls = []
    real = scheduler_conn.execute_command
    monkeypatch.setattr(
        scheduler_conn, "execute_command", lambda *a, **k: calls.append(a[0]) or real(*a, **k)
    )

    snap = sched.snapshot(top_n=10)

    assert calls == [expected]
    assert len(snap.tenants) == 10 and snap.backlogged_tenants == 5000
    assert snap.age_histogram[max(snap.age_histogram)] == 5000


def test_set_tenant_changes_the_weight_of_a_backlogged_tenant(scheduler_conn):
    sched = Scheduler(scheduler_conn)
    sched.enqueue(batch(1, 1, 300, max_in_flight=10) + batch(2, 2, 300, max_in_flight=10))

    sched.set_tenant(2, weight=3, paused=False)

    shares = Counter(lease.tenant_id for lease in dispatch_order(sched, 200))
    assert 135 <= shares[2] <= 165


def test_wait_wakes_on_enqueue(scheduler_conn):
    sched = Scheduler(scheduler_conn)
    threading.Timer(0.2, sched.enqueue, [batch(1, 1, 1)]).start()

    started = time.monotonic()
    sched.wait(5)

    assert time.monotonic() - started < 2
    assert len(sched.pick("w").leases) == 1


def test_wait_wakes_when_an_ack_frees_a_slot_for_parked_work(scheduler_conn):
    sched = Scheduler(scheduler_conn)
    sched.enqueue(batch(1, 1, 2, max_in_flight=1))
    held = sched.pick("w", 5).leases
    assert sched.pick("w").wait_seconds > 0
    scheduler_conn.delete(sched.keys.wake)  # only the ack may wake us
    threading.Timer(0.2, sched.ack, [held]).start()

    started = time.monotonic()
    sched.wait(5)

    assert time.monotonic() - started < 2
    assert len(sched.pick("w").leases) == 1


def test_wait_sleeps_until_the_timeout_when_nothing_happens(scheduler_conn):
    sched = Scheduler(scheduler_conn)
    started = time.monotonic()
    sched.wait(0.3)
    assert 0.25 <= time.monotonic() - started < 2


def test_a_wait_under_a_millisecond_ends_on_every_server(scheduler_conn):
    """Work due in under a millisecond gives such a wait; Redis 6 truncates a BLPOP
    timeout to whole milliseconds and reads 0 as "block forever"."""
    sched = Scheduler(scheduler_conn)
    for timeout in (0.0004, 0.000001, 0.001):
        waiter = threading.Thread(target=sched.wait, args=(timeout,))
        waiter.start()
        waiter.join(3)
        ended = not waiter.is_alive()
        if not ended:
            sched.enqueue(batch(1, 1, 1))  # a wake-up lets the stuck waiter go
            waiter.join(5)
        assert ended, f"wait({timeout}) still blocked after 3 s"


def test_epoch_marks_a_rebuilt_schedule_and_clear_removes_every_key(scheduler_conn):
    sched = Scheduler(scheduler_conn, shard=3)
    other = Scheduler(scheduler_conn, shard=4)
    assert sched.epoch() is None
    marker = sched.start_epoch()
    sched.enqueue(batch(1, 1, 3) + batch(None, 2, 1, due_at=time.time() + 60))
    other.enqueue(batch(1, 1, 1))
    assert sched.epoch() == marker

    sched.clear()

    assert sched.epoch() is None and schedule_keys(sched) == set()
    assert schedule_keys(other)  # another shard is untouched


def test_clear_removes_a_schedule_larger_than_one_scan_page(scheduler_conn):
    # The clear script pages through SCAN and UNLINKs in chunks; none may be left behind.
    sched = Scheduler(scheduler_conn, shard=5)
    sched.enqueue([item for tenant in range(1, 701) for item in batch(tenant, tenant, 1)])
    assert len(schedule_keys(sched)) > 1000
    sched.clear()
    assert schedule_keys(sched) == set()


def test_enqueue_with_a_future_due_at_is_delayed_until_then(scheduler_conn):
    clock = FakeClock()
    sched = Scheduler(scheduler_conn, clock=clock)
    sched.enqueue(batch(1, 1, 1, lane="retry", due_at=T0 + 10) + batch(1, 1, 1, due_at=T0 - 1))

    assert [lease.lane for lease in sched.pick("w", 5).leases] == ["fresh"]
    clock.advance(10)
    assert [lease.lane for lease in sched.pick("w", 5).leases] == ["retry"]


def test_from_settings_reads_the_settings_at_call_time(settings):
    settings.SCHEDULER_MODE = "fifo"
    settings.SCHEDULER_SHARD = 5
    settings.SCHEDULER_TURN_SIZE = 3
    settings.LEASE_SECONDS = 7

    sched = Scheduler.from_settings(redis_connection.shared())

    assert (sched.mode, sched.shard, sched.turn_size, sched.lease_seconds) == ("fifo", 5, 3, 7)


# --- cost -----------------------------------------------------------------------------


def test_enqueue_pick_and_ack_each_take_one_round_trip(scheduler_conn, monkeypatch):
    sched = Scheduler(scheduler_conn)
    sched.enqueue(batch(1, 1, 1))
    sched.ack(sched.pick("w").leases)  # load the scripts once
    expected = script_command(sched)
    calls = []
    real = scheduler_conn.execute_command
    monkeypatch.setattr(
        scheduler_conn, "execute_command", lambda *a, **k: calls.append(a[0]) or real(*a, **k)
    )

    sched.enqueue(batch(1, 1, 50) + batch(2, 2, 50))
    leases = sched.pick("w", max_items=4).leases
    sched.ack(leases)

    assert len(leases) == 4 and calls == [expected] * 3


def test_a_queued_delivery_costs_about_32_bytes_in_its_lane(scheduler_conn):
    sched = Scheduler(scheduler_conn)
    sched.enqueue(batch(1, 1, 2000))
    used = scheduler_conn.memory_usage(sched.keys.lane(1, 1, "fresh"), samples=0)
    assert used / 2000 <= 40


def test_counters_read_beside_a_fractional_virtual_time(scheduler_conn):
    """A weight-4 tenant advances virtual time by quarters; the counters (the metrics' and
    the demo's) must still read. They once parsed every stats field as an int."""
    sched = Scheduler(scheduler_conn)
    sched.enqueue(batch(1, 1, 3, weight=4, max_in_flight=3))
    for _ in range(3):
        sched.ack(sched.pick("w", 1).leases, outcome="delivered")

    assert "." in scheduler_conn.hget(sched.keys.stats, "V").decode()
    assert sched.counters() == {"delivered": 3}


def test_counters_total_finished_leases_by_outcome(scheduler_conn):
    sched = Scheduler(scheduler_conn)
    sched.enqueue(batch(1, 1, 4, max_in_flight=4))
    a, b, c, d = sched.pick("w", 4).leases

    sched.ack([a, b], outcome="delivered")
    sched.ack([c], outcome="dead")
    sched.retry_later(d, time.time() + 60)
    sched.ack([a], outcome="delivered")  # lost: not counted twice

    assert sched.counters() == {"delivered": 2, "dead": 1, "retry": 1}
    with pytest.raises(ValueError):
        sched.ack([d], outcome="no such outcome!")

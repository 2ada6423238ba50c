"""Adaptive in-flight limits: how an endpoint's limit moves on what its answers say, and
that picks keep to it (lua/lib.lua's adapt; docs/SCHEDULER.md, "Adaptive limits").

Real Redis (the plain server, the cluster and Redis 6.2, as every scheduler test), a fake
clock for the once-per-round-trip rule."""

import pytest

from core.ids import new_ulid
from delivery.scheduler import (
    RETRY,
    EndpointAnswers,
    Item,
    Lease,
    Scheduler,
    ShardedScheduler,
    shard_index,
)
from tests.scheduler_helpers import T0, batch, check_invariants, endpoint_row


def adaptive(n: int, endpoint: int = 1, tenant: int = 1, cap: int = 100) -> list:
    return batch(tenant, endpoint, n, max_in_flight=cap, retry_max_in_flight=cap, adaptive=True)


def limit_of(sched: Scheduler, endpoint: int = 1) -> float:
    return endpoint_row(sched, endpoint)["al"]


def fast(n: int, endpoint: int = 1, ms: float = 50) -> list[EndpointAnswers]:
    return [EndpointAnswers(endpoint, ok=n, latency_ms=n * ms)]


def test_a_new_adaptive_endpoint_starts_low_and_picks_keep_to_its_limit(sched) -> None:
    sched.enqueue(adaptive(20))
    assert limit_of(sched) == 4
    assert len(sched.pick("w", 20).leases) == 4  # under a cap of 100
    snapshot = sched.snapshot()
    (row,) = snapshot.endpoints
    assert (row.max_in_flight, row.adaptive_limit, row.in_flight) == (100, 4, 4)
    check_invariants(sched)


def test_fast_answers_double_it_per_round_trip_until_the_first_backoff(sched, clock) -> None:
    sched.enqueue(adaptive(200))
    leases = sched.pick("w", 50).leases
    sched.answered(leases, fast(len(leases)))
    assert limit_of(sched) == 8  # slow start: one more per fast answer
    leases = sched.pick("w", 50).leases
    assert len(leases) == 8
    sched.answered(leases, fast(8))
    assert limit_of(sched) == 16
    # After a backoff (an overload), a round trip's worth of answers adds one.
    leases = sched.pick("w", 50).leases
    sched.answered(leases[:1], [EndpointAnswers(1, overloaded=1)])
    assert limit_of(sched) == 8
    clock.advance(1)
    sched.answered(leases[1:9], fast(8))
    assert limit_of(sched) == pytest.approx(9)
    check_invariants(sched)


def test_an_overload_halves_it_once_per_round_trip_and_never_below_one(sched, clock) -> None:
    sched.enqueue(adaptive(100))
    leases = sched.pick("w", 50).leases
    sched.answered(leases, fast(4, ms=100))  # a round trip of 100 ms; limit 8
    leases = sched.pick("w", 50).leases
    overload = [EndpointAnswers(1, overloaded=2)]
    sched.answered(leases[:2], overload)
    assert limit_of(sched) == 4
    sched.answered(leases[2:4], overload)  # the same round trip's answers
    assert limit_of(sched) == 4
    for expected in (2, 1, 1):
        clock.advance(0.2)
        sched.answered([], overload)
        assert limit_of(sched) == expected
    state = sched.endpoint_state(1)
    assert (state.adaptive_limit, state.max_in_flight, state.in_flight) == (1, 100, 4)
    assert state.backed_off_at == pytest.approx(clock.now)
    assert (state.backed_off_from, state.backed_off_latency_ms) == (1, None)  # an overload
    assert (state.latency_ms, state.baseline_ms) == (100, 100)
    assert len(sched.pick("w", 50).leases) == 0  # four still open, limit 1


def test_latency_past_its_tolerance_lowers_it_in_proportion(sched, clock) -> None:
    sched.enqueue(adaptive(100))
    leases = sched.pick("w", 50).leases
    sched.answered(leases, fast(4, ms=50))  # baseline 50 ms, limit 8
    leases = sched.pick("w", 50).leases
    clock.advance(1)
    sched.answered(leases[:4], fast(4, ms=100))  # recent 50 + 0.8 x 50 = 90 ms
    row = endpoint_row(sched, 1)
    assert row["lf"] == pytest.approx(90)
    assert row["lb"] == 50  # slower answers do not move the baseline
    assert row["al"] == pytest.approx(8 * 50 * 1.5 / 90)
    state = sched.endpoint_state(1)
    assert state.backed_off_from == 8  # and why: the recent latency, too slow
    assert state.backed_off_latency_ms == pytest.approx(90)
    # Within the tolerance it grows again, by a round trip's worth.
    clock.advance(1)
    sched.answered(leases[4:], fast(4, ms=50))
    assert limit_of(sched) > row["al"]


def test_a_fast_endpoint_is_not_slow_for_a_few_milliseconds_more(sched, clock) -> None:
    sched.enqueue(adaptive(100))
    leases = sched.pick("w", 50).leases
    sched.answered(leases, fast(4, ms=1))  # baseline 1 ms, limit 8
    for _ in range(3):  # our own busy workers add a few milliseconds to every answer
        clock.advance(1)
        leases = sched.pick("w", 50).leases
        sched.answered(leases, fast(len(leases), ms=6))
    row = endpoint_row(sched, 1)
    assert row["lb"] == 1 and row["lf"] > 1.5 * 3  # far past 1.5 x its baseline
    assert sched.endpoint_state(1).backed_off_at is None
    assert limit_of(sched) > 8  # and it grows on
    grown = limit_of(sched)
    for _ in range(3):  # tens of milliseconds more is the endpoint's own queue
        clock.advance(1)
        leases = sched.pick("w", 50).leases
        sched.answered(leases, fast(len(leases), ms=60))
    assert sched.endpoint_state(1).backed_off_at is not None
    assert limit_of(sched) < grown


def test_an_endpoint_fast_and_slow_by_turns_is_not_slow_against_its_fast_answers(
    sched, clock
) -> None:
    """Answers of 1 ms and of 70 ms by turns, whatever the requests open: a receiver with
    a fast and a slow path. Its latency does not follow the limit: after one backoff from
    a baseline its first answer set, the limit grows and stays grown."""
    sched.enqueue(adaptive(2000, cap=500))
    turn, limits = 0, []
    for _ in range(40):  # round trips: every request the limit allows, answered one by one
        clock.advance(0.1)
        for lease in sched.pick("w", 500).leases:
            turn += 1
            sched.answered([lease], fast(1, ms=1 if turn % 2 else 70))
        limits.append(limit_of(sched))
    assert endpoint_row(sched, 1)["lb"] > 10  # its lowest recent latency, not its fastest
    assert min(limits[-10:]) > 8


def test_an_endpoint_slower_for_good_is_measured_again_at_a_limit_of_one(sched, clock) -> None:
    sched.enqueue(adaptive(500))
    leases = sched.pick("w", 50).leases
    sched.answered(leases, fast(len(leases), ms=50))  # baseline 50 ms
    limits = []
    for _ in range(30):  # from now on it answers in 200 ms, however few are open
        clock.advance(1)
        leases = sched.pick("w", 50).leases
        sched.answered(leases, fast(len(leases), ms=200))
        limits.append(limit_of(sched))
    assert min(limits) == 1  # backed off all the way: a queue cannot explain 4x
    assert endpoint_row(sched, 1)["lb"] == 200  # at 1, the baseline is what it answers
    assert limits[-1] > 1  # and within its new pace it grows again


def test_an_unused_limit_does_not_grow_and_the_cap_bounds_it(sched) -> None:
    sched.enqueue(adaptive(1, cap=6))
    (lease,) = sched.pick("w", 50).leases
    sched.answered([lease], fast(1))  # one open of a limit of 4: no evidence for more
    assert limit_of(sched) == 4
    sched.enqueue(adaptive(50, cap=6))
    leases = sched.pick("w", 50).leases
    sched.answered(leases, fast(len(leases)))
    assert limit_of(sched) == 6  # the cap is the ceiling
    assert len(sched.pick("w", 50).leases) == 6


def test_a_raised_limit_unparks_the_lanes_waiting_for_it(sched) -> None:
    sched.enqueue(adaptive(10, tenant=1) + adaptive(10, tenant=2))
    assert len(sched.pick("w", 20).leases) == 4  # the rest of both lanes park
    # Answers alone (their leases already recorded): the limit goes to 8 and the
    # endpoint's parked lanes are offered the room at once.
    sched.answered([], fast(4))
    assert limit_of(sched) == 8
    assert len(sched.pick("w", 20).leases) == 4
    check_invariants(sched)


def test_an_endpoint_the_schedule_does_not_hold_has_no_state(sched) -> None:
    assert sched.endpoint_state(99) is None


def test_an_endpoint_without_adaptation_keeps_its_cap_whatever_it_answers(sched) -> None:
    sched.enqueue(batch(1, 1, 20, max_in_flight=5))
    leases = sched.pick("w", 20).leases
    assert len(leases) == 5
    sched.answered(leases, [EndpointAnswers(1, overloaded=5)])
    assert endpoint_row(sched, 1)["al"] == 0
    assert len(sched.pick("w", 20).leases) == 5
    (row,) = sched.snapshot().endpoints
    assert row.adaptive_limit is None
    state = sched.endpoint_state(1)
    assert (state.max_in_flight, state.adaptive_limit, state.latency_ms) == (5, None, None)


def test_turning_it_off_restores_the_cap_and_on_again_starts_low(sched) -> None:
    sched.enqueue(adaptive(40, cap=10))
    leases = sched.pick("w", 50).leases
    sched.answered(leases, fast(4))
    assert limit_of(sched) == 8
    sched.set_endpoint(1, max_in_flight=10, retry_max_in_flight=10, adaptive=False)
    assert limit_of(sched) == 0
    assert len(sched.pick("w", 50).leases) == 10  # the cap
    sched.set_endpoint(1, max_in_flight=10, retry_max_in_flight=10, adaptive=True)
    assert limit_of(sched) == 4
    # An operator lowering the cap lowers a limit above it.
    sched.set_endpoint(1, max_in_flight=3, retry_max_in_flight=3, adaptive=True)
    assert limit_of(sched) == 3


def test_a_schedule_rebuilt_after_a_loss_starts_the_limit_low_again(sched) -> None:
    sched.enqueue(adaptive(100))
    for _ in range(3):
        leases = sched.pick("w", 50).leases
        sched.answered(leases, fast(len(leases)))
    assert limit_of(sched) == 32
    sched.clear()  # what a rebuild does first, as after Redis lost the schedule
    sched.enqueue(adaptive(10))
    assert limit_of(sched) == 4


def test_answers_reach_each_endpoints_own_shard(scheduler_conn) -> None:
    shards = ShardedScheduler([Scheduler(scheduler_conn, shard=20 + i) for i in range(3)])
    endpoints = list(range(1, 13))
    assert len({shard_index(e, 3) for e in endpoints}) == 3
    for shard in shards.shards:
        shard.clear()
    shards.enqueue([item for e in endpoints for item in adaptive(10, endpoint=e)])
    leases = shards.pick("w", 100).leases
    assert len(leases) == 4 * len(endpoints)
    shards.answered(leases, [answer for e in endpoints for answer in fast(4, endpoint=e)])
    for e in endpoints:
        assert limit_of(shards.shard_for(e), e) == 8


def test_a_recovering_endpoint_with_100000_retries_waiting_is_not_pushed_past_capacity(
    sched, clock
) -> None:
    """An endpoint comes back from an outage with 100,000 retries queued for it. Its
    server (modelled here, on the fake clock) takes C at once at full speed, slows past C
    and answers 503 past 2C. The limit, backed off to 1 during the outage, grows by one
    per round trip from there (no slow start after a backoff): the backlog leaves at the
    pace the endpoint can take, with no second fall."""
    capacity, service = 20, 0.1
    retries = [Item(new_ulid(), 1, 1, 1, 1000, 1000, RETRY, adaptive=True) for _ in range(100_000)]
    for start in range(0, len(retries), 5_000):
        sched.enqueue(retries[start : start + 5_000])
    # The outage: every answer an overload, until the limit is down to one.
    while limit_of(sched) > 1:
        leases = sched.pick("w", 1000).leases
        clock.advance(0.2)
        sched.answered(leases, [EndpointAnswers(1, overloaded=len(leases))])
        sched.retry_later_many([(lease, clock.now + 3600) for lease in leases])
    # Back up. Requests complete at their time; the worker answers and acks each batch.
    open_requests: list[tuple[float, float, Lease]] = []  # (ends at, took, lease)
    overloads, delivered_at, open_max = 0, [], 0
    while clock.now < T0 + 120:
        clock.advance(0.01)
        ended = [request for request in open_requests if request[0] <= clock.now]
        open_requests = [request for request in open_requests if request[0] > clock.now]
        if ended:
            took_ms = sum(1000 * took for _, took, _ in ended)
            leases = [lease for _, _, lease in ended]
            sched.answered(leases, [EndpointAnswers(1, ok=len(ended), latency_ms=took_ms)])
            sched.ack(leases)
            delivered_at += [clock.now] * len(ended)
        for lease in sched.pick("w", 1000).leases:
            n = len(open_requests) + 1
            if n > 2 * capacity:
                overloads += 1
                sched.answered([lease], [EndpointAnswers(1, overloaded=1)])
                sched.retry_later_many([(lease, clock.now + 3600)])
                continue
            took = service * max(1, n / capacity)
            open_requests.append((clock.now + took, took, lease))
            open_max = max(open_max, len(open_requests))
    assert overloads == 0, "pushed past its capacity after the recovery"
    assert open_max <= 2 * capacity
    # And it gets there: the last 30 s at 0.8 of the capacity or more.
    late = sum(1 for at in delivered_at if at > clock.now - 30)
    assert late / 30 >= 0.8 * capacity / service
    assert len(delivered_at) < 100_000  # at the endpoint's pace, not in one wave

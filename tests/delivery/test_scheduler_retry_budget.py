"""Retry budgets: an endpoint's retries take tokens that only accepted deliveries and the
clock give back, so retries into a failing endpoint wait (no lease, no attempt) while its
fresh deliveries go on (lua/lib.lua's retry_budget; docs/SCHEDULER.md, "Retry budgets").

Real Redis (the plain server, the cluster and Redis 6.2, as every scheduler test), a fake
clock for the refill."""

from collections import Counter
from dataclasses import replace

import pytest

from core.ids import new_ulid
from delivery.scheduler import RETRY, EndpointAnswers, Item, Lease, Scheduler
from tests.scheduler_helpers import FakeClock, batch, check_invariants, endpoint_row

CAP = 2  # in flight: the budget holds twice that


def retries(n: int, tenant: int = 1, endpoint: int = 1) -> list[Item]:
    return batch(tenant, endpoint, n, lane=RETRY, max_in_flight=CAP, retry_max_in_flight=CAP)


def fresh(n: int, tenant: int = 1, endpoint: int = 1) -> list[Item]:
    return batch(tenant, endpoint, n, max_in_flight=CAP, retry_max_in_flight=CAP)


def fail(sched: Scheduler, clock: FakeClock, leases: list[Lease]) -> None:
    """The attempts failed: each is retried an hour from now (out of the way)."""
    sched.retry_later_many([(lease, clock.now + 3600) for lease in leases])


def budget(sched: Scheduler, endpoint: int = 1) -> float:
    state = sched.endpoint_state(endpoint)
    assert state is not None
    return state.retry_budget


def test_retries_into_a_failing_endpoint_wait_for_tokens_without_a_lease(sched, clock) -> None:
    sched.enqueue(retries(20))
    assert budget(sched) == 2 * CAP  # a new endpoint's budget is full
    failed = 0
    for _ in range(2):
        leases = sched.pick("w", 10).leases
        assert len(leases) == CAP
        fail(sched, clock, leases)
        failed += len(leases)
    # Slots are free, but the four tokens went on retries that failed: the rest wait.
    pick = sched.pick("w", 10)
    assert pick.leases == []
    assert 0 < pick.wait_seconds <= 1  # until its next token, not the 5 s idle sleep
    assert sched.snapshot().retry_depth == 20 - failed  # queued, not attempted
    # One token a second.
    clock.advance(1)
    assert len(sched.pick("w", 10).leases) == 1
    clock.advance(0.5)
    assert sched.pick("w", 10).leases == []
    check_invariants(sched)


def test_fresh_deliveries_keep_the_lane_while_retries_wait(sched, clock) -> None:
    sched.enqueue(retries(10))
    for _ in range(2):
        fail(sched, clock, sched.pick("w", 10).leases)
    sched.enqueue(fresh(6))
    got = []
    for _ in range(3):
        leases = sched.pick("w", 10).leases
        got += [lease.lane for lease in leases]
        sched.ack(leases, outcome="dead")  # fresh ones failing for good earn nothing
    assert got == ["fresh"] * 6
    assert sched.pick("w", 10).leases == []
    check_invariants(sched)


def test_accepted_deliveries_earn_a_fifth_and_an_accepted_retry_its_own_token(sched, clock) -> None:
    sched.enqueue(retries(10))
    for _ in range(2):
        fail(sched, clock, sched.pick("w", 10).leases)
    assert budget(sched) == 0
    # Five fresh deliveries accepted: one retry's worth.
    sched.enqueue(fresh(5))
    for _ in range(5):
        (lease,) = sched.pick("w", 1).leases
        assert lease.lane == "fresh"
        sched.ack([lease], outcome="delivered")
    assert budget(sched) == pytest.approx(1.0)
    (retry,) = sched.pick("w", 10).leases
    assert retry.lane == "retry"
    sched.ack([retry], outcome="delivered")  # its token back, and a fifth
    assert budget(sched) == pytest.approx(1.2)
    # An accepted one frees a parked retry lane at once: the next retry goes.
    (retry,) = sched.pick("w", 10).leases
    sched.ack([retry], outcome="held")  # the endpoint was disabled: nothing earned
    assert budget(sched) == pytest.approx(0.2)
    check_invariants(sched)


def test_the_ack_that_earns_a_whole_token_wakes_the_retries_waiting_for_it(sched, clock) -> None:
    sched.enqueue(retries(10))
    for _ in range(2):
        fail(sched, clock, sched.pick("w", 10).leases)
    assert sched.pick("w", 10).leases == []  # the retry lane waits for a token
    sched.enqueue(fresh(5))
    for _ in range(5):
        (lease,) = sched.pick("w", 1).leases
        assert lease.lane == "fresh"
        # As the engine does: the answer frees the slot (no token yet to wake for),
        # then the ack records the delivery and earns its fifth of a token.
        sched.answered([lease])
        sched.ack([lease], outcome="delivered")
    assert budget(sched) == pytest.approx(1.0)
    # The fifth ack's token goes at once, not when the clock's refill is due.
    (retry,) = sched.pick("w", 10).leases
    assert retry.lane == "retry"
    check_invariants(sched)


def test_an_accepted_retry_wakes_another_tenants_retry_waiting_for_a_token(sched, clock) -> None:
    sched.enqueue(retries(4, tenant=1) + retries(4, tenant=2))
    for _ in range(2):
        fail(sched, clock, sched.pick("w", 10).leases)
    assert sched.pick("w", 10).leases == []  # both tenants' retry lanes wait
    clock.advance(1)
    (first,) = sched.pick("w", 10).leases
    sched.ack([first], outcome="delivered")
    (second,) = sched.pick("w", 10).leases
    assert {first.tenant_id, second.tenant_id} == {1, 2}  # by turn, not by who came first
    check_invariants(sched)


def test_a_full_budget_holds_twice_the_limit_and_an_idle_endpoint_starts_full(sched, clock) -> None:
    sched.enqueue(retries(1))
    (lease,) = sched.pick("w", 10).leases
    row = endpoint_row(sched, 1)
    assert (row["bt"], row["bs"]) == (2 * CAP - 1, clock.now)
    clock.advance(60)
    assert budget(sched) == 2 * CAP  # refilled, and no more than full
    sched.ack([lease])
    assert endpoint_row(sched, 1) == {}  # nothing left: the row, and its budget, go
    sched.enqueue(retries(1))
    assert budget(sched) == 2 * CAP


def test_the_budget_follows_an_adaptive_limit(sched, clock) -> None:
    items = [Item(new_ulid(), 1, 1, 1, 100, 100, RETRY, adaptive=True) for _ in range(50)]
    sched.enqueue(items)
    assert sched.endpoint_state(1).retry_budget_cap == 8  # a new limit of 4
    leases = sched.pick("w", 50).leases
    assert len(leases) == 4
    sched.answered(leases, [EndpointAnswers(1, ok=4, latency_ms=200)])
    sched.ack(leases, outcome="delivered")
    state = sched.endpoint_state(1)
    assert (state.adaptive_limit, state.retry_budget_cap) == (8, 16)
    assert state.retry_budget == pytest.approx(8 - 4 + 4 * 1.2)


def wide_retries(n: int, tenant: int, endpoints: range) -> list[Item]:
    """n retries spread over endpoints with room enough that their own budgets never bind
    before the tenant's does."""
    return [
        Item(new_ulid(), tenant, endpoints[i % len(endpoints)], 1, 1000, 1000, RETRY)
        for i in range(n)
    ]


def test_a_tenants_failing_retries_over_many_endpoints_wait_for_its_own_budget(
    sched, clock
) -> None:
    sched.enqueue(wide_retries(400, tenant=1, endpoints=range(1, 11)))
    first = sched.pick("w", 1000).leases
    assert len(first) == 200  # the tenant's budget, though each endpoint has room
    fail(sched, clock, first)
    pick = sched.pick("w", 1000)
    assert pick.leases == []
    assert 0 < pick.wait_seconds <= 0.1  # ten tokens a second
    clock.advance(1)
    assert len(sched.pick("w", 1000).leases) == 10
    check_invariants(sched)


def test_a_tenant_out_of_retry_tokens_still_sends_its_fresh_work_and_others_retries(
    sched, clock
) -> None:
    sched.enqueue(wide_retries(300, tenant=1, endpoints=range(1, 11)))
    fail(sched, clock, sched.pick("w", 1000).leases)
    sched.enqueue(
        [Item(new_ulid(), 1, 20, 1, 10, 10) for _ in range(5)]
        + wide_retries(5, tenant=2, endpoints=range(30, 31))
    )
    # Tenant 1 sleeps until its next retry token (a tenth of a second), then its fresh
    # work goes, and tenant 2's retries were never held.
    assert Counter((lease.tenant_id, lease.lane) for lease in sched.pick("w", 1000).leases) == {
        (2, "retry"): 5
    }
    clock.advance(0.1)
    got = Counter((lease.tenant_id, lease.lane) for lease in sched.pick("w", 1000).leases)
    assert got[(1, "fresh")] == 5 and got[(1, "retry")] <= 1
    check_invariants(sched)


def test_a_tenants_accepted_retries_earn_their_tokens_back(sched, clock) -> None:
    sched.enqueue(wide_retries(300, tenant=1, endpoints=range(1, 11)))
    leases = sched.pick("w", 1000).leases
    assert len(leases) == 200
    sched.ack(leases[:50], outcome="delivered")
    fail(sched, clock, leases[50:])
    assert len(sched.pick("w", 1000).leases) == 50  # the accepted ones' tokens
    check_invariants(sched)


def test_a_tenant_asleep_for_a_retry_token_does_not_read_as_rate_limited(sched, clock) -> None:
    # Tenant 1 has a rate with tokens to spare; tenant 2 spent its own rate's tokens.
    sched.enqueue(
        [replace(item, tenant_rate=1000.0) for item in wide_retries(300, 1, range(1, 11))]
        + [Item(new_ulid(), 2, 40, 1, 10, 10, tenant_rate=1.0) for _ in range(3)]
    )
    fail(sched, clock, sched.pick("w", 1000).leases)
    assert sched.pick("w", 1000).leases == []  # 1 sleeps for its retry budget, 2 for its rate
    rows = {row.tenant_id: row for row in sched.snapshot().tenants}
    assert rows[1].rate_limited is False
    assert rows[2].rate_limited is True

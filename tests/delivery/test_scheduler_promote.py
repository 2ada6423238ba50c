"""Scheduler.promote, the admin's "retry now": a delayed delivery enters its retry lane
at once, exactly once, and the schedule's counts stay true."""

import pytest

from delivery.scheduler import Scheduler
from tests.scheduler_helpers import FakeClock, assert_no_tenant_keys, batch, check_invariants, drain


@pytest.mark.parametrize("mode", ["fair", "fifo"])
def test_a_delayed_retry_is_handed_out_at_once_and_only_once(redis_conn, mode) -> None:
    clock = FakeClock()
    sched = Scheduler(redis_conn, clock=clock, mode=mode)
    sched.enqueue(batch(1, 7, 1))
    (lease,) = sched.pick("w").leases
    assert sched.retry_later(lease, due_at=clock.now + 3600)
    assert sched.pick("w").leases == []

    assert sched.promote(lease.delivery_id, 1, 7) is True
    assert sched.promote(lease.delivery_id, 1, 7) is False  # entered once
    assert sched.snapshot().delayed_depth == 0
    check_invariants(sched)
    (retry,) = sched.pick("w").leases

    assert (retry.delivery_id, retry.lane) == (lease.delivery_id, "retry")
    sched.ack([retry])
    clock.advance(3601)  # its old due time: nothing is left to promote
    assert drain(sched) == []
    assert_no_tenant_keys(sched)


def test_promote_changes_nothing_for_what_is_not_delayed(redis_conn) -> None:
    sched = Scheduler(redis_conn, clock=FakeClock())
    queued, held = batch(None, 3, 2)
    sched.enqueue([queued])
    sched.enqueue([held])
    (lease,) = sched.pick("w").leases  # queued, now leased
    assert sched.retry_later(lease, due_at=FakeClock().now + 60)

    assert sched.promote(held.delivery_id, None, 3) is False  # queued, not delayed
    assert sched.promote(lease.delivery_id, 2, 3) is False  # another tenant's lane
    assert sched.promote(lease.delivery_id, None, 3) is True  # the fallback lane
    assert {one.delivery_id for one in drain(sched)} == {queued.delivery_id, held.delivery_id}

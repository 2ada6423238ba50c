"""Rebuilding the Redis schedule from the database, one rebuild at a time."""

import time

import pytest
from django.core.management import CommandError, call_command

from core.ids import new_ulid
from delivery import maintenance
from delivery.enqueueing import get_scheduler
from delivery.maintenance import RebuildInProgress
from delivery.scheduler import Item
from ingest.publish import publish
from tests.factories import make_endpoint, make_tenant

pytestmark = pytest.mark.django_db


def open_deliveries(count: int) -> None:
    """Rows only: in these tests' transaction nothing is enqueued on commit."""
    tenant = make_tenant("acme")
    make_endpoint(tenant)
    for i in range(count):
        publish(tenant, "x", {"i": i})


def test_a_rebuild_enqueues_every_open_delivery_once_then_sets_the_epoch(redis_conn) -> None:
    open_deliveries(3)
    scheduler = get_scheduler()

    assert maintenance.rebuild_schedule() == 3

    assert scheduler.snapshot().fresh_depth == 3
    assert scheduler.epoch() is not None
    assert not redis_conn.exists(scheduler.keys.rebuild_lock)  # released


def test_while_a_rebuild_runs_another_is_refused_and_changes_nothing(redis_conn) -> None:
    open_deliveries(3)
    scheduler = get_scheduler()
    running = maintenance.rebuild_lock()  # another process's rebuild, part way through
    assert running.acquire()
    scheduler.enqueue([Item(new_ulid(), None, 1)])  # what it has enqueued so far

    with pytest.raises(RebuildInProgress):
        maintenance.rebuild_schedule()
    assert maintenance.sweep()["rebuilt"] == 0  # no epoch yet, but not a second rebuild
    with pytest.raises(CommandError, match="another process is rebuilding"):
        call_command("rebuild_lanes")

    assert scheduler.snapshot().fresh_depth == 1  # nothing cleared under the running one
    running.release()
    assert maintenance.sweep()["rebuilt"] == 3


def test_the_rebuild_lock_outlives_the_clear_and_is_renewed_batch_by_batch(
    redis_conn, monkeypatch
) -> None:
    open_deliveries(5)
    monkeypatch.setattr(maintenance, "BATCH_SIZE", 2)
    monkeypatch.setattr(maintenance, "REBUILD_LOCK_SECONDS", 1)
    key = get_scheduler().keys.rebuild_lock
    remaining_ms: list[int] = []

    def slow_progress(count: int) -> None:
        remaining_ms.append(redis_conn.pttl(key))
        time.sleep(0.6)  # three batches take longer than the lock's 1 s

    assert maintenance.rebuild_schedule(progress=slow_progress) == 5

    assert len(remaining_ms) == 3
    assert all(800 < ms <= 1000 for ms in remaining_ms), remaining_ms


def test_a_schedule_in_the_format_before_21_is_rebuilt_by_the_first_sweep(redis_conn) -> None:
    """Its tenant hashes counted leases (`i`), not everything of theirs (`n`): the scripts
    of today would drop such a hash too early, so the old epoch marker does not count."""
    open_deliveries(2)
    scheduler = get_scheduler()
    old_epoch = scheduler.keys.prefix + "epoch"
    redis_conn.set(old_epoch, new_ulid())  # all an older version left behind
    scheduler.enqueue([Item(new_ulid(), None, 1)])  # a stale entry, no row behind it

    assert scheduler.epoch() is None
    assert maintenance.sweep()["rebuilt"] == 2

    assert scheduler.snapshot().fresh_depth == 2  # the rows, not the stale entry
    assert scheduler.epoch() is not None
    assert not redis_conn.exists(old_epoch)

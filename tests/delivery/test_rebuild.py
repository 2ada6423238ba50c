"""Rebuilding the Redis schedule from the database, one rebuild at a time."""

import time
from collections import Counter

import pytest
import redis
from django.core.management import CommandError, call_command
from redis.backoff import NoBackoff
from redis.retry import Retry

from core.ids import new_ulid
from delivery.models import Delivery
from delivery.scheduler import Item, Scheduler, ShardedScheduler, access, get_scheduler, shard_index
from delivery.upkeep import maintenance
from delivery.upkeep.maintenance import RebuildInProgress
from ingest.publish import publish
from tenants.models import Tenant
from tests.factories import make_endpoint, make_tenant
from tests.private_redis import free_port
from tests.scheduler_helpers import check_invariants

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


@pytest.mark.django_db(transaction=True)
def test_with_a_shard_unreachable_only_its_deliveries_wait_and_it_is_rebuilt_on_return(
    redis_conn, monkeypatch
) -> None:
    """Shard 1 on a port where nothing listens: ingest flags only its deliveries, the
    sweeper leaves them flagged while it is away, and rebuilds that shard alone (without
    enqueueing anything twice) once it answers again."""
    dead = redis.Redis(port=free_port(), retry=Retry(NoBackoff(), 0))
    sharded = ShardedScheduler([Scheduler(redis_conn, shard=i) for i in range(3)])
    sharded.shards[1] = Scheduler(dead, shard=1)
    monkeypatch.setattr(access, "_scheduler", sharded)
    for shard in (sharded.shards[0], sharded.shards[2]):
        shard.start_epoch()
    tenant = make_tenant("acme")
    endpoints = []
    while {shard_index(e.pk, 3) for e in endpoints} != {0, 1, 2}:
        endpoints.append(make_endpoint(tenant))

    publish(tenant, "x", {})  # committed: enqueued on commit, one delivery per endpoint

    stranded = {d.id for d in Delivery.objects.all() if shard_index(d.endpoint_id, 3) == 1}
    assert 0 < len(stranded) < len(endpoints)
    flagged = Delivery.objects.filter(needs_schedule=True)
    assert set(flagged.values_list("id", flat=True)) == stranded
    assert maintenance.sweep()["flagged"] == 0  # still away: they stay flagged
    assert flagged.count() == len(stranded)

    sharded.shards[1] = Scheduler(redis_conn, shard=1)  # back, empty
    sharded._down_until = [0.0] * 3
    assert maintenance.sweep()["rebuilt"] == len(stranded)

    assert not flagged.exists()
    held = Counter()
    for shard in sharded.shards:
        held += check_invariants(shard)
    assert held == Counter(Delivery.objects.values_list("id", flat=True))  # each once


@pytest.mark.parametrize(
    ("old_epoch", "old_keys"),
    [
        # Before #21: tenant hashes counted leases (`i`), not everything of theirs (`n`).
        ("epoch", {"t:fb": {"f": 1, "i": 0, "w": 1}}),
        # Before scheduler v2: a hash per tenant and per endpoint, each with its count `n`.
        ("epoch:2", {"t:fb": {"f": 1, "n": 1, "w": 1}, "e:1": {"m": 8, "rm": 8, "n": 1}}),
        # Before adaptive limits: an endpoint's row was four doubles, not eight.
        ("epoch:3", {}),
    ],
)
def test_a_schedule_in_an_older_format_is_rebuilt_by_the_first_sweep(
    redis_conn, old_epoch, old_keys
) -> None:
    """The scripts of today would misread an older format's counts (and drop rows too
    early), so an older version's epoch marker does not count: the first sweep rebuilds,
    and nothing of the old format is left."""
    open_deliveries(2)
    scheduler = get_scheduler()
    prefix = scheduler.keys.prefix
    redis_conn.set(prefix + old_epoch, new_ulid())  # what an older version left behind
    for key, fields in old_keys.items():
        redis_conn.hset(prefix + key, mapping=fields)
    scheduler.enqueue([Item(new_ulid(), None, 1)])  # a stale entry, no row behind it

    assert scheduler.epoch() is None
    assert maintenance.sweep()["rebuilt"] == 2

    assert scheduler.snapshot().fresh_depth == 2  # the rows, not the stale entry
    assert scheduler.epoch() is not None
    assert not redis_conn.exists(prefix + old_epoch, *(prefix + key for key in old_keys))
    check_invariants(scheduler)


def test_rebuild_lanes_forgets_the_shards_named_and_refuses_those_in_use(redis_conn) -> None:
    """After SCHEDULER_SHARD or SCHEDULER_SHARDS changed, the old tags' schedules go too."""
    open_deliveries(2)
    old = Scheduler(redis_conn, shard=9)
    old.enqueue([Item(new_ulid(), None, 1)])
    assert list(redis_conn.scan_iter(match="wh:{9}:*"))
    in_use = get_scheduler().shards[0].shard

    with pytest.raises(CommandError, match="names shards in use"):
        call_command("rebuild_lanes", forget_shards=f"9,{in_use}")
    with pytest.raises(CommandError, match="comma-separated"):
        call_command("rebuild_lanes", forget_shards="nine")
    assert list(redis_conn.scan_iter(match="wh:{9}:*"))  # refused: nothing done

    call_command("rebuild_lanes", forget_shards="9")
    assert not list(redis_conn.scan_iter(match="wh:{9}:*"))
    assert get_scheduler().snapshot().fresh_depth == 2


@pytest.mark.django_db(transaction=True)
def test_a_rebuild_with_nothing_open_is_no_warning(caplog) -> None:
    get_scheduler().clear()

    with caplog.at_level("INFO", logger="delivery.upkeep.maintenance"):
        assert maintenance.rebuild_schedule() == 0

    assert [r.levelname for r in caplog.records] == ["INFO"]
    assert "no open deliveries" in caplog.records[0].getMessage()

    make_endpoint(make_tenant("acme"))
    publish(Tenant.objects.get(key="acme"), "x", {})
    get_scheduler().clear()
    caplog.clear()
    with caplog.at_level("INFO", logger="delivery.upkeep.maintenance"):
        assert maintenance.rebuild_schedule() == 1

    assert [r.levelname for r in caplog.records] == ["WARNING"]

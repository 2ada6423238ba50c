"""The platform with SCHEDULER_REDIS_URL on a Redis Cluster: ingest enqueues there,
workers deliver from it, a rebuild clears and refills it under its lock, and RQ's queues
and every other key stay on REDIS_URL."""

import pytest
from redis.cluster import RedisCluster

from core import redis_connection
from delivery.models import Delivery
from delivery.scheduler import get_scheduler, reset_scheduler
from delivery.upkeep import maintenance
from ingest.publish import publish
from tests.delivery_helpers import statuses, wait_until
from tests.factories import make_endpoint, make_tenant
from tests.http_receivers import Recorder


@pytest.fixture(params=[1, 3], ids=["one-shard", "three-shards"])
def on_cluster(request, settings, redis_cluster):
    redis_cluster.flush()
    settings.SCHEDULER_REDIS_URL = redis_cluster.url
    settings.SCHEDULER_SHARDS = request.param
    settings.ALLOW_PRIVATE_DESTINATIONS = True
    reset_scheduler()
    yield redis_cluster
    reset_scheduler()


def schedule_keys_on(client) -> list[bytes]:
    return [k for k in client.scan_iter(match="wh:{*") if not k.startswith(b"wh:test-")]


@pytest.mark.django_db(transaction=True)
def test_deliveries_go_through_the_cluster_and_the_plain_redis_holds_none(
    on_cluster, engine, redis_conn
) -> None:
    scheduler = get_scheduler()
    assert isinstance(scheduler.connection, RedisCluster)
    with Recorder() as receiver:
        tenant = make_tenant("acme")
        endpoints = []  # enough endpoints for every shard to have one
        while len({scheduler.shard_for(e.pk).shard for e in endpoints}) < len(scheduler.shards):
            endpoints.append(make_endpoint(tenant, f"{receiver.url}/hook{len(endpoints)}"))
            assert len(endpoints) < 50
        publish(tenant, "order.created", {"n": 1})  # one delivery per endpoint
        publish(tenant, "order.created", {"n": 2})
        total = 2 * len(endpoints)
        assert scheduler.snapshot().fresh_depth == total  # enqueued on commit, into the cluster
        engine()
        receiver.wait_for(total)
        assert wait_until(lambda: statuses() == {Delivery.Status.DELIVERED: total})

    assert scheduler.counters()["delivered"] == total
    assert scheduler.snapshot().in_flight == 0
    assert schedule_keys_on(scheduler.connection)  # the stats, at least
    assert schedule_keys_on(redis_conn) == []
    assert type(redis_connection.shared()) is not RedisCluster  # RQ's side


@pytest.mark.django_db
def test_a_rebuild_refills_the_cluster_under_its_lock(on_cluster) -> None:
    tenant = make_tenant("acme")
    make_endpoint(tenant)
    for n in range(3):
        publish(tenant, "x", {"n": n})  # rows only: this test's transaction never commits
    scheduler = get_scheduler()
    scheduler.start_epoch()
    on_cluster.flush()  # a cluster that lost the schedule

    assert maintenance.sweep()["rebuilt"] == 3

    assert scheduler.snapshot().fresh_depth == 3
    assert scheduler.epoch() is not None
    locks = [shard.keys.rebuild_lock for shard in scheduler.shards]
    assert not any(scheduler.connection.exists(lock) for lock in locks)  # released
    assert maintenance.rebuild_schedule() == 3  # a second rebuild clears the first: still 3
    assert scheduler.snapshot().fresh_depth == 3


@pytest.mark.django_db
def test_a_shard_that_lost_its_schedule_is_rebuilt_alone(on_cluster, settings) -> None:
    scheduler = get_scheduler()
    tenant = make_tenant("acme")
    endpoints = [make_endpoint(tenant) for _ in range(6)]
    publish(tenant, "x", {})  # rows only, one per endpoint
    maintenance.rebuild_schedule()
    lost = scheduler.shards[-1]
    keep = [shard for shard in scheduler.shards if shard is not lost]
    lost.clear()  # as a master that restarted empty: its keys and epoch are gone
    mine = sum(1 for e in endpoints if scheduler.shard_for(e.pk) is lost)
    others = {shard.shard: shard.epoch() for shard in keep}

    assert maintenance.sweep()["rebuilt"] == mine

    assert lost.snapshot().fresh_depth == mine and lost.epoch() is not None
    assert {shard.shard: shard.epoch() for shard in keep} == others  # not cleared again
    assert scheduler.snapshot().fresh_depth == len(endpoints)

"""The platform with SCHEDULER_REDIS_URL on a Redis Cluster: ingest enqueues there,
workers deliver from it, a rebuild clears and refills it under its lock, and RQ's queues
and every other key stay on REDIS_URL."""

import pytest
from redis.cluster import RedisCluster

from core import redis_connection
from delivery import maintenance
from delivery.enqueueing import get_scheduler, reset_scheduler
from delivery.models import Delivery
from ingest.publish import publish
from tests.delivery_helpers import statuses, wait_until
from tests.factories import make_endpoint, make_tenant
from tests.http_receivers import Recorder


@pytest.fixture
def on_cluster(settings, redis_cluster):
    redis_cluster.flush()
    settings.SCHEDULER_REDIS_URL = redis_cluster.url
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
        make_endpoint(tenant, receiver.url + "/hook")
        for n in range(5):
            publish(tenant, "order.created", {"n": n})
        assert scheduler.snapshot().fresh_depth == 5  # enqueued on commit, into the cluster
        engine()
        receiver.wait_for(5)
        assert wait_until(lambda: statuses() == {Delivery.Status.DELIVERED: 5})

    assert scheduler.counters()["delivered"] == 5
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
    assert not scheduler.connection.exists(scheduler.keys.rebuild_lock)  # released
    assert maintenance.rebuild_schedule() == 3  # a second rebuild clears the first: still 3
    assert scheduler.snapshot().fresh_depth == 3

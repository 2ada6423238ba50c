"""A Redis Cluster master killed mid-run, without a replica: the other shards go on
delivering while it is away, and once it is back (empty) the sweeper rebuilds its shard
from the database. Nothing is lost."""

from collections import Counter

import pytest
from django.db.models import Count

from delivery.models import Delivery
from delivery.scheduler import get_scheduler, reset_scheduler
from delivery.upkeep import maintenance
from ingest.publish import publish
from tests.delivery_helpers import statuses, wait_until
from tests.factories import make_endpoint, make_tenant
from tests.http_receivers import Recorder, Reply
from tests.redis_cluster import RedisCluster

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.chaos]
EVENTS = 40


@pytest.fixture
def own_cluster():
    """A cluster of this test's own: it kills a master, which the session's must keep."""
    cluster = RedisCluster()
    cluster.start()
    yield cluster
    cluster.stop()


def use_sharded(settings, cluster: RedisCluster):
    """Three shards on the cluster, one per master (tags 30, 31, 32), fast retries."""
    settings.SCHEDULER_REDIS_URL = cluster.url
    settings.SCHEDULER_SHARDS = 3
    settings.SCHEDULER_SHARD = 30
    settings.ALLOW_PRIVATE_DESTINATIONS = True
    settings.RETRY_SCHEDULE_SECONDS = [0.2] * 10
    settings.RETRY_JITTER = 0.0
    settings.LEASE_SECONDS = 3
    reset_scheduler()
    scheduler = get_scheduler()
    masters = {scheduler.connection.get_node_from_key(s.keys.stats).port for s in scheduler.shards}
    assert len(masters) == 3
    return scheduler


@pytest.fixture(autouse=True)
def _forget_the_scheduler():
    yield
    reset_scheduler()


def node_of(cluster: RedisCluster, scheduler, shard):
    port = scheduler.connection.get_node_from_key(shard.keys.stats).port
    (node,) = [node for node in cluster.nodes if node.port == port]
    return node


def publish_to_every_shard(scheduler, receiver):
    """Endpoints until every shard has one, and EVENTS events to each: (endpoints, total).
    Their caps are fixed and small, so each shard's work lasts past the kill (a limit
    that adapts could race through a shard's work before its master dies)."""
    tenant = make_tenant("acme")
    endpoints = []
    while len({scheduler.shard_for(e.pk).shard for e in endpoints}) < len(scheduler.shards):
        url = f"{receiver.url}hook{len(endpoints)}"
        endpoints.append(make_endpoint(tenant, url, max_in_flight=2))
    for n in range(EVENTS):
        publish(tenant, "order.created", {"n": n})
    return endpoints, EVENTS * len(endpoints)


def delivered_per_endpoint() -> Counter:
    rows = Delivery.objects.filter(status=Delivery.Status.DELIVERED).values("endpoint_id")
    return Counter({r["endpoint_id"]: r["n"] for r in rows.annotate(n=Count("id"))})


def test_a_master_killed_mid_run_loses_nothing_and_the_other_shards_keep_delivering(
    settings, own_cluster, engine
) -> None:
    scheduler = use_sharded(settings, own_cluster)
    scheduler.start_epoch()
    victim_shard = scheduler.shards[1]
    victim = node_of(own_cluster, scheduler, victim_shard)

    with Recorder(Reply(delay=0.01)) as receiver:
        endpoints, total = publish_to_every_shard(scheduler, receiver)
        survivors = [e.pk for e in endpoints if scheduler.shard_for(e.pk) is not victim_shard]
        engine(concurrency=8)
        assert wait_until(lambda: sum(delivered_per_endpoint().values()) >= total // 4, 60)

        victim.stop()  # no replica: its slots and the victim shard's schedule are gone
        # The other shards' endpoints get everything while it is away.
        assert wait_until(
            lambda: all(delivered_per_endpoint()[e] == EVENTS for e in survivors), 120
        ), delivered_per_endpoint()
        stranded = [e.pk for e in endpoints if e.pk not in survivors]
        done = delivered_per_endpoint()
        assert sum(done[e] for e in stranded) < EVENTS * len(stranded)  # it really stalled
        victim.restart()  # back with its slots, empty: the shard has no epoch
        own_cluster.wait_until_ok()

        # The sweeper (an RQ job every minute in production) rebuilds that shard alone.
        rebuilt = []

        def swept_and_all_delivered() -> bool:
            rebuilt.append(maintenance.sweep()["rebuilt"])
            return statuses() == {Delivery.Status.DELIVERED: total}

        assert wait_until(swept_and_all_delivered, 120, interval=0.5), statuses()
        arrived = {(r.path, r.headers["webhook-id"]) for r in receiver.requests}

    assert victim_shard.epoch() is not None
    assert 0 < rebuilt[0] <= EVENTS * len(stranded)  # the open ones of that shard alone
    lost = total - len(arrived)
    assert lost == 0  # every (endpoint, event) reached its receiver at least once


@pytest.fixture
def replicated_cluster():
    cluster = RedisCluster(replicas=1)
    cluster.start()
    yield cluster
    cluster.stop()


def test_with_a_replica_a_masters_failover_is_ridden_out_without_a_rebuild(
    settings, replicated_cluster, engine
) -> None:
    """The replica takes the dead master's slots; the cluster client follows (MOVED, a
    fresh slot map) and the workers go on: nothing lost, and no rebuild, since the
    replica has the schedule, epoch included."""
    cluster = replicated_cluster
    scheduler = use_sharded(settings, cluster)
    scheduler.start_epoch()
    victim_shard = scheduler.shards[1]
    victim = node_of(cluster, scheduler, victim_shard)
    epoch = victim_shard.epoch()

    with Recorder(Reply(delay=0.01)) as receiver:
        endpoints, total = publish_to_every_shard(scheduler, receiver)
        assert wait_until(cluster.in_sync, 30)  # the enqueues are on the replicas too
        engine(concurrency=8)
        assert wait_until(lambda: sum(delivered_per_endpoint().values()) >= total // 4, 60)

        victim.stop()
        on_victim = [e.pk for e in endpoints if scheduler.shard_for(e.pk) is victim_shard]
        done = delivered_per_endpoint()
        assert sum(done[e] for e in on_victim) < EVENTS * len(on_victim)  # work left on it
        everything = {Delivery.Status.DELIVERED: total}
        assert wait_until(lambda: statuses() == everything, 120), statuses()
        arrived = {(r.path, r.headers["webhook-id"]) for r in receiver.requests}

    assert len(arrived) == total  # none lost
    assert victim_shard.epoch() == epoch  # served by the promoted replica, never rebuilt
    promoted = victim_shard.connection.get_node_from_key(victim_shard.keys.stats)
    assert promoted.port != victim.port

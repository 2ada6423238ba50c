"""On a Redis Cluster, the schedule's shards should use as many masters as they can: a
process says when they crowd onto fewer, and which SCHEDULER_SHARD spreads them."""

import logging

import pytest

from core import redis_connection
from delivery.scheduler import ShardedScheduler
from delivery.scheduler.placement import crowding, masters_of, spreading_base


@pytest.fixture
def cluster_client(redis_cluster):
    client = redis_connection.connect(redis_cluster.url)
    yield client
    client.close()


def _bases(client, spread: bool) -> int:
    """The first three-shard base whose tags do (or do not) reach all three masters."""
    for base in range(1000):
        if (len(set(masters_of(client, range(base, base + 3)).values())) == 3) is spread:
            return base
    raise AssertionError("no such base in 1,000 tags")


def test_masters_of_names_the_master_each_shards_key_lives_on(cluster_client):
    for tag, master in masters_of(cluster_client, range(6)).items():
        cluster_client.set(f"wh:{{{tag}}}:placement-check", 1)
        node = cluster_client.get_node_from_key(f"wh:{{{tag}}}:placement-check")
        assert node.name == master
        assert node.redis_connection.get(f"wh:{{{tag}}}:placement-check") == b"1"
        cluster_client.delete(f"wh:{{{tag}}}:placement-check")


def test_crowded_shards_are_named_with_a_base_that_spreads_them(cluster_client):
    crowded = _bases(cluster_client, spread=False)
    problem = crowding(cluster_client, range(crowded, crowded + 3))
    assert problem is not None and "of the cluster's 3 masters" in problem
    suggested = spreading_base(cluster_client, 3, start=crowded)
    assert f"SCHEDULER_SHARD={suggested} spreads them" in problem
    # The old tags to forget, and not those the new shards use (the command refuses them).
    forget = set(range(crowded, crowded + 3)) - set(range(suggested, suggested + 3))
    assert problem.endswith(f"--forget-shards {','.join(map(str, sorted(forget)))}`.")
    assert len(set(masters_of(cluster_client, range(suggested, suggested + 3)).values())) == 3
    assert crowding(cluster_client, range(suggested, suggested + 3)) is None
    # Fewer shards than masters: each on a master of its own is as far as they spread.
    assert crowding(cluster_client, [suggested, suggested + 1]) is None


def test_a_process_warns_when_its_shards_crowd(cluster_client, settings, caplog):
    settings.SCHEDULER_SHARDS = 3
    for spread in (False, True):
        settings.SCHEDULER_SHARD = _bases(cluster_client, spread=spread)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="delivery.scheduler.placement"):
            ShardedScheduler.from_settings(cluster_client)
        warned = [r.getMessage() for r in caplog.records if "masters" in r.getMessage()]
        assert bool(warned) is not spread, warned


def test_one_server_has_nothing_to_spread(settings, caplog):
    settings.SCHEDULER_SHARDS = 3
    settings.SCHEDULER_SHARD = 0
    client = redis_connection.connect(settings.REDIS_URL)
    with caplog.at_level(logging.WARNING, logger="delivery.scheduler.placement"):
        ShardedScheduler.from_settings(client)
    assert not caplog.records
    client.close()

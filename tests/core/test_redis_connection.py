"""Which client a Redis URL gets: one server, or a Redis Cluster from its seed nodes."""

import pytest
import redis
from redis.cluster import RedisCluster

from core import redis_connection


def test_a_cluster_url_gets_a_cluster_client_that_reaches_every_master(redis_cluster):
    client = redis_connection.connect(redis_cluster.url + "?socket_timeout=2.5")
    try:
        assert isinstance(client, RedisCluster)
        assert len(client.get_primaries()) == len(redis_cluster.nodes)
        assert client.get_connection_kwargs()["socket_timeout"] == 2.5
        # Keys spread over all masters: the client follows the slot map.
        for i in range(30):
            client.set(f"wh:test-spread:{i}", i)
        assert all(node.client.dbsize() for node in redis_cluster.nodes)
        assert {int(client.get(f"wh:test-spread:{i}")) for i in range(30)} == set(range(30))
    finally:
        redis_cluster.flush()
        client.close()


def test_one_reachable_seed_is_enough(redis_cluster):
    first = redis_cluster.nodes[0].port
    client = redis_connection.connect(f"redis+cluster://127.0.0.1:1,127.0.0.1:{first}")
    try:
        assert len(client.get_primaries()) == len(redis_cluster.nodes)
    finally:
        client.close()


def test_a_plain_url_gets_a_plain_client(settings):
    client = redis_connection.connect(settings.REDIS_URL, socket_timeout=1.5)
    assert type(client) is redis.Redis
    assert client.get_connection_kwargs()["socket_timeout"] == 1.5


@pytest.mark.parametrize(
    "url",
    [
        "redis+cluster://",
        "redis+cluster://127.0.0.1",
        "redis+cluster://127.0.0.1:99999",
        "redis+cluster://127.0.0.1:7000/3",
        "redis+cluster://127.0.0.1:7000?db=2",
        "http://127.0.0.1:7000",
    ],
)
def test_bad_urls_are_refused_with_the_reason(url):
    with pytest.raises(ValueError, match=r"127\.0\.0\.1|seed|expected"):
        redis_connection.check_url(url)


def test_the_scheduler_uses_its_own_url_and_rq_keeps_redis_url(settings, redis_cluster):
    """SCHEDULER_REDIS_URL moves the schedule only; unset, it is REDIS_URL's client."""
    redis_connection.forget()
    try:
        assert redis_connection.scheduler() is redis_connection.shared()
        settings.SCHEDULER_REDIS_URL = redis_cluster.url
        assert isinstance(redis_connection.scheduler(), RedisCluster)
        assert type(redis_connection.shared()) is redis.Redis
    finally:
        redis_connection.forget()


def test_cluster_credentials_are_read_as_redis_py_reads_a_redis_url():
    url = "redis+cluster://app:p%40ss@10.0.0.1:7000,10.0.0.2:7000?socket_timeout=2"

    assert redis_connection.cluster_options(url) == {
        "username": "app",
        "password": "p@ss",
        "socket_timeout": 2.0,
    }
    assert [(n.host, n.port) for n in redis_connection.cluster_seeds(url)] == [
        ("10.0.0.1", 7000),
        ("10.0.0.2", 7000),
    ]
    assert redis_connection.cluster_options("redis+cluster://:secret@h:1") == {"password": "secret"}

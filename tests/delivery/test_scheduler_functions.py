"""The scheduler's Lua as one Redis Function library: loaded again by whichever call finds
it missing, on that node alone, and never carrying one call's state into the next."""

import pytest
import redis

from core import redis_connection
from delivery.scheduler import FRESH, Item, Scheduler, scripts
from tests.scheduler_helpers import batch, check_invariants, drain, has_functions


def library_names(client: redis.Redis) -> list[str]:
    return [
        entry[b"library_name"].decode() if isinstance(entry, dict) else entry[1].decode()
        for entry in client.function_list()
    ]


def test_a_server_that_lost_the_library_gets_it_again_on_the_next_call(redis_conn):
    sched = Scheduler(redis_conn)
    sched.enqueue(batch(1, 1, 3))
    assert scripts.library()[0] in library_names(redis_conn)

    redis_conn.function_flush()  # as a restart without persistence would leave it
    leases = drain(sched)

    assert len(leases) == 3
    assert scripts.library()[0] in library_names(redis_conn)
    check_invariants(sched)


def test_on_a_cluster_only_the_node_that_lost_the_library_is_loaded_again(redis_cluster):
    redis_cluster.flush()
    client = redis_connection.connect(redis_cluster.url)
    try:
        sched = Scheduler(client, shard=0)
        sched.enqueue(batch(1, 1, 2))
        holder = client.get_node_from_key(sched.keys.stats)
        own = next(node for node in redis_cluster.masters if node.port == holder.port)
        others = [node for node in redis_cluster.masters if node is not own]
        for node in redis_cluster.masters:
            node.client.function_flush()

        assert len(drain(sched)) == 2

        assert scripts.library()[0] in library_names(own.client)
        assert all(library_names(node.client) == [] for node in others)
    finally:
        client.close()


def test_a_call_that_failed_midway_leaves_nothing_to_the_next_one(scheduler_conn):
    """A Function's library keeps its top-level state between calls: each call must start
    from none (lib.lua's begin). Here an enqueue fails on its second tenant, after it
    counted the first as new and read both tenants' counts; the next enqueue must write
    only its own."""
    sched = Scheduler(scheduler_conn)
    lane = sched.keys.lane(2, 2, FRESH)
    scheduler_conn.set(lane, "not a list")
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        sched.enqueue([Item("01" + "A" * 24, 1, 1), Item("01" + "B" * 24, 2, 2)])
    scheduler_conn.delete(lane)

    sched.enqueue([Item("01" + "C" * 24, 3, 3)])

    stats = scheduler_conn.hgetall(sched.keys.stats)
    assert int(stats[b"tenants"]) == 1  # the failed call's tenants were never written
    assert int(stats[b"f"]) == 1
    assert scheduler_conn.hget(sched.keys.count, "t1") is None
    assert scheduler_conn.hget(sched.keys.count, "t2") is None
    assert int(scheduler_conn.hget(sched.keys.count, "t3")) == 1


def test_scripts_run_as_functions_where_the_server_has_them(scheduler_conn):
    sched = Scheduler(scheduler_conn)
    sched.enqueue(batch(1, 1, 1))

    assert sched._scripts["pick_fair"].server.has_functions == has_functions(scheduler_conn)
    assert len(drain(sched)) == 1

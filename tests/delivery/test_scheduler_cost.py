"""Redis work per delivery stays cut: every command the server runs (the scripts' own
redis.call()s included) for deliveries enqueued, picked, answered and acked in batches as
the engine does. On a redis-server of the test's own, so that nobody else's commands count
(bench/shards.py measures the same with a bigger mix, and the server's CPU)."""

import pytest
import redis

from core.ids import new_ulid
from delivery.scheduler import Item, Scheduler
from tests.private_redis import PrivateRedis
from tests.scheduler_helpers import assert_no_tenant_keys

TENANTS = 60
PER_TENANT = 20
# Before the first cut this mix took 44.1 commands per delivery; after it, 31.4, and
# after batching within a pick 26-27 (see docs/SCHEDULER.md, "Redis work per delivery").
# Some slack for ids that share a millisecond more or less often.
MAX_COMMANDS_PER_DELIVERY = 30
# The flood (one tenant, one endpoint, a backlog): 23.6 before batching within a pick,
# about 10 after (bench/shards.py --mix flood). The goal is 15.
MAX_FLOOD_COMMANDS_PER_DELIVERY = 15


@pytest.fixture
def private_redis(tmp_path):
    server = PrivateRedis(tmp_path)
    server.start()
    yield redis.Redis.from_url(server.url)
    server.stop()


def commands_run(conn: redis.Redis) -> int:
    stats = conn.info("commandstats")
    return sum(v["calls"] for k, v in stats.items() if k != "cmdstat_info")


def mix() -> list[Item]:
    """Tenants with one to three endpoints each (caps 1 to 8), interleaved by arrival."""
    per_tenant = [
        [
            Item(new_ulid(), t, t * 4 + i % (1 + t % 3), weight=1 + t % 2, max_in_flight=cap)
            for i in range(PER_TENANT)
        ]
        for t, cap in ((t, (1, 2, 8)[t % 3]) for t in range(TENANTS))
    ]
    return [item for column in zip(*per_tenant, strict=True) for item in column]


def flood() -> list[Item]:
    """One tenant's backlog to one endpoint, then a few quiet tenants to the same one."""
    loud = [Item(new_ulid(), 1, 1, max_in_flight=10_000) for _ in range(1_200)]
    return loud + [Item(new_ulid(), t, 1, max_in_flight=10_000) for t in range(2, 22)]


def commands_per_delivery(conn: redis.Redis, work: list[Item]) -> float:
    """Enqueue in batches, then pick, answer and ack 32 at a time, as the engine does."""
    sched = Scheduler(conn, shard=7)
    sched.enqueue(work[:1])  # the scripts load outside the count
    (lease,) = sched.pick("w").leases
    sched.ack([lease])
    before = commands_run(conn)
    for i in range(1, len(work), 100):
        sched.enqueue(work[i : i + 100])
    done = 0
    while leases := sched.pick("w", 32).leases:
        sched.answered(leases)
        sched.ack(leases, outcome="delivered")
        done += len(leases)
    assert done == len(work) - 1
    assert_no_tenant_keys(sched)
    return (commands_run(conn) - before) / done


def test_commands_per_delivery_stay_below_the_cut(private_redis):
    per_delivery = commands_per_delivery(private_redis, mix())
    assert per_delivery <= MAX_COMMANDS_PER_DELIVERY, per_delivery


def test_a_floods_backlog_costs_few_commands_per_delivery(private_redis):
    """A pick reads the flooding tenant's row, rotation and lane once and pops its lane
    in one go: most of a pick of 32 is one LPOP and one ZADD of leases."""
    per_delivery = commands_per_delivery(private_redis, flood())
    assert per_delivery <= MAX_FLOOD_COMMANDS_PER_DELIVERY, per_delivery


def writes_run(conn: redis.Redis) -> int:
    stats = conn.info("commandstats")
    written = ("cmdstat_hset", "cmdstat_hincrby", "cmdstat_zadd", "cmdstat_del", "cmdstat_rpush")
    return sum(stats.get(name, {}).get("calls", 0) for name in written)


def test_an_idle_workers_empty_picks_write_nothing(private_redis):
    """A worker with nothing to do polls: those picks read what they must and write
    nothing (the virtual clock, unchanged, is not written back)."""
    sched = Scheduler(private_redis, shard=7)
    sched.enqueue([Item(new_ulid(), 1, 1)])
    (lease,) = sched.pick("w").leases
    sched.ack([lease])
    before = writes_run(private_redis)
    for _ in range(5):
        assert sched.pick("w", 8).leases == []
    assert writes_run(private_redis) == before

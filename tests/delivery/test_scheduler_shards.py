"""The schedule split into shards by endpoint (ShardedScheduler), on one Redis and on the
test's Redis Cluster: each delivery in its endpoint's shard, every shard served, an
unreachable shard leaving the others working, snapshots and counters merged."""

import time
from collections import Counter

import pytest
import redis
from redis.backoff import NoBackoff
from redis.crc import key_slot
from redis.retry import Retry

from core import redis_connection
from delivery.scheduler import Scheduler, ShardedScheduler, ShardsUnavailable, shard_index
from tests.private_redis import free_port
from tests.scheduler_helpers import assert_no_tenant_keys, batch, check_invariants, drain

SHARDS = 3


def sharded(connection, shards: int = SHARDS, **options) -> ShardedScheduler:
    return ShardedScheduler([Scheduler(connection, shard=10 + i, **options) for i in range(shards)])


def endpoints_on(shard: int, count: int, shards: int = SHARDS) -> list[int]:
    """The first `count` endpoint ids that hash to `shard`."""
    return [e for e in range(1, 1000) if shard_index(e, shards) == shard][:count]


def test_the_shard_of_an_endpoint_is_stable_and_the_ids_spread_evenly():
    assert [shard_index(e, 3) for e in (1, 2, 3, 1000)] == [0, 2, 0, 2]  # frozen: a change
    # would move every endpoint to another shard without a rebuild
    spread = Counter(shard_index(e, 3) for e in range(1, 301))
    assert all(90 <= n <= 110 for n in spread.values()), spread
    assert all(0 <= shard_index(e, 7) < 7 for e in range(500))


def test_each_delivery_lives_in_its_endpoints_shard_and_a_drain_hands_all_out_once(
    scheduler_conn,
):
    sched = sharded(scheduler_conn)
    work = [item for e in range(1, 13) for item in batch(e % 4 or None, e, 5, max_in_flight=2)]
    sched.enqueue(work)

    for index, shard in enumerate(sched.shards):
        mine = [i.delivery_id for i in work if shard_index(i.endpoint_id, SHARDS) == index]
        assert sorted(check_invariants(shard)) == sorted(mine)
        # All of a shard's keys in one slot, so its scripts run on one cluster node.
        keys = {k for k in scheduler_conn.scan_iter(match=shard.keys.prefix + "*")}
        assert {key_slot(k) for k in keys} == {key_slot(shard.keys.stats.encode())}

    handed = drain(sched, max_items=7)
    assert Counter(lease.delivery_id for lease in handed) == Counter(i.delivery_id for i in work)
    for shard in sched.shards:
        assert_no_tenant_keys(shard)
    assert sched.counters()["done"] == len(work)


def test_picks_start_at_each_shard_in_turn_so_none_starves(scheduler_conn):
    sched = sharded(scheduler_conn)
    for index in range(SHARDS):  # every shard has more than a pick can take
        sched.enqueue([i for e in endpoints_on(index, 2) for i in batch(1, e, 30)])

    picks = []
    for _ in range(9):
        picks.append(sched.pick("w", max_items=3).leases)
        sched.ack(picks[-1])

    firsts = Counter(shard_index(leases[0].endpoint_id, SHARDS) for leases in picks)
    assert firsts == {0: 3, 1: 3, 2: 3}
    assert all(len(leases) == 3 for leases in picks)


def test_a_pick_fills_up_from_the_next_shards_when_the_first_runs_short(scheduler_conn):
    sched = sharded(scheduler_conn)
    (lonely,) = endpoints_on(0, 1)
    sched.enqueue(batch(1, lonely, 1) + batch(2, endpoints_on(2, 1)[0], 10, max_in_flight=9))

    leases = sched.pick("w", max_items=5).leases  # shard 0 first: it has one

    assert len(leases) == 5
    assert [lease.endpoint_id for lease in leases].count(lonely) == 1


def test_an_idle_sharded_pick_says_how_long_to_sleep_and_a_wake_up_on_any_shard_ends_it(
    scheduler_conn,
):
    sched = sharded(scheduler_conn)
    result = sched.pick("w", 4)
    assert (result.leases, result.wait_seconds) == ([], 5.0)

    sched.shards[2].enqueue(batch(1, endpoints_on(2, 1)[0], 1))  # pushes shard 2's wake-up
    started = time.monotonic()
    sched.wait(30)  # one BLPOP over all shards; on a cluster, one short poll at a time
    assert time.monotonic() - started < 10
    assert len(sched.pick("w", 4).leases) == 1


def test_acks_retries_renewals_and_answers_go_to_each_leases_shard(scheduler_conn):
    sched = sharded(scheduler_conn, lease_seconds=30)
    work = [i for index in range(SHARDS) for i in batch(1, endpoints_on(index, 1)[0], 2)]
    sched.enqueue(work)
    leases = drain_once(sched, 6)

    assert sched.renew(leases) == []
    assert sched.answered(leases) == 6
    assert sched.retry_later(leases[0], due_at=0)  # due at once: back in its retry lane
    assert sched.ack(leases[1:], outcome="delivered") == []
    assert sched.ack(leases[1:2]) == [leases[1].delivery_id]  # lost: acked already

    (again,) = sched.pick("w", 6).leases
    assert (again.delivery_id, again.lane) == (leases[0].delivery_id, "retry")
    assert sched.counters() == {"delivered": 5, "retry": 1}
    assert sched.snapshot().in_flight == 1


def test_retries_of_many_shards_go_one_call_per_shard_in_the_order_given(scheduler_conn):
    sched = sharded(scheduler_conn, lease_seconds=30)
    work = [i for index in range(SHARDS) for i in batch(1, endpoints_on(index, 1)[0], 1)]
    sched.enqueue(work)
    leases = drain_once(sched, SHARDS)
    sched.ack(leases[1:2])  # spent: reported as lost, in its place

    done = sched.retry_later_many([(lease, 0) for lease in reversed(leases)])

    assert done == [True] * (SHARDS - 2) + [False, True]
    again = sched.pick("w", SHARDS).leases
    assert sorted(lease.delivery_id for lease in again) == sorted(
        lease.delivery_id for lease in leases if lease != leases[1]
    )
    assert {lease.lane for lease in again} == {"retry"}


def drain_once(sched: ShardedScheduler, n: int):
    leases = sched.pick("w", n).leases
    assert len(leases) == n
    return leases


def test_operators_changes_reach_the_right_shards(scheduler_conn):
    sched = sharded(scheduler_conn)
    e0, e1 = endpoints_on(0, 1)[0], endpoints_on(1, 1)[0]
    sched.enqueue(batch(1, e0, 3) + batch(1, e1, 3) + batch(2, e1, 3))

    sched.set_tenant(1, weight=1, paused=True)  # tenant 1 has lanes on two shards
    assert {lease.tenant_id for lease in drain(sched)} == {2}

    sched.set_tenant(1, weight=1, paused=False)
    sched.set_endpoint(e0, max_in_flight=0, retry_max_in_flight=0)
    assert {lease.endpoint_id for lease in drain(sched)} == {e1}
    assert sched.shard_for(e0).snapshot().fresh_depth == 3


def test_the_merged_snapshot_adds_up_the_shards(scheduler_conn):
    sched = sharded(scheduler_conn)
    e0, e2 = endpoints_on(0, 1)[0], endpoints_on(2, 1)[0]
    caps = {"max_in_flight": 10}
    sched.enqueue(batch(1, e0, 4, **caps) + batch(1, e2, 6, **caps) + batch(None, e2, 2, **caps))
    sched.pick("w", 3)  # leases from shard 0 first: 3 of tenant 1's on e0

    snap = sched.snapshot(top_n=5)

    assert (snap.fresh_depth, snap.in_flight, snap.fallback_depth) == (9, 3, 2)
    assert snap.fallback_enqueued_total == 2
    (row,) = [row for row in snap.tenants if row.tenant_id == 1]  # one row for two shards
    assert (row.fresh, row.in_flight) == (7, 3)
    assert {row.endpoint_id for row in snap.endpoints} == {e0}  # only e0 has leases
    assert snap.backlogged_tenants == 3  # (tenant, shard) pairs: 1 on both, fallback on e2
    assert snap.active_tenants == 3


def test_an_unreachable_shard_leaves_the_others_working(scheduler_conn):
    """Shard 1 on a port where nothing listens: picks, acks and enqueues of the other
    shards go on; an enqueue says which deliveries did not reach their shard."""
    # No retries: redis-py's default backoff would make each refused call take seconds.
    dead = redis.Redis(port=free_port(), retry=Retry(NoBackoff(), 0))
    shards = [Scheduler(scheduler_conn, shard=10), Scheduler(dead, shard=11)]
    shards.append(Scheduler(scheduler_conn, shard=12))
    sched = ShardedScheduler(shards)
    work = [i for index in range(SHARDS) for i in batch(1, endpoints_on(index, 1)[0], 2)]

    with pytest.raises(ShardsUnavailable) as failed:
        sched.enqueue(work)
    stranded = [i.delivery_id for i in work if shard_index(i.endpoint_id, SHARDS) == 1]
    assert sorted(failed.value.pending) == sorted(stranded)

    handed = []
    for _ in range(4):
        leases = sched.pick("w", 2).leases
        handed += leases
        assert sched.ack(leases) == []
    assert len(handed) == 4
    assert {shard_index(lease.endpoint_id, SHARDS) for lease in handed} == {0, 2}

    all_dead = ShardedScheduler([Scheduler(dead, shard=10 + i) for i in range(SHARDS)])
    with pytest.raises(ShardsUnavailable):  # a RedisError: the engine backs off
        all_dead.pick("w", 2)


def test_a_sharded_scheduler_from_settings_takes_consecutive_tags(settings, scheduler_conn):
    settings.SCHEDULER_SHARD = 4
    settings.SCHEDULER_SHARDS = 3
    settings.SCHEDULER_TURN_SIZE = 2

    sched = ShardedScheduler.from_settings(scheduler_conn)

    assert [shard.shard for shard in sched.shards] == [4, 5, 6]
    assert {shard.turn_size for shard in sched.shards} == {2}
    assert sched.shards[1].keys.prefix == redis_connection.KEY_PREFIX + "{5}:"


def test_a_worker_may_pick_from_some_shards_only_and_still_acks_anywhere(scheduler_conn):
    everyone = sharded(scheduler_conn)
    only_two = ShardedScheduler(everyone.shards, pick_from=[2])
    e0, e2 = endpoints_on(0, 1)[0], endpoints_on(2, 1)[0]
    everyone.enqueue(batch(1, e0, 3, max_in_flight=9) + batch(1, e2, 3, max_in_flight=9))

    picked = [lease for _ in range(3) for lease in only_two.pick("w", 5).leases]
    assert {lease.endpoint_id for lease in picked} == {e2}
    assert len(picked) == 3

    mine = everyone.pick("w", 5).leases  # another worker's leases, on shard 0
    assert only_two.ack(mine) == [] and only_two.renew(picked) == []
    assert everyone.snapshot().in_flight == 3
    with pytest.raises(ValueError, match="does not exist"):
        ShardedScheduler(everyone.shards, pick_from=[3])

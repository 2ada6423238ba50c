"""Shards and the cluster client, side by side: the same enqueue and pick+ack loops on one
Scheduler and on a ShardedScheduler, on one Redis and on a Redis Cluster this script
starts (three masters, as the tests do). A script, not a test:

    .venv/bin/python bench/cluster.py [--redis-url redis://127.0.0.1:6379/] [--json PATH]

One process, one loop: this measures what sharding and the cluster client cost per
delivery, not what several Redis cores add (a two-core machine cannot show that). Rounds
alternate the setups; the figures are medians over rounds, and ratios are against
"redis, 1 shard" in the same run.
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import redis
from scheduler import WIDE_CAP, RoundTrips, connect  # bench/scheduler.py

from core import redis_connection
from core.ids import new_ulid
from delivery.scheduler import Item, Scheduler, ShardedScheduler, ShardsUnavailable
from tests.redis_cluster import RedisCluster

TENANTS, ENDPOINTS = 50, 30
FIRST_TAG = 30  # tags 30-32: clear of the other benches' shards


def setups(plain, cluster) -> dict:
    def sharded(conn, shards: int):
        if shards == 1:
            return Scheduler(conn, shard=FIRST_TAG)
        return ShardedScheduler([Scheduler(conn, shard=FIRST_TAG + i) for i in range(shards)])

    return {
        "redis, 1 shard": sharded(plain, 1),
        "redis, 3 shards": sharded(plain, 3),
        "cluster, 1 shard": sharded(cluster, 1),
        "cluster, 3 shards": sharded(cluster, 3),
    }


def work(n: int) -> list[Item]:
    return [Item(new_ulid(), i % TENANTS, i % ENDPOINTS, max_in_flight=WIDE_CAP) for i in range(n)]


def run(sched, n: int, batch: int, counter: RoundTrips) -> dict:
    items = work(n)
    started = time.perf_counter()
    for first in range(0, n, 100):
        sched.enqueue(items[first : first + 100])
    enqueue_s = time.perf_counter() - started
    before, done = counter.count, 0
    started = time.perf_counter()
    while done < n:
        leases = sched.pick("bench", batch).leases
        if not leases:
            raise RuntimeError("the schedule ran dry before every delivery was handed out")
        sched.ack(leases)
        done += len(leases)
    elapsed = time.perf_counter() - started
    return {
        "enqueue_per_s": n / enqueue_s,
        "pick_ack_per_s": n / elapsed,
        "round_trips_per_delivery": (counter.count - before) / n,
    }


def master_killed(cluster: RedisCluster, client, n: int) -> dict:
    """Three shards, one per master, drained by a pick(10)+ack loop; a third of the way in
    the master of shard 1 is killed (no replica). The loop keeps serving the other shards;
    then the master restarts empty and its shard is rebuilt from `open_items`, which plays
    the database's part (as maintenance.sweep does). Lost = enqueued but never acked."""
    sched = setups(client, client)["cluster, 3 shards"]
    for shard in sched.shards:
        shard.start_epoch()
    items = {item.delivery_id: item for item in work(n)}
    sched.enqueue(list(items.values()))
    victim_port = client.get_node_from_key(sched.shards[1].keys.stats).port
    (victim,) = [node for node in cluster.nodes if node.port == victim_port]
    acked: set[str] = set()
    handed = 0
    killed = restarted = False
    started = time.perf_counter()
    while len(acked) < n and time.perf_counter() - started < 120:
        if not killed and len(acked) >= n // 3:
            victim.stop()
            killed = True
        try:
            leases = sched.pick("bench", 10).leases
        except redis.RedisError:
            leases = []
        handed += len(leases)
        try:
            sched.ack(leases)
            acked.update(lease.delivery_id for lease in leases)
        except ShardsUnavailable as exc:
            failed = {lease.delivery_id for lease in exc.pending}
            acked.update(lease.delivery_id for lease in leases if lease.delivery_id not in failed)
        if killed and not restarted and not leases:  # the others are drained
            victim.restart()
            cluster.wait_until_ok()
            restarted = True
            sched._down_until = [0.0] * len(sched.shards)  # as after DOWN_SECONDS
            lost_shard = sched.shards[1]
            assert lost_shard.epoch() is None
            open_items = [items[i] for i in items if i not in acked]
            lost_shard.enqueue(
                [i for i in open_items if sched.shard_for(i.endpoint_id) is lost_shard]
            )
            lost_shard.start_epoch()
    return {
        "cluster_master_killed_lost": n - len(acked),
        "cluster_master_killed_handed_out_again": handed - len(acked),
        "cluster_master_killed_seconds": time.perf_counter() - started,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--deliveries", type=int, default=6000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    cluster = RedisCluster()
    cluster.start()
    try:
        plain = connect(args.redis_url)
        cluster_client = redis_connection.connect(cluster.url)
        counters = {"redis": RoundTrips(plain), "cluster": RoundTrips(cluster_client)}
        results: dict[str, dict[str, dict[str, list[float]]]] = {}
        for batch in (1, 10):
            rounds: dict[str, dict[str, list[float]]] = {}
            for _ in range(args.rounds):
                for name, sched in setups(plain, cluster_client).items():
                    measured = run(sched, args.deliveries, batch, counters[name.split(",")[0]])
                    for key, value in measured.items():
                        rounds.setdefault(name, {}).setdefault(key, []).append(value)
            results[f"pick_{batch}"] = rounds
        plain.flushdb()
        report(results, args)
        cluster.flush()
        killed = master_killed(cluster, cluster_client, args.deliveries)
        print(f"\nmaster killed mid-run: {killed}")
        if args.json:
            summary = json.loads(args.json.read_text())
            args.json.write_text(json.dumps(summary | killed, indent=2))
    finally:
        cluster.stop()


def report(results: dict, args: argparse.Namespace) -> None:
    summary: dict[str, dict[str, dict[str, float]]] = {}
    for shape, rounds in results.items():
        base = statistics.median(rounds["redis, 1 shard"]["pick_ack_per_s"])
        print(f"\n{shape} + ack ({args.deliveries} deliveries, {args.rounds} rounds, medians)")
        print(f"{'setup':20} {'enqueue/s':>10} {'pick+ack/s':>11} {'ratio':>6} {'trips/dlv':>9}")
        for name, figures in rounds.items():
            medians = {key: statistics.median(values) for key, values in figures.items()}
            medians["ratio_to_one_shard_redis"] = medians["pick_ack_per_s"] / base
            summary.setdefault(shape, {})[name] = medians
            print(
                f"{name:20} {medians['enqueue_per_s']:>10,.0f} {medians['pick_ack_per_s']:>11,.0f}"
                f" {medians['ratio_to_one_shard_redis']:>6.2f}"
                f" {medians['round_trips_per_delivery']:>9.2f}"
            )
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()

"""Scheduler benchmark: throughput vs raw Redis, round trips and memory per delivery, and
the one-tenant flood under fair and FIFO. A script, not a test:

    .venv/bin/python bench/scheduler.py [--redis-url redis://127.0.0.1:6379/] [--json PATH]

It uses one Redis database of its own, flushed only if empty or already the bench's: the
one the URL names, or else the first such among CANDIDATE_DBS.
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from core.ids import new_ulid
from delivery.scheduler import Item, Scheduler

MARKER = "wh:bench"
CANDIDATE_DBS = (14, 13, 6, 5, 4, 3, 2, 1)
WIDE_CAP = 10_000  # caps that never bind: these runs measure the scheduler, not endpoints


def connect(url: str) -> redis.Redis:
    """The database named in the URL, or else the first candidate that is empty or already
    the benchmark's (13 and 14 are the project's benchmark databases; others share them)."""
    parts = urlsplit(url)
    named = parts.path.strip("/")
    for db in [int(named)] if named else CANDIDATE_DBS:
        conn = redis.Redis.from_url(urlunsplit(parts._replace(path=f"/{db}")))
        if not conn.dbsize() or conn.exists(MARKER):
            conn.flushdb()
            conn.set(MARKER, "1")
            print(f"using Redis database {db}", file=sys.stderr)
            return conn
    sys.exit(f"no empty Redis database at {url}; pass --redis-url with one")


class RoundTrips:
    """Counts commands sent by one client (each EVALSHA, LPUSH... is one round trip)."""

    def __init__(self, conn: redis.Redis) -> None:
        self.count = 0
        real = conn.execute_command

        def counted(*args, **kwargs):
            self.count += 1
            return real(*args, **kwargs)

        conn.execute_command = counted


def items(n: int, tenants: int, endpoints: int = 1) -> list[Item]:
    return [
        Item(new_ulid(), i % tenants, (i // tenants) % endpoints, max_in_flight=WIDE_CAP)
        for i in range(n)
    ]


def rate(n: int, started: float) -> float:
    return n / (time.perf_counter() - started)


def raw_loop(conn: redis.Redis, n: int) -> float:
    ids = [new_ulid() for _ in range(n)]
    started = time.perf_counter()
    for delivery_id in ids:
        conn.lpush("bench:raw", delivery_id)
    for _ in ids:
        conn.rpop("bench:raw")
    return rate(2 * n, started)


def throughput(conn: redis.Redis, n: int) -> dict:
    """Single calls (one delivery per enqueue/pick/ack) and batched ones (100 per enqueue,
    10 per pick and ack), across 100 tenants x 5 endpoints."""
    sched = Scheduler(conn, shard=1)
    counter = RoundTrips(conn)
    out = {"raw_redis_ops_per_s": raw_loop(conn, n)}
    work = items(n, tenants=100, endpoints=5)
    sched.enqueue(work[:1])
    sched.ack(sched.pick("bench").leases)  # load the scripts outside the timings
    counter.count = 0
    started = time.perf_counter()
    for item in work:
        sched.enqueue([item])
    out["enqueue_per_s"] = rate(n, started)
    started = time.perf_counter()
    for _ in range(n):
        sched.ack(sched.pick("bench").leases)
    out["pick_ack_per_s"] = rate(n, started)
    out["round_trips_per_delivery"] = counter.count / n

    counter.count = 0
    started = time.perf_counter()
    for i in range(0, n, 100):
        sched.enqueue(work[i : i + 100])
    out["enqueue_batched_per_s"] = rate(n, started)
    started = time.perf_counter()
    for _ in range(n // 10):
        sched.ack(sched.pick("bench", max_items=10).leases)
    out["pick_ack_batched_per_s"] = rate(n, started)
    out["round_trips_per_delivery_batched"] = counter.count / n
    out["raw_over_pick_ack"] = out["raw_redis_ops_per_s"] / out["pick_ack_per_s"]
    out["raw_over_pick_ack_batched"] = out["raw_redis_ops_per_s"] / out["pick_ack_batched_per_s"]
    sched.clear()
    return out


def percentile(values: list[int], q: float) -> int:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def flood(conn: redis.Redis, mode: str, flood_size: int, quiet: int) -> dict:
    """One tenant enqueues flood_size deliveries, then `quiet` tenants one each, all to the
    same destination (the gateway case); dispatch everything and see where the quiet
    tenants' deliveries came out."""
    sched = Scheduler(conn, shard=2, mode=mode)
    sched.clear()
    loud = [Item(new_ulid(), 1, 1, max_in_flight=WIDE_CAP) for _ in range(flood_size)]
    for i in range(0, flood_size, 1000):
        sched.enqueue(loud[i : i + 1000])
    sched.enqueue([Item(new_ulid(), 1000 + t, 1, max_in_flight=WIDE_CAP) for t in range(quiet)])
    positions, dispatched = [], 0
    started = time.perf_counter()
    while leases := sched.pick("bench", max_items=100).leases:
        for lease in leases:
            dispatched += 1
            if lease.tenant_id != 1:
                positions.append(dispatched)
        sched.ack(leases)
    seconds = time.perf_counter() - started
    sched.clear()
    assert dispatched == flood_size + quiet and len(positions) == quiet
    return {
        "quiet_p50_position": percentile(positions, 0.50),
        "quiet_p99_position": percentile(positions, 0.99),
        "quiet_max_position": max(positions),
        "quiet_p99_laps": percentile(positions, 0.99) / (quiet + 1),
        "dispatch_per_s": dispatched / seconds,
    }


def used_memory(conn: redis.Redis) -> int:
    """used_memory once Redis has finished freeing what earlier runs UNLINKed."""
    while int(conn.info("memory")["lazyfree_pending_objects"]):
        time.sleep(0.05)
    return int(conn.info("memory")["used_memory"])


def memory(conn: redis.Redis, n: int, tenants: int, endpoints: int) -> dict:
    """Bytes per queued delivery two ways: the server's used_memory delta (includes
    allocator effects; noisy on a shared server) and MEMORY USAGE summed over the keys."""
    sched = Scheduler(conn, shard=3)
    work = items(n, tenants, endpoints)
    sched.enqueue(work[:1])  # the scripts and global keys are not per-delivery costs
    before = used_memory(conn)
    for i in range(1, n, 1000):
        sched.enqueue(work[i : i + 1000])
    delta = (used_memory(conn) - before) / (n - 1)
    keys = conn.scan_iter(match=sched.keys.prefix + "*", count=1000)
    summed = sum(conn.memory_usage(key, samples=0) or 0 for key in keys) / n
    sched.clear()
    return {"used_memory_delta": delta, "memory_usage_sum": summed}


def snapshot_cost(conn: redis.Redis, tenants: int) -> dict:
    """Many backlogged tenants (one delivery each): a snapshot must stay cheap."""
    sched = Scheduler(conn, shard=4)
    work = items(tenants, tenants, 1)
    for i in range(0, tenants, 1000):
        sched.enqueue(work[i : i + 1000])
    timings = []
    for _ in range(20):
        started = time.perf_counter()
        snap = sched.snapshot(top_n=20)
        timings.append(time.perf_counter() - started)
    sched.clear()
    assert snap.backlogged_tenants == tenants
    return {"tenants": tenants, "snapshot_ms_median": 1000 * statistics.median(timings)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/")
    parser.add_argument("--json", type=Path, help="write the results here (nested keys)")
    parser.add_argument("--n", type=int, default=10_000, help="deliveries per throughput run")
    parser.add_argument("--flood", type=int, default=100_000)
    parser.add_argument("--quiet", type=int, default=200)
    args = parser.parse_args()
    conn = connect(args.redis_url)

    # Medians of three rounds: the machine is shared, single rounds swing widely.
    rounds = [throughput(conn, args.n) for _ in range(3)]
    results = {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
    results["flood"] = {
        mode: flood(conn, mode, args.flood, args.quiet) for mode in ("fair", "fifo")
    }
    fair, fifo = results["flood"]["fair"], results["flood"]["fifo"]
    results["flood"]["fifo_over_fair_p99"] = fifo["quiet_p99_position"] / fair["quiet_p99_position"]
    results["memory"] = {
        "one_lane": memory(conn, args.flood, tenants=1, endpoints=1),
        "1000_tenants_x_5_endpoints": memory(conn, args.flood, tenants=1000, endpoints=5),
        "one_per_tenant": memory(conn, args.flood // 10, tenants=args.flood // 10, endpoints=1),
    }
    results["redis_bytes_per_delivery"] = results["memory"]["1000_tenants_x_5_endpoints"][
        "used_memory_delta"
    ]
    results["snapshot"] = snapshot_cost(conn, args.flood)
    conn.flushdb()

    print(json.dumps(results, indent=2))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()

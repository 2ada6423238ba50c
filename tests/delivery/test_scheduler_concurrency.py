"""Several processes enqueue, pick, ack and retry at once against one real Redis: every
delivery is handed out once per attempt and acked once, and no endpoint ever has more
requests in flight than its cap."""

import multiprocessing
import random
import time
from collections import Counter

from core import redis_connection
from core.ids import new_ulid
from delivery.scheduler import Item, Scheduler
from tests.scheduler_helpers import assert_no_tenant_keys, check_invariants

PRODUCERS, CONSUMERS = 2, 3
PER_PRODUCER, BATCH = 1500, 25
TENANTS = (*range(1, 13), None)
CAPS = {e: (1 + e % 3, 1 + e % 2) for e in range(8)}  # endpoint -> (max, retry max)


def produce(url: str, seed: int, results) -> None:
    sched = Scheduler(redis_connection.connect(url))
    rng = random.Random(seed)
    produced = []
    for _ in range(PER_PRODUCER // BATCH):
        items = []
        for _ in range(BATCH):
            e = rng.randrange(len(CAPS))
            items.append(Item(new_ulid(), rng.choice(TENANTS), e, 1, *CAPS[e]))
        sched.enqueue(items)
        produced += [item.delivery_id for item in items]
    results.put(("produced", produced))


def consume(url: str, seed: int, producers_done, results) -> None:
    """Hold each lease a moment, then ack it, or (a fifth of first attempts) retry it soon.
    Records (id, lane, endpoint, held from, held until) for every lease it held."""
    sched = Scheduler(redis_connection.connect(url))
    rng = random.Random(seed)
    held, acked = [], []
    while True:
        result = sched.pick(f"c{seed}", max_items=4)
        if not result.leases:
            snap = sched.snapshot(top_n=0, age_buckets=())
            busy = snap.fresh_depth + snap.retry_depth + snap.delayed_depth + snap.in_flight
            if producers_done.is_set() and busy == 0:
                break
            sched.wait(min(result.wait_seconds, 0.1) or 0.005)
            continue
        start = time.monotonic()
        time.sleep(rng.random() / 2000)
        done = []
        for lease in result.leases:
            held.append((lease.delivery_id, lease.lane, lease.endpoint_id, start))
            if lease.lane == "fresh" and rng.random() < 0.2:
                held[-1] += (time.monotonic(),)
                assert sched.retry_later(lease, time.time() + 0.02)
            else:
                done.append(lease)
        end = time.monotonic()
        held[-len(result.leases) :] = [
            h if len(h) == 5 else (*h, end) for h in held[-len(result.leases) :]
        ]
        assert sched.ack(done) == []
        acked += [lease.delivery_id for lease in done]
    results.put(("consumed", held, acked))


def max_overlap(intervals: list[tuple[float, float]]) -> int:
    events = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    level = peak = 0
    for _, step in events:
        level += step
        peak = max(peak, level)
    return peak


def test_processes_racing_hand_out_each_delivery_once_within_caps(
    scheduler_redis_url, scheduler_conn
):
    ctx = multiprocessing.get_context("fork")
    results, producers_done = ctx.Queue(), ctx.Event()
    url = scheduler_redis_url
    # Daemons: if the test fails (a consumer never sees the schedule empty), they end with
    # the session instead of holding its exit (their queue's feeder waits for a reader).
    producers = [
        ctx.Process(target=produce, args=(url, i, results), daemon=True) for i in range(PRODUCERS)
    ]
    consumers = [
        ctx.Process(target=consume, args=(url, 100 + i, producers_done, results), daemon=True)
        for i in range(CONSUMERS)
    ]
    for process in consumers + producers:
        process.start()

    produced, held, acked = [], [], []
    for _ in range(PRODUCERS):
        produced += results.get(timeout=30)[1]
    producers_done.set()
    for _ in range(CONSUMERS):
        _, their_held, their_acked = results.get(timeout=30)
        held += their_held
        acked += their_acked
    for process in consumers + producers:
        process.join(timeout=10)

    assert len(produced) == PRODUCERS * PER_PRODUCER
    assert Counter(acked) == Counter(produced), "a delivery was lost or acked twice"
    first_attempts = Counter(i for i, lane, *_ in held if lane == "fresh")
    assert first_attempts == Counter(produced), "a delivery was handed out twice"
    retried = {i for i, lane, *_ in held if lane == "retry"}
    assert len(retried) == sum(1 for i, lane, *_ in held if lane == "retry") > 0
    for e, (cap, retry_cap) in CAPS.items():
        mine = [(lane, start, end) for _, lane, le, start, end in held if le == e]
        assert max_overlap([(s, t) for _, s, t in mine]) <= cap
        assert max_overlap([(s, t) for lane, s, t in mine if lane == "retry"]) <= retry_cap
    sched = Scheduler(scheduler_conn)
    assert not check_invariants(sched)
    assert_no_tenant_keys(sched)

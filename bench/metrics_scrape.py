"""How much a /metrics scrape costs with many backlogged tenants. A script, not a test:

    .venv/bin/python bench/metrics_scrape.py [--tenants 100000] [--redis-url redis://127.0.0.1:6379/7]

It fills a Redis database of its own (it refuses one holding other data) with one queued
delivery for each of N tenants, then times full scrapes of the collector the web process
serves (Redis snapshot + counters + the database lookups for top-N labels and statuses,
and the status window's one pipelined round trip), against a
fresh SQLite database in a temporary folder.
"""

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tenants", type=int, default=100_000)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/7")
    parser.add_argument("--scrapes", type=int, default=20)
    args = parser.parse_args()

    tmp = tempfile.mkdtemp(prefix="bench-metrics-")
    os.environ.update(
        REDIS_URL=args.redis_url,
        DATABASE_URL=f"sqlite:///{tmp}/db.sqlite3",
        VAR_DIR=tmp,
        DJANGO_SETTINGS_MODULE="project.settings",
        LOG_LEVEL="WARNING",
    )
    import django

    django.setup()
    from django.core.management import call_command
    from prometheus_client import generate_latest
    from prometheus_client.registry import CollectorRegistry

    from core.ids import new_ulid
    from dashboards.metrics import ScheduleCollector
    from delivery.scheduler import Item, get_scheduler
    from tenants.models import Endpoint, Tenant

    call_command("migrate", verbosity=0)
    scheduler = get_scheduler()
    if scheduler.connection.dbsize() and not scheduler.connection.exists("wh:bench"):
        sys.exit(f"{args.redis_url} holds data; name an empty database with --redis-url")
    scheduler.connection.flushdb()
    scheduler.connection.set("wh:bench", "1")
    endpoint = Endpoint.objects.create(url="http://127.0.0.1:9/")
    Tenant.objects.bulk_create([Tenant(key=f"tenant-{i}") for i in range(1, 1001)])
    started = time.perf_counter()
    for start in range(0, args.tenants, 2000):
        stop = min(start + 2000, args.tenants)
        scheduler.enqueue(
            [Item(new_ulid(), tenant_id, endpoint.pk) for tenant_id in range(start + 1, stop + 1)]
        )
    print(f"enqueued {args.tenants} backlogged tenants in {time.perf_counter() - started:.1f}s")

    registry = CollectorRegistry()
    registry.register(ScheduleCollector())
    calls = 0
    real = scheduler.connection.execute_command

    def counting(*a, **k):
        nonlocal calls
        calls += 1
        return real(*a, **k)

    scheduler.connection.execute_command = counting
    real_pipeline = scheduler.connection.pipeline

    def counted_pipeline(*a, **k):  # a pipeline is one round trip, whatever it holds
        pipe = real_pipeline(*a, **k)
        run = pipe.execute

        def execute(*ea, **ek):
            nonlocal calls
            calls += 1
            return run(*ea, **ek)

        pipe.execute = execute
        return pipe

    scheduler.connection.pipeline = counted_pipeline
    timings, size = [], 0
    for _ in range(args.scrapes):
        t0 = time.perf_counter()
        size = len(generate_latest(registry))
        timings.append((time.perf_counter() - t0) * 1000)
    series = sum(
        1 for line in generate_latest(registry).decode().splitlines() if line.startswith("webhook_")
    )
    print(
        f"scrape with {args.tenants} backlogged tenants: p50 {statistics.median(timings):.1f} ms, "
        f"max {max(timings):.1f} ms; {calls // (args.scrapes + 1)} Redis round trips per scrape; "
        f"{series} webhook_* series; {size} bytes"
    )
    scheduler.connection.flushdb()


if __name__ == "__main__":
    main()

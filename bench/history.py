"""History that piles up (PostgreSQL): recording, pruning and the admin's lists with
millions of rows of history, against an empty database, in one run.

    .venv/bin/python bench/history.py --json                       # 10 million rows
    .venv/bin/python bench/history.py --rows 1000000 --reuse      # smaller; keep the load

Two databases, made here and migrated (their names end in _empty and _big; the base name
must contain "bench"): `big` gets --rows delivered deliveries (0.2% dead) of the last
--days days, each with its event and one attempt, by COPY into day partitions
(delivery.upkeep.partitions), then ANALYZE. Then, in this order:

* recording: the engine's batched UPDATE + attempt INSERT (delivery.pipeline.records.record_many,
  groups of 50, after delivery.pipeline.loading.load_many) of --record deliveries made just
  before, in each database in turn, --rounds times; `record_ratio_10m` = median
  deliveries/s with the history / median without;
* the admin's event, delivery and attempt lists, with their filters and searches, as an
  operator opens them (Django's test client, a superuser): best of 3 after a warm-up
  each; `admin_list_ms_10m` is the slowest page;
* the management API's lists and pages (an operator token), timed the same way, and a
  message page reached 20 cursors deep; `api_list_ms_10m` is the slowest;
* `prune_day_s`: retention (delivery.upkeep.retention.drop_partitions) dropping the oldest day
  of history, putting back its dead letters (kept 90 days): the seconds that took.

Each phase runs in its own process (`--phase`), pointed at one database.
"""

import argparse
import io
import json
import os
import random
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DEAD_EVERY = 500  # one dead letter in 500 deliveries
TENANTS = 1000
NULL = "\\N"  # COPY's text format
ENDPOINTS_PER_TENANT = 3


def _django(url: str) -> None:
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    import django

    django.setup()


def _run_phase(url: str, phase: str, *extra: str) -> dict:
    done = subprocess.run(
        [sys.executable, __file__, "--phase", phase, "--database-url", url, *extra],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(f"phase {phase} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _server(url: str) -> tuple[str, str]:
    base, _, name = url.rpartition("/")
    return base, name


def _recreate(url: str) -> None:
    import psycopg

    base, name = _server(url)
    with psycopg.connect(f"{base}/postgres", autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "-v0"],
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": url},
        check=True,
    )


def _exists_with_rows(url: str) -> int:
    import psycopg

    try:
        with psycopg.connect(url) as conn:
            return conn.execute("SELECT count(*) FROM delivery_delivery").fetchone()[0]
    except psycopg.Error:
        return 0


# --- phases (each in its own process, Django set up for one database) ----------------------


def phase_load(rows: int, days: int) -> dict:
    """Day partitions for the last `days` days, then `rows` of history by COPY."""
    from django.db import connection

    from core.ids import new_ulid
    from delivery.upkeep import partitions
    from tenants.models import Endpoint, Tenant

    today = datetime.now(UTC).date()
    with connection.cursor() as cursor:  # a fresh database: its partitions are empty
        for table in partitions.TABLES:
            for partition in partitions.partitions(table):
                if not partition.is_default:
                    cursor.execute(f'DROP TABLE "{partition.name}"')
    for offset in range(-days - 1, 8):
        partitions.create_day(today + timedelta(days=offset))

    tenants = Tenant.objects.bulk_create(
        [Tenant(key=f"tenant-{n}.example", name=f"tenant {n}") for n in range(TENANTS)]
    )
    endpoints = Endpoint.objects.bulk_create(
        [
            Endpoint(tenant=tenant, url=f"https://hooks.example/{tenant.key}/{n}")
            for tenant in tenants
            for n in range(ENDPOINTS_PER_TENANT)
        ]
    )
    start = datetime.combine(today - timedelta(days=days), datetime.min.time(), tzinfo=UTC)
    span_ms = days * 86_400_000
    start_ms = int(start.timestamp() * 1000)
    rng = random.Random(7)
    started = time.monotonic()
    chunk = 200_000
    raw = connection.connection  # psycopg's own connection, for COPY
    for first in range(0, rows, chunk):
        events, deliveries, attempts = io.StringIO(), io.StringIO(), io.StringIO()
        for n in range(first, min(rows, first + chunk)):
            at_ms = start_ms + n * span_ms // rows
            at = datetime.fromtimestamp(at_ms / 1000, UTC).isoformat()
            endpoint = endpoints[rng.randrange(len(endpoints))]
            event_id, delivery_id = new_ulid(at_ms), new_ulid(at_ms)
            dead = n % DEAD_EVERY == 0
            delivered_at = NULL if dead else at
            events.write(
                f"{event_id}\torders/paid\t{{}}\tapplication/json\t\\\\x7b7d\t{at}\t\\N\t\t"
                f"{endpoint.tenant_id}\t\\N\t\\N\n"
            )
            deliveries.write(
                f"{delivery_id}\t{'dead' if dead else 'delivered'}\tfresh\t1\t\\N\t{at}\t"
                f"{delivered_at}\t{'HTTP 410' if dead else ''}\tf\t{at}\t"
                f"{endpoint.pk}\t{event_id}\t{endpoint.tenant_id}\n"
            )
            attempts.write(
                f"{n + 1}\t1\t{at}\t42\t{410 if dead else 200}\t"
                f"{'failed' if dead else 'delivered'}\t\t\t{{}}\t{delivery_id}\t{endpoint.pk}\n"
            )
        with raw.cursor() as cursor:
            for table, columns, data in (
                (
                    "webhooks_event",
                    "id, event_type, headers, content_type, payload, received_at, "
                    "idempotency_key, fallback_reason, tenant_id, source_id, payload_pruned_at",
                    events,
                ),
                (
                    "delivery_delivery",
                    "id, status, lane, attempts, next_attempt_at, enqueued_at, delivered_at, "
                    "last_error, needs_schedule, updated_at, endpoint_id, event_id, tenant_id",
                    deliveries,
                ),
                (
                    "delivery_attempt",
                    "id, number, started_at, duration_ms, status_code, outcome, error, "
                    "response_excerpt, request_headers, delivery_id, endpoint_id",
                    attempts,
                ),
            ):
                with cursor.copy(f"COPY {table} ({columns}) FROM STDIN") as copy:
                    copy.write(data.getvalue())
        raw.commit()
        print(f"loaded {min(rows, first + chunk):,} rows", file=sys.stderr, flush=True)
    with connection.cursor() as cursor:
        cursor.execute("SELECT setval('delivery_attempt_id_seq', %s)", [rows + 1])
        cursor.execute("ANALYZE")
    return {"rows": rows, "load_s": round(time.monotonic() - started, 1)}


def phase_record(count: int) -> dict:
    """`count` pending deliveries made now, then recorded delivered in groups of 50."""
    from django.db import connection
    from django.utils import timezone

    from core import plain_insert
    from delivery.models import Delivery
    from delivery.pipeline import records
    from delivery.pipeline.loading import load_many
    from delivery.pipeline.policy import Action, Decision
    from delivery.pipeline.transport import HttpResult
    from ingest.accept import _deliveries_for
    from tenants.models import Endpoint, Tenant
    from webhooks.models import Event

    tenant, _ = Tenant.objects.get_or_create(key="record-bench.example")
    endpoint = Endpoint.objects.filter(tenant=tenant).first() or Endpoint.objects.create(
        tenant=tenant, url="https://hooks.example/record"
    )
    events = [Event(tenant=tenant, event_type="orders/paid", payload=b"{}") for _ in range(count)]
    deliveries = [d for event in events for d in _deliveries_for(event, [endpoint])]
    plain_insert.execute([plain_insert.prepare(events), plain_insert.prepare(deliveries)])
    ok = HttpResult(200, 5, "", "", "ok", None)
    delivered = Decision(Action.DELIVERED, 0.0, "", False)
    ids = [d.pk for d in deliveries]
    started = time.perf_counter()
    for first in range(0, len(ids), 50):
        loaded = load_many(ids[first : first + 50])
        records.record_many(
            [
                records.Sent(d, ok, delivered, timezone.now(), {"webhook-id": d.pk})
                for d in loaded.values()
            ]
        )
    seconds = time.perf_counter() - started
    done = Delivery.objects.filter(pk__in=ids, status=Delivery.Status.DELIVERED).count()
    assert done == count, (done, count)
    if connection.vendor == "postgresql":
        # What autovacuum does within its naptime (a minute) of so many new rows: the
        # phases after this one time pages, not a planner that believes today empty.
        with connection.cursor() as cursor:
            cursor.execute(f"ANALYZE {Delivery._meta.db_table}, {Event._meta.db_table}")
    return {"deliveries_per_s": round(count / seconds, 1)}


def _best_of(client: object, url: str) -> float:
    """A page's best time of 3 after a warm-up, ms; any answer but 200 stops the bench."""
    best = None
    for round_ in range(4):
        started = time.perf_counter()
        response = client.get(url)
        elapsed = (time.perf_counter() - started) * 1000
        if response.status_code != 200:
            raise SystemExit(f"{url}: HTTP {response.status_code} {response.content[:300]}")
        if round_ and (best is None or elapsed < best):
            best = elapsed
    return round(best, 1)


def phase_admin() -> dict:
    """The lists an operator opens, each timed: best of 3 after a warm-up."""
    from django.contrib.auth import get_user_model
    from django.test import Client

    from delivery.models import Delivery
    from webhooks.models import Event

    user_model = get_user_model()
    user = user_model.objects.filter(username="bench-admin").first()
    if user is None:
        user = user_model.objects.create_superuser("bench-admin", "a@example.com", "x")
    client = Client(HTTP_HOST="localhost")
    client.force_login(user)
    # A tenant of the loaded history (three endpoints, so an endpoint filter matches a
    # third of its events), not the record phase's (one endpoint).
    event = Event.objects.filter(tenant__key__startswith="tenant-").order_by("-id")[2000]
    delivery = Delivery.objects.filter(event=event).first()
    tenant_key = event.tenant.key
    pages = {
        "events": "/admin/webhooks/event/",
        "events_tenant": f"/admin/webhooks/event/?tenant_key={tenant_key}",
        "events_search_id": f"/admin/webhooks/event/?q={event.pk}",
        "events_page_50": "/admin/webhooks/event/?p=50",
        "deliveries": "/admin/delivery/delivery/",
        "deliveries_dead": "/admin/delivery/delivery/?status__exact=dead",
        "deliveries_tenant": f"/admin/delivery/delivery/?tenant_key={tenant_key}",
        "deliveries_search_id": f"/admin/delivery/delivery/?q={delivery.pk}",
        "attempts": "/admin/delivery/attempt/",
        "attempts_tenant": f"/admin/delivery/attempt/?tenant_key={tenant_key}",
        "attempts_search_delivery": f"/admin/delivery/attempt/?q={delivery.pk}",
        "delivery_page": f"/admin/delivery/delivery/{delivery.pk}/change/",
    }
    return {"pages_ms": {name: _best_of(client, url) for name, url in pages.items()}}


def phase_api() -> dict:
    """The management API's lists and pages as an operator's product calls them (an
    operator token): best of 3 after a warm-up, like the admin's, plus a page reached by
    walking cursors 20 pages deep (keyset: it must cost what the first does)."""
    from django.conf import settings
    from django.test import Client

    from delivery.models import Delivery
    from webhooks.models import ApiToken, Event

    if not os.environ.get("REDIS_URL"):
        # No Redis to count requests in (the bench starts none): timed without the budget.
        settings.API_RATE_LIMIT_PER_MINUTE = 0
    token = ApiToken.issue("bench-api")[1]
    client = Client(HTTP_HOST="localhost", HTTP_AUTHORIZATION=f"Bearer {token}")
    # A tenant of the loaded history (three endpoints, so an endpoint filter matches a
    # third of its events), not the record phase's (one endpoint).
    event = Event.objects.filter(tenant__key__startswith="tenant-").order_by("-id")[2000]
    delivery = Delivery.objects.filter(event=event).first()
    key, endpoint = event.tenant.key, delivery.endpoint_id
    base = f"/api/v1/tenants/{key}"
    dead = Delivery.objects.filter(status="dead").first()
    pages = {
        "tenants": "/api/v1/tenants",
        "endpoints": f"{base}/endpoints",
        "messages": f"{base}/messages",
        "messages_type": f"{base}/messages?event_type={event.event_type}",
        "messages_dead": f"{base}/messages?status=dead",
        "messages_endpoint": f"{base}/messages?endpoint={endpoint}",
        "messages_id": f"{base}/messages?id={event.pk}",
        "message": f"{base}/messages/{event.pk}",
        "attempts": f"{base}/endpoints/{endpoint}/attempts",
        "attempts_failed": f"{base}/endpoints/{endpoint}/attempts?outcome=failed",
        "delivery": f"{base}/deliveries/{delivery.pk}",
        "dead_letter": f"/api/v1/tenants/{dead.tenant.key}/deliveries/{dead.pk}",
        "replays": f"{base}/replays",
    }

    timings = {name: _best_of(client, url) for name, url in pages.items()}
    cursor = ""
    for _ in range(20):
        cursor = client.get(f"{base}/messages?limit=100&cursor={cursor}").json()["next_cursor"]
    timings["messages_page_21"] = _best_of(client, f"{base}/messages?limit=100&cursor={cursor}")
    return {"pages_ms": timings}


def phase_prune() -> dict:
    """Drop the oldest day of history, as the sweep's retention would on its day."""
    from django.conf import settings

    from core.ids import ulid_time_ms
    from delivery.upkeep import partitions, retention

    days = [p for p in partitions.partitions(partitions.EVENT) if not p.is_default]
    oldest = days[0]
    # The instant at which exactly the oldest day is past RETENTION_DAYS.
    end = datetime.fromtimestamp(ulid_time_ms(oldest.upper) / 1000, UTC)
    policy = retention.Policy.from_settings(
        end + timedelta(days=settings.RETENTION_DAYS, seconds=1)
    )
    result = retention.Result()
    started = time.perf_counter()
    retention.drop_partitions(policy, result, dry_run=False)
    seconds = time.perf_counter() - started
    assert result.counts["partition_days"] == 1, result.counts
    return {"prune_day_s": round(seconds, 3), "partition": oldest.name}


# --- the run ---------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--record", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--database-url", default="postgres://postgres@127.0.0.1:5432/bench_history"
    )
    parser.add_argument("--reuse", action="store_true", help="keep a big database already loaded")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--phase", choices=["load", "record", "admin", "api", "prune"])
    args = parser.parse_args()

    if args.phase:
        _django(args.database_url)
        result = {
            "load": lambda: phase_load(args.rows, args.days),
            "record": lambda: phase_record(args.record),
            "admin": phase_admin,
            "api": phase_api,
            "prune": phase_prune,
        }[args.phase]()
        print(json.dumps(result))
        return

    if "bench" not in args.database_url.rpartition("/")[2]:
        raise SystemExit("--database-url's database name must contain 'bench' (it is dropped)")
    empty, big = args.database_url + "_empty", args.database_url + "_big"
    _recreate(empty)
    loaded = _exists_with_rows(big) if args.reuse else 0
    if loaded < args.rows * 0.9:
        _recreate(big)
        load = _run_phase(big, "load", "--rows", str(args.rows), "--days", str(args.days))
        print(f"loaded {load['rows']:,} rows in {load['load_s']} s", file=sys.stderr)
    rates = {"empty": [], "big": []}
    for _ in range(args.rounds):
        for name, url in (("empty", empty), ("big", big)):
            rates[name].append(
                _run_phase(url, "record", "--record", str(args.record))["deliveries_per_s"]
            )
    admin = _run_phase(big, "admin")["pages_ms"]
    api = _run_phase(big, "api")["pages_ms"]
    prune = _run_phase(big, "prune")
    history = _exists_with_rows(big)
    result = {
        "history_rows": history,
        "record_per_s_empty": rates["empty"],
        "record_per_s_big": rates["big"],
        "record_ratio_10m": round(
            statistics.median(rates["big"]) / statistics.median(rates["empty"]), 3
        ),
        "admin_pages_ms": admin,
        "admin_list_ms_10m": max(admin.values()),
        "api_pages_ms": api,
        "api_list_ms_10m": max(api.values()),
        "prune_day_s": prune["prune_day_s"],
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"history rows: {history:,}")
    print(f"recording, deliveries/s: empty {rates['empty']}  with history {rates['big']}")
    print(f"record_ratio_10m {result['record_ratio_10m']}")
    for name, ms in admin.items():
        print(f"  admin {name:<26} {ms:8.1f} ms")
    print(f"admin_list_ms_10m {result['admin_list_ms_10m']}")
    for name, ms in api.items():
        print(f"  api {name:<28} {ms:8.1f} ms")
    print(f"api_list_ms_10m {result['api_list_ms_10m']}")
    print(f"prune_day_s {result['prune_day_s']} ({prune['partition']})")


if __name__ == "__main__":
    main()

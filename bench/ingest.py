"""Ingest and publish throughput of the production server, gunicorn, on this machine.

    .venv/bin/python bench/ingest.py                                  # SQLite in a temp dir
    .venv/bin/python bench/ingest.py --database-url postgres://postgres@127.0.0.1:5432/bench_ingest
    .venv/bin/python bench/ingest.py --rates 100,200,300 --duration 20 --json out.json
    .venv/bin/python bench/ingest.py --floor-rates 400,800,1200 --skip-batch   # with the floor
    .venv/bin/python bench/ingest.py --rates 200,400 --traced   # then again, traced

What it does:

1. A dedicated database: a fresh SQLite file in a temp dir, or the PostgreSQL database
   named by --database-url (its name must contain "bench"; created if missing, flushed).
   Migrated in a child process, then seeded: T tenants (shop-N.example), each with an
   endpoint, a Shopify-style source (`header:X-Shopify-Shop-Domain`, one shared
   destination, as in simulation/demo.py) and a publish API token (ApiToken.issue).
   On SQLite, the script holds one connection open for the whole run, as a deployment's
   delivery workers do (--no-hold-db to measure without: see docs/BENCHMARKS.md).
2. The Redis database --redis-url (default db 14) is flushed, only if it is empty or was
   last used by this script (a marker key says so).
3. gunicorn: `gunicorn project.wsgi -k gthread -w W --threads N -b 127.0.0.1:PORT`.
   No delivery worker runs: deliveries wait in Redis; this measures the ingest side.
4. (a) single events, open loop: for each offered rate R, signed Shopify-style POSTs are
   scheduled at fixed times (i / R) for D seconds by P client processes x C threads,
   each thread with a keep-alive connection. Latency is from the *scheduled* time to the
   end of the answer, so a server that falls behind is charged for the queueing it
   causes (no coordinated omission). Reported: acknowledged events/s (202s over the
   time from the first scheduled send to the last answer), p50/p99/max latency, errors.
   (b) the floor: the same open loop, same client processes and threads (the same
   concurrency), POSTing the same signed bodies to an unknown source: a 404 after one
   query, what the framework and one database round trip cost with nothing else.
   (c) the batch publish API: B clients send `{"events": [...]}` of S events each
   (each with an idempotency key) in a closed loop; reported: events/s over the wall
   time, per-request latency.
5. --traced: the same runs again on a second gunicorn with tracing on (core.tracing),
   exporting OTLP/HTTP to a stand-in collector on 127.0.0.1 (bench/otlp_sink.py);
   its summary is under "traced".
6. --json PATH writes single_per_s (acknowledged/s at the highest offered rate whose p99,
   and every lower rate's, is within --p99-goal-ms; else at the lowest rate),
   single_p99_ms (its p99), floor_404_per_s (the same rule over the 404 runs),
   single_to_floor (their ratio) and batch_events_per_s, plus every run's figures.

The clients run on the same 2 cores as gunicorn, Redis and the database: the CPU
columns (seconds of CPU per 1,000 events, for the server processes and the clients) say
where the time went.
"""

import argparse
import base64
import contextlib
import hashlib
import hmac
import http.client
import json
import multiprocessing
import os
import platform
import shutil
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.dedicated import clean_redis, prepare_database  # noqa: E402
from bench.otlp_sink import OtlpSink  # noqa: E402

REDIS_MARKER = "wh:bench-ingest"
SOURCE_SLUG = "shop"
FLOOR_SLUG = "no-such-source"  # the one-query 404
SOURCE_SECRET = "bench-shopify-secret"
P99_GOAL_MS = 250.0
BATCH_GOAL_PER_S = 5000.0


# --- setup ---------------------------------------------------------------------------------


# Migrating needs no metrics collector (an app's ready() may query tables a fresh database
# lacks), so it runs in a child with the collector registry disabled.
_MIGRATE = """
import django, prometheus_client
prometheus_client.REGISTRY.register = lambda collector: None
django.setup()
from django.core.management import call_command
call_command("migrate", verbosity=0)
call_command("flush", interactive=False, verbosity=0)
"""

_SEED = """
import json, sys
import django
django.setup()
from tenants.models import Endpoint, Tenant
from webhooks.models import ApiToken, Source, SourceSecret

tenants = int(sys.argv[1])
shared = Endpoint.objects.create(tenant=None, url="http://127.0.0.1:9/shared", max_in_flight=8)
for index in range(tenants):
    tenant = Tenant.objects.create(key=f"shop-{index}.example", name=f"Shop {index}")
    Endpoint.objects.create(tenant=tenant, url=f"http://127.0.0.1:9/t/{index}")
source = Source.objects.create(
    slug=sys.argv[2], name="Bench Shopify-style source", scheme=Source.SHOPIFY,
    fairness_key="header:X-Shopify-Shop-Domain", auto_register_tenants=True,
)
SourceSecret.objects.create(source=source, secret=sys.argv[3])
source.destinations.add(shared)
print(json.dumps({"token": ApiToken.issue("bench")[1]}))
"""


def base_env(database_url: str, redis_url: str, workdir: Path) -> dict:
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "project.settings",
        "DATABASE_URL": database_url,
        "REDIS_URL": redis_url,
        "VAR_DIR": str(workdir / "var"),
        "SECRET_KEY": "bench-" + uuid.uuid4().hex,
        "DEBUG": "false",
        "LOG_LEVEL": "WARNING",
    }


def prepare(opts, env: dict) -> str:
    subprocess.run([sys.executable, "-c", _MIGRATE], cwd=ROOT, env=env, check=True)
    seeded = subprocess.run(
        [sys.executable, "-c", _SEED, str(opts.tenants), SOURCE_SLUG, SOURCE_SECRET],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(seeded.stdout.strip().splitlines()[-1])["token"]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_server(opts, env: dict, workdir: Path) -> tuple[subprocess.Popen, int]:
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "gunicorn",
        "project.wsgi",
        "-k",
        "gthread",
        "-w",
        str(opts.workers),
        "--threads",
        str(opts.threads),
        "-b",
        f"127.0.0.1:{port}",
        "--log-level",
        "warning",
        "--backlog",
        "2048",
    ]
    log = (workdir / "gunicorn.log").open("wb")
    server = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=log)
    deadline = time.monotonic() + 60
    while True:
        if server.poll() is not None:
            sys.exit(f"gunicorn exited: {(workdir / 'gunicorn.log').read_text()[-3000:]}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", f"/ingest/{SOURCE_SLUG}/")
            if conn.getresponse().status == 405:
                conn.close()
                break
        except OSError:
            pass
        if time.monotonic() > deadline:
            sys.exit("gunicorn did not answer within 60 s")
        time.sleep(0.2)
    # One request per worker process so each has imported everything before timing starts.
    return server, port


def process_tree_cpu(pid: int) -> float:
    """CPU seconds of a process and its children (gunicorn's master and workers)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    pids = [pid]
    with contextlib.suppress(OSError):
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        pids += [int(child) for child in children]
    for one in pids:
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{one}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


# --- (a) single events, open loop ------------------------------------------------------------


def shopify_request(tenants: int, index: int) -> tuple[bytes, dict[str, str]]:
    shop = f"shop-{index % tenants}.example"
    body = json.dumps(
        {
            "id": index,
            "admin_graphql_api_id": f"gid://shopify/Order/{index}",
            "email": f"customer{index}@example.com",
            "created_at": "2026-01-01T00:00:00Z",
            "currency": "EUR",
            "total_price": f"{(index % 997) + 0.99:.2f}",
            "line_items": [
                {"id": index * 10 + n, "sku": f"SKU-{n}", "quantity": 1, "price": "9.99"}
                for n in range(3)
            ],
            "shop": shop,
        },
        separators=(",", ":"),
    ).encode()
    digest = hmac.new(SOURCE_SECRET.encode(), body, hashlib.sha256).digest()
    headers = {
        "Content-Type": "application/json",
        "X-Shopify-Hmac-Sha256": base64.b64encode(digest).decode(),
        "X-Shopify-Topic": "orders/create",
        "X-Shopify-Shop-Domain": shop,
        "X-Shopify-Event-Id": str(uuid.uuid4()),
        "X-Shopify-Webhook-Id": str(uuid.uuid4()),
        "X-Shopify-API-Version": "2025-10",
    }
    return body, headers


def open_loop_client(
    port: int,
    rate: float,
    duration: float,
    start_at: float,
    process_index: int,
    processes: int,
    threads: int,
    tenants: int,
    out: multiprocessing.Queue,
    slug: str = SOURCE_SLUG,
    expected: int = 202,
) -> None:
    """This process sends slots process_index, process_index + P, ... at start_at + i / rate."""
    total = int(rate * duration)
    slots = iter(range(process_index, total, processes))
    lock = threading.Lock()
    results: list[tuple[float, float, bool]] = []  # (scheduled, done, expected answer)
    cpu_start = time.process_time()

    def worker() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        while True:
            with lock:
                slot = next(slots, None)
            if slot is None:
                break
            body, headers = shopify_request(tenants, slot + 1_000_000 * process_index)
            scheduled = start_at + slot / rate
            delay = scheduled - time.time()
            if delay > 0:
                time.sleep(delay)
            status = 0
            for _ in range(2):  # one reconnect if the server closed an idle connection
                try:
                    conn.request("POST", f"/ingest/{slug}/", body=body, headers=headers)
                    response = conn.getresponse()
                    response.read()
                    status = response.status
                    break
                except (OSError, http.client.HTTPException):
                    conn.close()
                    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            results.append((scheduled, time.time(), status == expected))
        conn.close()

    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    out.put({"results": results, "cpu": time.process_time() - cpu_start})


def percentile(values: list[float], fraction: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def run_open_loop(
    opts, port: int, server_pid: int, rate: float, duration: float, *, floor: bool = False
) -> dict:
    """Single events at `rate`; with `floor`, to an unknown source (answered counts 404s)."""
    context = multiprocessing.get_context("fork")
    out = context.Queue()
    start_at = time.time() + 1.0
    clients = [
        context.Process(
            target=open_loop_client,
            args=(
                port,
                rate,
                duration,
                start_at,
                index,
                opts.client_processes,
                opts.client_threads,
                opts.tenants,
                out,
                FLOOR_SLUG if floor else SOURCE_SLUG,
                404 if floor else 202,
            ),
        )
        for index in range(opts.client_processes)
    ]
    cpu_before = process_tree_cpu(server_pid)
    for client in clients:
        client.start()
    parts = [out.get(timeout=duration + 120) for _ in clients]
    for client in clients:
        client.join()
    server_cpu = process_tree_cpu(server_pid) - cpu_before
    results = [one for part in parts for one in part["results"]]
    latencies = [(done - scheduled) * 1000 for scheduled, done, status in results]
    acked = sum(1 for _, _, expected in results if expected)
    errors = len(results) - acked
    first = min(scheduled for scheduled, _, _ in results)
    last = max(done for _, done, _ in results)
    return {
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "offered_per_s": rate,
        "sent": len(results),
        "acked": acked,
        "errors": errors,
        "acked_per_s": round(acked / (last - first), 1),
        "p50_ms": round(percentile(latencies, 0.50), 1),
        "p99_ms": round(percentile(latencies, 0.99), 1),
        "max_ms": round(max(latencies), 1),
        "server_cpu_s_per_1000": round(server_cpu / max(acked, 1) * 1000, 2),
        "client_cpu_s_per_1000": round(sum(p["cpu"] for p in parts) / max(acked, 1) * 1000, 2),
    }


# --- (c) the batch publish API ---------------------------------------------------------------


def batch_body(tenants: int, size: int, request_index: int, run_id: str) -> bytes:
    events = [
        {
            "tenant": f"shop-{(request_index * size + n) % tenants}.example",
            "event_type": "order.created",
            "idempotency_key": f"{run_id}-{request_index}-{n}",
            "payload": {
                "order": request_index * size + n,
                "total": "19.99",
                "currency": "EUR",
                "items": [{"sku": "SKU-1", "quantity": 2}],
            },
        }
        for n in range(size)
    ]
    return json.dumps({"events": events}, separators=(",", ":")).encode()


def run_batches(opts, port: int, server_pid: int, token: str) -> dict:
    run_id = uuid.uuid4().hex[:8]
    bodies = [
        batch_body(opts.tenants, opts.batch_size, index, run_id)
        for index in range(opts.batch_requests)
    ]
    queue = iter(range(len(bodies)))
    lock = threading.Lock()
    latencies: list[float] = []
    statuses: list[int] = []

    def worker() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token}"}
        while True:
            with lock:
                index = next(queue, None)
            if index is None:
                break
            started = time.time()
            conn.request("POST", "/api/v1/events", body=bodies[index], headers=headers)
            response = conn.getresponse()
            response.read()
            latencies.append((time.time() - started) * 1000)
            statuses.append(response.status)
        conn.close()

    cpu_before = process_tree_cpu(server_pid)
    started = time.time()
    pool = [threading.Thread(target=worker) for _ in range(opts.batch_clients)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    elapsed = time.time() - started
    server_cpu = process_tree_cpu(server_pid) - cpu_before
    accepted = sum(1 for status in statuses if status == 202) * opts.batch_size
    return {
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "batch_size": opts.batch_size,
        "requests": len(statuses),
        "errors": sum(1 for status in statuses if status != 202),
        "events": accepted,
        "events_per_s": round(accepted / elapsed, 1),
        "request_p50_ms": round(statistics.median(latencies), 1),
        "request_max_ms": round(max(latencies), 1),
        "server_cpu_s_per_1000": round(server_cpu / max(accepted, 1) * 1000, 3),
    }


# --- main ------------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--database-url", help="PostgreSQL database named *bench* (default: SQLite)"
    )
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/14")
    parser.add_argument("--workers", type=int, default=2, help="gunicorn worker processes")
    parser.add_argument("--threads", type=int, default=4, help="gunicorn threads per worker")
    parser.add_argument("--rates", default="100,200", help="offered single-event rates (/s)")
    parser.add_argument(
        "--floor-rates",
        default="",
        help="offered rates (/s) for the one-query 404 (floor_404_per_s); empty: not measured",
    )
    parser.add_argument("--duration", type=float, default=20.0, help="seconds per rate")
    parser.add_argument("--client-processes", type=int, default=2)
    parser.add_argument("--client-threads", type=int, default=32, help="per client process")
    parser.add_argument("--tenants", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=500)
    parser.add_argument("--batch-requests", type=int, default=40)
    parser.add_argument("--batch-clients", type=int, default=2)
    parser.add_argument("--p99-goal-ms", type=float, default=P99_GOAL_MS)
    parser.add_argument(
        "--no-hold-db",
        action="store_true",
        help="SQLite: do not hold a connection open (as a delivery worker would)",
    )
    parser.add_argument("--skip-single", action="store_true")
    parser.add_argument("--skip-batch", action="store_true")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument(
        "--traced",
        action="store_true",
        help="then the same with tracing on, exporting to a stand-in collector (bench/otlp_sink.py)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (logs, SQLite)")
    return parser.parse_args()


def best_within_goal(runs: list[dict], goal_ms: float) -> dict:
    """The highest offered rate that met the goal with every lower rate meeting it too
    (the lowest rate when none did)."""
    chosen = runs[0]
    for run in sorted(runs, key=lambda run: run["offered_per_s"]):
        if run["p99_ms"] > goal_ms or run["errors"]:
            break
        chosen = run
    return chosen


def summary(single: list[dict], floor: list[dict], batch: dict | None, goal_ms: float) -> dict:
    out: dict = {}
    for name, runs in (("single", single), ("floor_404", floor)):
        if runs:
            chosen = best_within_goal(runs, goal_ms)
            out[f"{name}_per_s"] = chosen["acked_per_s"]
            out[f"{name}_p99_ms"] = chosen["p99_ms"]
            out[f"{name}_offered_per_s"] = chosen["offered_per_s"]
    if single and floor:
        out["single_to_floor"] = round(out["single_per_s"] / out["floor_404_per_s"], 3)
    if batch:
        out["batch_events_per_s"] = batch["events_per_s"]
    return out


def measure(opts, env: dict, workdir: Path, token: str) -> tuple[list, list, dict | None]:
    """One gunicorn started with `env`: the single-event rates, the floor, the batches."""
    server, port = start_server(opts, env, workdir)
    print(
        f"gunicorn -k gthread -w {opts.workers} --threads {opts.threads} on port {port}",
        flush=True,
    )
    single: list[dict] = []
    floor: list[dict] = []
    batch = None
    try:
        if not opts.skip_single:
            run_open_loop(opts, port, server.pid, 50, 2)  # warm-up: imports, connections
            for rate in [float(rate) for rate in opts.rates.split(",") if rate.strip()]:
                result = run_open_loop(opts, port, server.pid, rate, opts.duration)
                single.append(result)
                print(json.dumps(result), flush=True)
        for rate in [float(rate) for rate in opts.floor_rates.split(",") if rate.strip()]:
            result = run_open_loop(opts, port, server.pid, rate, opts.duration, floor=True)
            floor.append(result)
            print(json.dumps({"floor_404": True, **result}), flush=True)
        if not opts.skip_batch:
            batch = run_batches(opts, port, server.pid, token)
            print(json.dumps(batch), flush=True)
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(10)
    return single, floor, batch


def main() -> None:
    opts = parse_args()
    load_at_start = round(os.getloadavg()[0], 2)
    workdir = Path(tempfile.mkdtemp(prefix="ingest-bench-"))
    (workdir / "var").mkdir()
    database_url = prepare_database(opts.database_url, workdir)
    clean_redis(opts.redis_url, REDIS_MARKER).close()
    env = base_env(database_url, opts.redis_url, workdir)
    print(f"database {database_url.split('@')[-1]}, redis {opts.redis_url}", flush=True)
    token = prepare(opts, env)
    keeper = None
    if database_url.startswith("sqlite") and not opts.no_hold_db:
        # A deployment runs delivery workers, whose threads keep the database open. Without
        # any other connection, the web process's per-request connection (CONN_MAX_AGE is 0
        # for SQLite) is the last one to close, and SQLite then checkpoints and deletes the
        # WAL on every request: that is not the production shape, so hold one open.
        keeper = sqlite3.connect(database_url.removeprefix("sqlite:///"))
        keeper.execute("SELECT count(*) FROM sqlite_master").fetchone()
    single, floor, batch = measure(opts, env, workdir, token)
    traced = None
    if opts.traced:
        with OtlpSink() as sink:
            print("the same, traced (OTLP/HTTP to a stand-in collector on 127.0.0.1)", flush=True)
            traced_single, traced_floor, traced_batch = measure(
                opts, {**env, **sink.env}, workdir, token
            )
            traced = summary(traced_single, traced_floor, traced_batch, opts.p99_goal_ms)
            traced.update(single=traced_single, batch=traced_batch, exports=sink.received[0])
    results = {
        **summary(single, floor, batch, opts.p99_goal_ms),
        "goals": {"single_p99_ms": opts.p99_goal_ms, "batch_events_per_s": BATCH_GOAL_PER_S},
        "single": single,
        "floor_404": floor,
        "batch": batch,
        "traced": traced,
        "server": f"gunicorn -k gthread -w {opts.workers} --threads {opts.threads}",
        "database": "postgresql" if database_url.startswith("postgres") else "sqlite",
        "sqlite_held_open": keeper is not None,
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_avg_1m_at_start": load_at_start,
            "load_avg_1m_at_end": round(os.getloadavg()[0], 2),
        },
    }
    print(
        json.dumps(
            {
                key: results[key]
                for key in results
                if key not in ("single", "floor_404", "batch", "traced")
            }
        )
    )
    if opts.json:
        Path(opts.json).write_text(json.dumps(results, indent=2) + "\n")
    clean_redis(opts.redis_url, REDIS_MARKER).close()
    if keeper is not None:
        keeper.close()
    if opts.keep:
        print(f"kept {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()

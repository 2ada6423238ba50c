"""CPU per request of ingest and publish, in one process, side by side across checkouts.

    .venv/bin/python bench/ingest_cpu.py --database-url postgres://postgres@127.0.0.1:5432/bench_ingest
    .venv/bin/python bench/ingest_cpu.py --database-url ... --trees /tmp/base,. --rounds 3
    .venv/bin/python bench/ingest_cpu.py --database-url ... --trees /tmp/base,. --traced

bench/ingest.py measures throughput under gunicorn, which on a shared 2-core machine
swings with the neighbours. This measures what a change does to the cost of one request,
which the neighbours disturb much less: CPU seconds, not wall time. Each round runs, for
every checkout in --trees in turn (alternating, so a busy moment hits both), a child
process that calls `project.wsgi.application` directly (the production WSGI application,
middleware included, no HTTP) serially for:

- `accepted`: signed Shopify-style POSTs to /ingest/shop/ (202),
- `floor_404`: the same POSTs to an unknown source (404 after one query),
- `batch`: publish API requests of --batch-size events (202), per event,

and reports per request (per event for batches): the child's Python CPU, the CPU of its
PostgreSQL backend (from /proc/<pg_backend_pid()>/stat; PostgreSQL on this machine only)
and wall time. The database is seeded by bench/ingest.py's set-up (a database named *bench*).

--traced adds, for the last checkout, a child with tracing on (core.tracing), exporting
OTLP/HTTP to a stand-in collector on 127.0.0.1 (bench/otlp_sink.py): the cost of tracing
every request, span encoding and export included.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.dedicated import clean_redis, prepare_database  # noqa: E402
from bench.ingest import REDIS_MARKER, base_env, prepare  # noqa: E402
from bench.otlp_sink import OtlpSink  # noqa: E402

# Runs in the checkout under test (its cwd), so its code is measured.
_CHILD = r"""
import base64, hashlib, hmac, io, json, logging, os, sys, time, uuid
from pathlib import Path
sys.path.insert(0, os.getcwd())
from project.wsgi import application
from django.db import connection
logging.disable(logging.WARNING)  # a 404 logs a warning per request
requests, batches, size, token = (int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]),
                                  sys.argv[4])

def call(path, body, headers):
    environ = {"REQUEST_METHOD": "POST", "PATH_INFO": path, "SERVER_NAME": "127.0.0.1",
               "SERVER_PORT": "80", "HTTP_HOST": "127.0.0.1", "SERVER_PROTOCOL": "HTTP/1.1",
               "CONTENT_LENGTH": str(len(body)), "CONTENT_TYPE": "application/json",
               "wsgi.input": io.BytesIO(body), "wsgi.url_scheme": "http",
               "wsgi.errors": sys.stderr, **headers}
    answer = []
    b"".join(application(environ, lambda status, *_: answer.append(int(status[:3]))))
    return answer[0]

def signed(index):
    shop = f"shop-{index % 5}.example"
    body = json.dumps({"id": index, "email": f"c{index}@example.com", "shop": shop,
                       "line_items": [{"id": n, "sku": "S", "price": "9.99"} for n in range(3)]})
    digest = hmac.new(b"bench-shopify-secret", body.encode(), hashlib.sha256).digest()
    return body.encode(), {"HTTP_X_SHOPIFY_HMAC_SHA256": base64.b64encode(digest).decode(),
        "HTTP_X_SHOPIFY_TOPIC": "orders/create", "HTTP_X_SHOPIFY_SHOP_DOMAIN": shop,
        "HTTP_X_SHOPIFY_EVENT_ID": str(uuid.uuid4())}

def batch(index):
    events = [{"tenant": f"shop-{n % 5}.example", "event_type": "order.created",
               "idempotency_key": uuid.uuid4().hex, "payload": {"order": n, "total": "19.99"}}
              for n in range(size)]
    return json.dumps({"events": events}).encode(), {"HTTP_AUTHORIZATION": f"Bearer {token}"}

for index in range(20):  # warm-up: imports, connections, caches
    assert call("/ingest/shop/", *signed(index)) == 202
backend = None
if connection.vendor == "postgresql":
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        backend = Path(f"/proc/{cursor.fetchone()[0]}/stat")

def db_cpu():
    if backend is None or not backend.exists():
        return float("nan")
    fields = backend.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

results = {}
for name, path, make, count, per, status in (
    ("accepted", "/ingest/shop/", signed, requests, 1, 202),
    ("floor_404", "/ingest/no-such-source/", signed, requests, 1, 404),
    ("batch", "/api/v1/events", batch, batches, size, 202),
):
    bodies = [make(10_000 + index) for index in range(count)]
    db0, cpu0, wall0 = db_cpu(), time.process_time(), time.perf_counter()
    for body, headers in bodies:
        assert call(path, body, headers) == status
    units = count * per
    results[name] = {
        "python_cpu_ms": round((time.process_time() - cpu0) / units * 1000, 3),
        "db_cpu_ms": round((db_cpu() - db0) / units * 1000, 3),
        "wall_ms": round((time.perf_counter() - wall0) / units * 1000, 3),
    }
print(json.dumps(results))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--database-url", help="PostgreSQL database named *bench* (default: SQLite)"
    )
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/14")
    parser.add_argument("--trees", default=".", help="checkouts to compare, comma-separated")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=500, help="single requests per kind")
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=500)
    parser.add_argument("--tenants", type=int, default=5)
    parser.add_argument(
        "--traced", action="store_true", help="also the last checkout with tracing on"
    )
    opts = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="ingest-cpu-"))
    (workdir / "var").mkdir()
    database_url = prepare_database(opts.database_url, workdir)
    clean_redis(opts.redis_url, REDIS_MARKER).close()
    env = {
        **base_env(database_url, opts.redis_url, workdir),
        "ALLOWED_HOSTS": "127.0.0.1",
        # The child reads its PostgreSQL backend's CPU from /proc/<pid>: with the default
        # 60 s the request cycle replaced the connection during long runs, and the batch's
        # database CPU read NaN (its first backend was gone).
        "DB_CONN_MAX_AGE": "86400",
    }
    token = prepare(opts, env)
    trees = [str(Path(tree).resolve()) for tree in opts.trees.split(",")]
    labels = [*trees, *([f"{trees[-1]} traced"] if opts.traced else [])]
    runs: dict[str, list[dict]] = {label: [] for label in labels}
    with OtlpSink() as sink:
        for round_number in range(1, opts.rounds + 1):
            for label in labels:
                tree, traced = label.removesuffix(" traced"), label.endswith(" traced")
                args = [str(opts.requests), str(opts.batches), str(opts.batch_size), token]
                child = subprocess.run(
                    [sys.executable, "-c", _CHILD, *args],
                    cwd=tree,
                    env={**env, **(sink.env if traced else {})},
                    check=True,
                    capture_output=True,
                    text=True,
                )
                result = json.loads(child.stdout.strip().splitlines()[-1])
                runs[label].append(result)
                load = round(os.getloadavg()[0], 2)
                print(json.dumps({"tree": label, "round": round_number, "load_1m": load, **result}))
        if opts.traced:
            exports, size = sink.received
            print(f"the collector stand-in took {exports} exports, {size / 1e6:.1f} MB")
    clean_redis(opts.redis_url, REDIS_MARKER).close()
    print("\nmedian per request (batch: per event), ms of CPU: python + database")
    for tree, results in runs.items():
        cells = []
        for kind in ("accepted", "floor_404", "batch"):
            python = sorted(run[kind]["python_cpu_ms"] for run in results)[len(results) // 2]
            db = sorted(run[kind]["db_cpu_ms"] for run in results)[len(results) // 2]
            cells.append(f"{kind} {python:.3f} + {db:.3f}")
        print(f"{tree}: " + "; ".join(cells))


if __name__ == "__main__":
    main()

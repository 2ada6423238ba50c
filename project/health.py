"""/healthz and /readyz, answered before Django's middleware (project.machine_doors): a
probe every second from a load balancer or an orchestrator costs a few microseconds, is
never refused for its Host header (probes use the node's address), and no secret is in
the answer.

/healthz: the process is alive and serving; it reads nothing.
/readyz: the database answers and its migrations are applied, Redis answers, and the
schedule (SCHEDULER_REDIS_URL's, or Redis's) is built, each within
READINESS_TIMEOUT_SECONDS (Redis by its socket timeouts, PostgreSQL
by a statement timeout; a database host that does not answer at all waits for the
connection's own `connect_timeout`, which DATABASE_URL can set); otherwise 503 naming
what failed. It also
says how many delivery workers beat (delivery/worker/heartbeats.py), without failing on
none: a web process can take events while no worker runs (they wait, nothing is lost).
"""

import json
import time
from collections.abc import Callable, Iterable

import redis
from django.conf import settings
from django.db import DatabaseError, close_old_connections, connection
from django.db.migrations.executor import MigrationExecutor

from core import redis_connection
from delivery.scheduler import keys
from delivery.worker import heartbeats

PATHS = ("/healthz", "/readyz")
_migrated = False  # once true, true for the life of the process (code and schema match)
_probe_clients: dict[str, object] = {}


def _probe_client(url: str) -> object:
    """A client of its own with the readiness deadline as its timeouts: the shared ones
    wait REDIS_SOCKET_TIMEOUT, longer than a probe should."""
    if url not in _probe_clients:
        deadline = settings.READINESS_TIMEOUT_SECONDS
        _probe_clients[url] = redis_connection.connect(
            url, socket_timeout=deadline, socket_connect_timeout=deadline
        )
    return _probe_clients[url]


def _database() -> str | None:
    global _migrated
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            timeout_ms = int(settings.READINESS_TIMEOUT_SECONDS * 1000)
            cursor.execute("SET statement_timeout = %s", [timeout_ms])
        cursor.execute("SELECT 1")
        if connection.vendor == "postgresql":
            cursor.execute("SET statement_timeout = 0")
    if not _migrated:
        executor = MigrationExecutor(connection)
        if executor.migration_plan(executor.loader.graph.leaf_nodes()):
            return "migrations not applied (run `manage.py migrate`)"
        _migrated = True
    return None


def _redis(url: str) -> str | None:
    _probe_client(url).ping()
    return None


def _schedule() -> str | None:
    """Every shard's schedule is built (its epoch is set). A new Redis has none until the
    first delivery worker builds it from the database, and one that lost it none until
    the sweep rebuilds it: traffic meanwhile would race the build (an event enqueued
    while it runs can be handed out twice), so the web process waits, not ready."""
    client = _probe_client(getattr(settings, "SCHEDULER_REDIS_URL", "") or settings.REDIS_URL)
    first = settings.SCHEDULER_SHARD
    missing = [
        tag
        for tag in range(first, first + settings.SCHEDULER_SHARDS)
        if client.get(keys.Keys(tag).epoch) is None
    ]
    if missing:
        return (
            f"schedule not built yet (shards {missing}): a delivery worker builds it from the "
            "database when it starts, and the sweep after a Redis loss"
        )
    return None


def _checks() -> dict[str, Callable[[], str | None]]:
    return {
        "database": _database,
        "redis": lambda: _redis(settings.REDIS_URL),
        "schedule": _schedule,
    }


def readiness() -> tuple[int, dict]:
    """(status, body): 200 when every check passed, else 503 with each failure's reason."""
    results: dict[str, dict] = {}
    for name, check in _checks().items():
        started = time.perf_counter()
        try:
            problem = check()
        except (DatabaseError, redis.RedisError, OSError) as exc:
            problem = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
        elapsed_ms = round((time.perf_counter() - started) * 1000, 1)
        results[name] = {"ok": problem is None, "ms": elapsed_ms}
        if problem:
            results[name]["error"] = problem
    ready = all(result["ok"] for result in results.values())
    body: dict = {"status": "ready" if ready else "not ready", "checks": results}
    try:
        body["workers"] = len(heartbeats.live(_probe_client(settings.REDIS_URL)))
    except redis.RedisError:
        body["workers"] = None
    return (200 if ready else 503), body


def _answer(start_response: Callable, status: int, body: dict) -> Iterable[bytes]:
    payload = json.dumps(body).encode()
    reason = {200: "OK", 503: "Service Unavailable", 405: "Method Not Allowed"}[status]
    headers = [
        ("Content-Type", "application/json"),
        ("Content-Length", str(len(payload))),
        ("Cache-Control", "no-store"),
    ]
    if status == 405:
        headers.append(("Allow", "GET, HEAD"))
    start_response(f"{status} {reason}", headers)
    return [payload]


def serve(environ: dict, start_response: Callable) -> Iterable[bytes]:
    """Answer a probe (PATH_INFO is one of PATHS)."""
    if environ.get("REQUEST_METHOD") not in ("GET", "HEAD"):
        return _answer(start_response, 405, {"error": "only GET and HEAD are answered here"})
    if environ["PATH_INFO"] == "/healthz":
        return _answer(start_response, 200, {"status": "alive"})
    close_old_connections()
    try:
        status, body = readiness()
    finally:
        close_old_connections()
    return _answer(start_response, status, body)

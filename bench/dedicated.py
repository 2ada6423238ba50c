"""The benchmarks' own database and Redis: created if missing, emptied, never someone
else's (a database must be named *bench*; a Redis database must be empty or carry the
script's marker key)."""

import sys
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import redis


def prepare_database(url: str | None, workdir: Path) -> str:
    """The database URL to use: a fresh SQLite file in `workdir`, or `url` (PostgreSQL:
    created if missing; the caller empties it)."""
    if url is None:
        return f"sqlite:///{workdir / 'bench.sqlite3'}"
    parts = urlsplit(url)
    name = parts.path.lstrip("/")
    if "bench" not in name:
        sys.exit(f"refusing to empty database {name!r}: use a dedicated one named *bench*")
    if parts.scheme.startswith("postgres"):
        import psycopg

        admin = urlunsplit(parts._replace(scheme="postgresql", path="/postgres"))
        with psycopg.connect(admin, autocommit=True) as conn:
            exists = conn.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", (name,)
            ).fetchone()
            if not exists:
                conn.execute(f'CREATE DATABASE "{name}"')
    return url


def clean_redis(redis_url: str, marker: str) -> redis.Redis:
    """Flush the Redis database, only if it is empty or was last used by this script."""
    client = redis.Redis.from_url(redis_url)
    if client.dbsize() and not client.exists(marker):
        sys.exit(f"Redis {redis_url} holds data this script did not write; refusing to flush it")
    client.flushdb()
    client.set(marker, "1")
    return client

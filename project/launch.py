"""What a process of the platform sets up before Django starts, and tears down after.

Importing settings only reads the environment. Whatever a development checkout needs on
disk or running is made here, by the process entry points (manage.py, the WSGI module,
the test session), and only when the environment leaves it to us:

* the `VAR_DIR` directory (SQLite, the embedded Redis and generated secrets live there);
* a development secret key in `VAR_DIR/secret_key` when `SECRET_KEY` is unset, so that
  sessions survive restarts and every process of the checkout signs alike;
* the embedded Redis when `REDIS_URL` is unset. The process that started it stops it
  when it exits; one that found it running (started by `make run`, say) leaves it.
"""

import contextlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path

from project import embedded_redis

BASE_DIR = Path(__file__).resolve().parent.parent


def var_dir() -> Path:
    """`VAR_DIR`, as settings reads it."""
    return Path(os.environ.get("VAR_DIR") or BASE_DIR / "var")


def prepare_files() -> None:
    """The var/ directory, and a development secret key unless one is configured."""
    directory = var_dir()
    directory.mkdir(parents=True, exist_ok=True)
    if os.environ.get("SECRET_KEY") or os.environ.get("SECRET_KEY_FILE"):
        return
    path = directory / "secret_key"
    if not path.exists():
        path.write_text(secrets.token_urlsafe(50))
        path.chmod(0o600)


def start_embedded_redis() -> bool:
    """Start the embedded Redis if REDIS_URL leaves it to us and it is not running;
    True if this call started it (its caller then stops it)."""
    if os.environ.get("REDIS_URL"):
        return False
    directory = var_dir() / "redis"
    if embedded_redis.is_running(directory):
        return False
    embedded_redis.ensure_running(directory)
    return True


def stop_embedded_redis() -> None:
    embedded_redis.stop(var_dir() / "redis")


@contextlib.contextmanager
def local_services() -> Iterator[None]:
    """prepare_files() and the embedded Redis for the length of the block."""
    prepare_files()
    started = start_embedded_redis()
    try:
        yield
    finally:
        if started:
            stop_embedded_redis()

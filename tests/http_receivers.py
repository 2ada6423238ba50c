"""Real HTTP endpoints on 127.0.0.1 for tests, each a context manager on an ephemeral port.

    with Recorder(Reply(503, headers={"Retry-After": "5"}), Reply(200)) as endpoint:
        ...deliver to endpoint.url...
        [first, second] = endpoint.wait_for(2)
        assert first.headers["webhook-id"] == second.headers["webhook-id"]

* `Recorder(*replies)`: an HTTP/1.1 keep-alive server that records every request (method,
  path, headers, body, arrival time) and answers with the given replies in order, the last
  one repeating (default: 200 "ok"). Any status, Retry-After, a slow answer (`delay`).
* `redirect_to(url)`: the Reply that redirects to `url`.
* `HangingServer(send=b"")`: reads the request, sends `send` (nothing, or e.g. headers
  and part of a body), then holds the connection open in silence.
* `TricklingServer(phase)`: answers one byte every `interval` seconds, forever, in the
  status line and headers (`"headers"`) or in the body (`"body"`).
* `unused_port()`: a port with no listener (connection refused).
* `FullBacklogListener()`: a listener that never accepts and whose queue is full, so a
  connect attempt times out.

As a pytest fixture: `with Recorder() as endpoint: yield endpoint`. Delivering to them
needs a session made with allow_private=True (they are on loopback).

The raw-socket servers log each connection (`connections`) with the time the client went
away, so a test can check that a client really closed its socket, not just gave up on it.
"""

import contextlib
import json
import selectors
import socket
import ssl
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any, Self

LOCALHOST = "127.0.0.1"


@dataclass(frozen=True)
class Reply:
    status: int = 200
    body: bytes = b"ok"
    headers: Mapping[str, str] = field(default_factory=dict)
    delay: float = 0.0  # seconds to wait before answering, as a slow endpoint would


def tls_context(cert: Path, key: Path, server_names: list[str | None]) -> ssl.SSLContext:
    """A server's TLS context for `cert`, noting each handshake's server name (SNI)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    context.sni_callback = lambda _sock, name, _context: server_names.append(name)
    return context


def redirect_to(url: str, status: int = 302) -> Reply:
    return Reply(status, b"", {"Location": url})


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str
    headers: Message  # case-insensitive: headers["Webhook-Id"] == headers["webhook-id"]
    body: bytes
    arrived_at: float  # time.monotonic() once the whole request had been read
    # The wall clock at the same moment, to compare with times the platform stored (which
    # are wall-clock): adding a start-time offset to arrived_at breaks if the clock is set.
    arrived_wall: float
    client_port: int  # equal ports across requests mean a reused (pooled) connection

    def json(self) -> Any:
        return json.loads(self.body)


class _Background:
    """Context-manager plumbing shared by the servers: start on enter, stop on exit."""

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError


class Recorder(_Background):
    """Records every request and answers with `replies` in order (the last one repeats)."""

    def __init__(self, *replies: Reply, ssl_context: ssl.SSLContext | None = None) -> None:
        self.replies = replies or (Reply(),)
        self._ssl_context = ssl_context
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)
        self._requests: list[RecordedRequest] = []

    @property
    def url(self) -> str:
        scheme = "https" if self._ssl_context else "http"
        return f"{scheme}://{LOCALHOST}:{self.port}/"

    @property
    def requests(self) -> list[RecordedRequest]:
        with self._lock:
            return list(self._requests)

    def wait_for(self, count: int, timeout: float = 5.0) -> list[RecordedRequest]:
        """The first `count` requests, waiting up to `timeout` seconds for them to arrive."""
        with self._arrived:
            if not self._arrived.wait_for(lambda: len(self._requests) >= count, timeout):
                raise AssertionError(f"{len(self._requests)} requests arrived, not {count}")
            return self._requests[:count]

    def wait_open_connections(self, count: int, timeout: float = 5.0) -> None:
        """Wait until exactly `count` client connections are open (the others closed)."""
        deadline = time.monotonic() + timeout
        while len(self._server.open_connections) != count:
            if time.monotonic() > deadline:
                found = len(self._server.open_connections)
                raise AssertionError(f"{found} connections open, not {count}")
            time.sleep(0.01)

    def start(self) -> None:
        self._server = _RecordingHTTPServer(self)
        if self._ssl_context:
            self._server.socket = self._ssl_context.wrap_socket(
                self._server.socket, server_side=True
            )
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.close_connections()
        self._server.server_close()
        self._thread.join()

    def _record(self, request: RecordedRequest) -> Reply:
        with self._arrived:
            self._requests.append(request)
            self._arrived.notify_all()
            return self.replies[min(len(self._requests), len(self.replies)) - 1]


class _RecordingHTTPServer(ThreadingHTTPServer):
    # socketserver's default listen backlog is 5: sixteen clients connecting at once on a busy
    # machine overflow it, and a dropped handshake waits a second or three for its retransmit.
    request_queue_size = 128

    def __init__(self, recorder: Recorder) -> None:
        super().__init__((LOCALHOST, 0), _RecordingHandler)
        self.recorder = recorder
        # Keep-alive connections idle in a handler thread; closing them lets stop() finish.
        self.open_connections: set[socket.socket] = set()

    def close_connections(self) -> None:
        for conn in list(self.open_connections):
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that hangs up mid-answer (a capped read, a deadline) is expected here.
        if not isinstance(sys.exc_info()[1], ConnectionError | ssl.SSLError):
            super().handle_error(request, client_address)


class _RecordingHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, so connection reuse can be observed
    # Headers and body go out in two writes; with Nagle the body would wait ~40 ms for an ACK.
    disable_nagle_algorithm = True
    server: _RecordingHTTPServer

    def setup(self) -> None:
        super().setup()
        self.server.open_connections.add(self.connection)

    def finish(self) -> None:
        self.server.open_connections.discard(self.connection)
        super().finish()

    def _answer(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        reply = self.server.recorder._record(
            RecordedRequest(
                method=self.command,
                path=self.path,
                headers=self.headers,
                body=body,
                arrived_at=time.monotonic(),
                arrived_wall=time.time(),
                client_port=self.client_address[1],
            )
        )
        time.sleep(reply.delay)
        self.send_response(reply.status)
        for name, value in reply.headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(reply.body)))
        self.end_headers()
        self.wfile.write(reply.body)

    do_POST = do_GET = do_PUT = do_PATCH = do_DELETE = _answer

    def log_message(self, format: str, *args: Any) -> None:
        pass  # keep test output readable


@dataclass
class ConnectionLog:
    opened_at: float  # time.monotonic()
    closed_at: float | None = None  # when the client went away (or the server stopped)


class _RawServer(_Background):
    """Accepts connections and runs `serve(conn, log)` for each in a thread of its own."""

    def __init__(self) -> None:
        self.connections: list[ConnectionLog] = []
        self._stopping = threading.Event()
        self._open: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []

    @property
    def url(self) -> str:
        return f"http://{LOCALHOST}:{self.port}/"

    def start(self) -> None:
        self._listener = socket.create_server((LOCALHOST, 0))
        self._listener.settimeout(0.05)  # so the accept loop notices stop()
        self.port = self._listener.getsockname()[1]
        self._accepting = threading.Thread(target=self._accept_loop, daemon=True)
        self._accepting.start()

    def stop(self) -> None:
        self._stopping.set()
        self._accepting.join()
        for conn in list(self._open):
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        for thread in self._threads:
            thread.join()
        self._listener.close()

    def wait_closed(self, timeout: float = 5.0) -> ConnectionLog:
        """The first connection, once its client has gone away."""
        limit = time.monotonic() + timeout
        while time.monotonic() < limit:
            if self.connections and self.connections[0].closed_at is not None:
                return self.connections[0]
            time.sleep(0.01)
        raise AssertionError("the client never closed its connection")

    def serve(self, conn: socket.socket) -> None:
        raise NotImplementedError

    def _accept_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            log = ConnectionLog(opened_at=time.monotonic())
            self.connections.append(log)
            self._open.add(conn)
            thread = threading.Thread(target=self._serve_one, args=(conn, log), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _serve_one(self, conn: socket.socket, log: ConnectionLog) -> None:
        with conn:
            conn.settimeout(None)
            with contextlib.suppress(OSError):
                _read_request(conn)
                self.serve(conn)
            log.closed_at = time.monotonic()
            self._open.discard(conn)


def _read_request(conn: socket.socket) -> bytes:
    """Consume one request (headers and a Content-Length body) so the client is not blocked;
    its head, or b"" if the client closed the connection first."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return b""
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    remaining = -len(body)
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            remaining += int(value)
    while remaining > 0:
        chunk = conn.recv(min(remaining, 65536))
        if not chunk:
            return b""
        remaining -= len(chunk)
    return head


class HangingServer(_RawServer):
    """Reads the request, sends `send`, then says nothing more until the client leaves."""

    def __init__(self, send: bytes = b"") -> None:
        super().__init__()
        self.send = send

    def serve(self, conn: socket.socket) -> None:
        conn.sendall(self.send)
        while conn.recv(65536):  # b"" once the client closes or shuts down its socket
            pass


class ScriptedServer(_RawServer):
    """Answers each request with the next of `answers`, raw bytes sent as they are (the
    last repeats), on the same connection for as long as the client keeps it, or closes
    it after each answer (`close_after`). An answer of None closes the connection without
    a word. `heads` are the requests' heads, in order."""

    def __init__(self, *answers: bytes | None, close_after: bool = False) -> None:
        super().__init__()
        self.answers = answers
        self.close_after = close_after
        self.heads: list[bytes] = []

    def _record(self, head: bytes) -> bytes | None:
        self.heads.append(head)
        return self.answers[min(len(self.heads), len(self.answers)) - 1]

    def _serve_one(self, conn: socket.socket, log: ConnectionLog) -> None:
        conn.settimeout(None)
        with conn, contextlib.suppress(OSError):
            while head := _read_request(conn):
                answer = self._record(head)
                if answer is None:
                    break
                conn.sendall(answer)
                if self.close_after:
                    break
        log.closed_at = time.monotonic()
        self._open.discard(conn)


class DroppingServer(_RawServer):
    """Reads the request and closes the connection without a word: did it process it?"""

    def serve(self, conn: socket.socket) -> None:
        pass


class TricklingServer(_RawServer):
    """Sends a 200 one byte every `interval` seconds, in the headers or in the body."""

    def __init__(self, phase: str, interval: float = 0.05) -> None:
        if phase not in ("headers", "body"):
            raise ValueError(f"phase must be 'headers' or 'body', not {phase!r}")
        super().__init__()
        self.phase = phase
        self.interval = interval

    def serve(self, conn: socket.socket) -> None:
        if self.phase == "headers":
            conn.sendall(b"HTTP/1.1 200 OK\r\nX-Trickle: ")
        else:
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n")
        # A send to a peer that has shut its socket down fails within a byte or two.
        while not self._stopping.wait(self.interval):
            conn.sendall(b"a")


def unused_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (it was free a moment ago)."""
    with socket.socket() as sock:
        sock.bind((LOCALHOST, 0))
        return sock.getsockname()[1]


class FullBacklogListener(_Background):
    """A listener whose accept queue is full: the kernel drops new SYNs, so connects hang."""

    @property
    def url(self) -> str:
        return f"http://{LOCALHOST}:{self.port}/"

    def start(self) -> None:
        self._listener = socket.create_server((LOCALHOST, 0), backlog=0)
        self.port = self._listener.getsockname()[1]
        self._filler = socket.create_connection((LOCALHOST, self.port))  # takes the one slot

    def stop(self) -> None:
        self._filler.close()
        self._listener.close()


class SilentServer(_Background):
    """Accepts any number of connections in one thread, reads what comes, never answers:
    hundreds of hung endpoints at the cost of one thread. `open_connections()` counts
    the connections its clients still hold."""

    @property
    def url(self) -> str:
        return f"http://{LOCALHOST}:{self.port}/"

    def start(self) -> None:
        self._listener = socket.create_server((LOCALHOST, 0), backlog=1024)
        self._listener.setblocking(False)
        self.port = self._listener.getsockname()[1]
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ)
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def open_connections(self) -> int:
        with self._lock:
            return len(self._open)

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join()
        for conn in list(self._open):
            conn.close()
        self._selector.close()
        self._listener.close()

    def _serve(self) -> None:
        while not self._stopping.is_set():
            for key, _ in self._selector.select(0.05):
                sock = key.fileobj
                if sock is self._listener:
                    with contextlib.suppress(BlockingIOError):
                        conn, _ = self._listener.accept()
                        conn.setblocking(False)
                        self._selector.register(conn, selectors.EVENT_READ)
                        with self._lock:
                            self._open.add(conn)
                    continue
                try:
                    data = sock.recv(65536)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if not data:
                    self._selector.unregister(sock)
                    sock.close()
                    with self._lock:
                        self._open.discard(sock)

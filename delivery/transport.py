"""The one function that does outbound HTTP for deliveries, and the session it runs on.

`post` never raises for anything the network or the endpoint does: every outcome is an
`HttpResult` for policy.decide() to judge. It bounds each attempt in time and in memory,
because a delivery slot held by one bad endpoint is a slot every other tenant waits for:

* urllib3's timeouts apply to each socket operation, so an endpoint trickling a byte a
  second would hold a slot forever. A shared watchdog thread shuts the request's socket
  down at the total deadline, whether it is trickling headers or body.
* only `response_cap_bytes` of the response body are read; the rest is never downloaded
  (the connection is closed instead of being drained back into the pool).
"""

import contextlib
import heapq
import http.client
import itertools
import os
import socket
import ssl
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC
from email.utils import parsedate_to_datetime

import certifi
import urllib3
from requests.utils import get_encoding_from_headers

from delivery import netguard

TIMEOUT = "timeout"
CONNECTION = "connection"
FORBIDDEN_DESTINATION = "forbidden_destination"
DEADLINE = "deadline"
INVALID_URL = "invalid_url"
TLS = "tls"
ERROR_KINDS = frozenset({TIMEOUT, CONNECTION, FORBIDDEN_DESTINATION, DEADLINE, INVALID_URL, TLS})

_READ_CHUNK = 16 * 1024
_ERROR_CHARS = 300  # Attempt.error holds 500; leave room for the caller's own prefix.


@dataclass(frozen=True)
class HttpResult:
    """What one POST produced: a status, or a classified failure (`error_kind`)."""

    status_code: int | None  # set whenever a status line arrived, even if the body then failed
    duration_ms: int
    error: str  # short human text; "" when a complete response arrived
    error_kind: str  # "" or one of ERROR_KINDS
    response_excerpt: str  # the first response_cap_bytes of the body, decoded
    retry_after_seconds: float | None  # Retry-After as seconds from now, None if absent/invalid


def new_session(
    *, pool_maxsize: int, allow_private: bool, ca_certs: str | None = None
) -> netguard.GuardedPoolManager:
    """A pool of keep-alive connections (per host) whose every connection goes through the
    SSRF guard.

    It is urllib3's PoolManager, used directly rather than through a requests.Session:
    the Session layer (preparing the request, merging environment settings, cookies,
    hooks, adapters) cost ~0.2 ms of CPU per POST here, 40% of the request and more
    than a delivery's pick, load, record and ack together (bench/delivery.py,
    docs/BENCHMARKS.md). A PoolManager never reads the environment (no HTTP(S)_PROXY, no
    ~/.netrc), the guarantee requests needs `trust_env = False` for. Certificates are
    checked against certifi's bundle, as requests does; `ca_certs` replaces it (tests).
    """
    return netguard.GuardedPoolManager(
        num_pools=netguard.HOST_POOLS,
        maxsize=pool_maxsize,
        allow_private=allow_private,
        cert_reqs="CERT_REQUIRED",
        ca_certs=ca_certs or certifi.where(),
    )


# Only an excerpt is kept, so a compressed response would be pure cost (and a bomb risk).
_BASE_HEADERS = {"Accept-Encoding": "identity"}


def post(
    session: netguard.GuardedPoolManager,
    url: str,
    body: bytes,
    headers: Mapping[str, str],
    *,
    connect_timeout: float,
    total_timeout: float,
    response_cap_bytes: int,
) -> HttpResult:
    """POST `body` to `url` once, within `total_timeout` seconds from the call.

    Redirects are not followed (a 3xx is a status like any other) and nothing is retried:
    a POST may have been processed even when it failed, so whether to send it again is
    policy's decision, made once. Raises only for the caller's own mistakes, such as a
    header value containing a newline.
    """
    started = time.monotonic()
    if not url.lower().startswith(("http://", "https://")):
        return _failed(started, INVALID_URL, f"invalid URL: {url[:80]!r} is not http(s)://")
    deadline = started + total_timeout
    watch = _WATCHDOG.arm(deadline)
    response: urllib3.BaseHTTPResponse | None = None
    excerpt = bytearray()
    try:
        with netguard.watch_sockets(watch.add):
            response = session.post(
                url,
                body=body,
                headers={**_BASE_HEADERS, **headers},
                redirect=False,
                retries=False,
                preload_content=False,
                timeout=urllib3.Timeout(
                    connect=min(connect_timeout, total_timeout), read=total_timeout
                ),
            )
            _read_capped(response, excerpt, response_cap_bytes, deadline)
        # A socket shut down mid-header or in a body without a length ends in what parses
        # as a complete response; once the watchdog struck, nothing that arrived is trusted.
        if watch.close():
            raise _DeadlineExceeded
    except (
        urllib3.exceptions.HTTPError,
        http.client.HTTPException,
        OSError,
        netguard.ForbiddenDestination,
        _DeadlineExceeded,
    ) as exc:
        kind, error = _classify(exc, watch.fired, response, connect_timeout, total_timeout)
    else:
        kind, error = "", ""
    finally:
        if response is not None:
            # Read to its end, the connection is back in the pool already; cut at the cap
            # or by an error, it is closed instead of drained (never downloading the rest).
            response.close()
            response.release_conn()
        watch.close()
    return HttpResult(
        status_code=response.status if response is not None else None,
        duration_ms=round((time.monotonic() - started) * 1000),
        error=error[:_ERROR_CHARS],
        error_kind=kind,
        response_excerpt=_decode(excerpt, response),
        retry_after_seconds=(
            parse_retry_after(response.headers.get("Retry-After"), time.time())
            if response is not None
            else None
        ),
    )


def _failed(started: float, kind: str, error: str) -> HttpResult:
    return HttpResult(
        status_code=None,
        duration_ms=round((time.monotonic() - started) * 1000),
        error=error[:_ERROR_CHARS],
        error_kind=kind,
        response_excerpt="",
        retry_after_seconds=None,
    )


def parse_retry_after(value: str | None, now: float) -> float | None:
    """Retry-After (delay-seconds or HTTP-date) as seconds after `now` (a Unix time).

    A date in the past means "now" (0.0); anything unparseable is ignored (None). Huge
    values are returned as they are (even inf): policy clamps them.
    """
    if value is None:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:  # "-0000": RFC 9110 dates are GMT anyway
        when = when.replace(tzinfo=UTC)
    return max(0.0, when.timestamp() - now)


class _DeadlineExceeded(Exception):
    pass


def _read_capped(
    response: urllib3.BaseHTTPResponse, into: bytearray, cap: int, deadline: float
) -> None:
    """Read the body into `into` until its end or `cap` bytes, whichever comes first.

    The deadline check between chunks covers a body that keeps arriving in time for each
    read; the watchdog covers a single read that would block past the deadline.
    """
    while len(into) < cap:
        # read1: what has arrived (one socket read), so a trickle is kept as it comes.
        chunk = response.read1(min(_READ_CHUNK, cap - len(into)))
        if not chunk:
            return
        into += chunk
        if time.monotonic() >= deadline:
            raise _DeadlineExceeded


def _classify(
    exc: Exception,
    deadline_struck: bool,
    response: urllib3.BaseHTTPResponse | None,
    connect_timeout: float,
    total_timeout: float,
) -> tuple[str, str]:
    """(error_kind, short text) for a failed request."""
    if isinstance(exc, netguard.ForbiddenDestination):
        return FORBIDDEN_DESTINATION, f"forbidden destination: {exc}"
    # Once the watchdog has shut the socket down, whatever error that caused is its echo.
    if deadline_struck or isinstance(exc, _DeadlineExceeded):
        if response is None:
            return DEADLINE, f"no response within {total_timeout:g} s"
        return DEADLINE, f"response body incomplete after {total_timeout:g} s"
    # urllib3 2 makes NewConnectionError (refused, unreachable) a ConnectTimeoutError too.
    if isinstance(exc, urllib3.exceptions.ConnectTimeoutError) and not isinstance(
        exc, urllib3.exceptions.NewConnectionError
    ):
        return TIMEOUT, f"connect timed out after {min(connect_timeout, total_timeout):g} s"
    if isinstance(exc, urllib3.exceptions.ReadTimeoutError):
        return TIMEOUT, f"read timed out after {total_timeout:g} s"
    if isinstance(exc, urllib3.exceptions.SSLError | ssl.SSLError | ssl.CertificateError):
        return TLS, f"TLS error: {_root_cause(exc)}"
    if isinstance(exc, urllib3.exceptions.LocationValueError):
        return INVALID_URL, f"invalid URL: {exc}"
    return CONNECTION, f"connection failed: {_root_cause(exc)}"


def _root_cause(exc: BaseException) -> str:
    """The innermost useful message: 'Connection refused', not urllib3's nested repr."""
    seen: set[int] = set()
    current: BaseException = exc
    while id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, urllib3.exceptions.NameResolutionError):
            return f"could not resolve host {current.conn.host}"
        inner = getattr(current, "reason", None)  # urllib3's MaxRetryError
        if not isinstance(inner, BaseException) and current.args:
            inner = current.args[-1]  # urllib3's ProtocolError("Connection aborted.", cause)
        inner = inner if isinstance(inner, BaseException) else current.__cause__
        if inner is None:
            break
        current = inner
    if isinstance(current, OSError) and current.strerror:
        return current.strerror
    return str(current) or type(current).__name__


def _decode(excerpt: bytearray, response: urllib3.BaseHTTPResponse | None) -> str:
    encoding = None if response is None else get_encoding_from_headers(response.headers)
    try:
        return excerpt.decode(encoding or "utf-8", errors="replace")
    except LookupError:  # a charset Python does not know
        return excerpt.decode("utf-8", errors="replace")


class _Watch:
    """One request's deadline: the sockets it has used, and whether the deadline struck.

    It keeps a duplicate of each socket's descriptor. The duplicate stays valid when the
    connection's own socket object is detached by the TLS wrap, or closed and its number
    reused by another thread, so shutting it down can only ever cut this request.
    """

    def __init__(self) -> None:
        self.fired = False
        self.done = False
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []

    def add(self, sock: socket.socket) -> None:
        try:
            dup = socket.fromfd(sock.fileno(), sock.family, sock.type)
        except OSError:  # already closed: nothing left to cut
            return
        with self._lock:
            self._sockets.append(dup)
            if self.fired:
                _shutdown(dup)

    def fire(self) -> None:
        with self._lock:
            if self.done:
                return
            self.fired = True
            for sock in self._sockets:
                _shutdown(sock)

    def close(self) -> bool:
        """Disarm (idempotent); True if the deadline had struck."""
        with self._lock:
            self.done = True
            for sock in self._sockets:
                sock.close()
            self._sockets.clear()
            return self.fired


def _shutdown(sock: socket.socket) -> None:
    # A blocked recv() in the requesting thread then returns at once, ending the request.
    with contextlib.suppress(OSError):  # already disconnected
        sock.shutdown(socket.SHUT_RDWR)


class _Watchdog:
    """One daemon thread for all requests in the process: a timer thread per request would
    cost more than the request at hundreds of deliveries per second."""

    def __init__(self) -> None:
        self._reset()
        # A forked worker inherits the heap but not the thread (nor a usable lock).
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, _Watch]] = []
        self._order = itertools.count()
        self._thread: threading.Thread | None = None

    def arm(self, deadline: float) -> _Watch:
        watch = _Watch()
        with self._cond:
            heapq.heappush(self._heap, (deadline, next(self._order), watch))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="delivery-deadline-watchdog", daemon=True
                )
                self._thread.start()
            if self._heap[0][2] is watch:
                self._cond.notify()
        return watch

    def _run(self) -> None:
        while True:
            with self._cond:
                # Finished requests stay in the heap until they reach the top: removing
                # them from the middle would cost more than carrying them.
                while self._heap and self._heap[0][2].done:
                    heapq.heappop(self._heap)
                if not self._heap:
                    self._cond.wait()
                    continue
                delay = self._heap[0][0] - time.monotonic()
                if delay > 0:
                    self._cond.wait(delay)
                    continue
                _, _, watch = heapq.heappop(self._heap)
            watch.fire()


_WATCHDOG = _Watchdog()

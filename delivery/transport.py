"""The one function that does outbound HTTP for deliveries, and the session it runs on.

`post` never raises for anything the network or the endpoint does: every outcome is an
`HttpResult` for policy.decide() to judge. It bounds each attempt in time and in memory,
because a delivery slot held by one bad endpoint is a slot every other tenant waits for:

* one total deadline covers connecting, the TLS handshake, sending and reading: each
  wait on the socket gets only what is left of it, so an endpoint trickling a byte a
  second is cut at the deadline, whether in its headers or its body;
* only `response_cap_bytes` of the response body are read; the rest is never downloaded
  (the connection is closed instead of being drained back into the pool).

The HTTP itself is http11 (the wire format) over connections.ConnectionPool (keep-alive
sockets opened through the SSRF guard); docs/ARCHITECTURE.md says why not urllib3.
"""

import socket
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC
from email.utils import parsedate_to_datetime

from requests.utils import get_encoding_from_headers

from delivery import http11, netguard
from delivery.connections import ConnectionPool, InvalidURL, Route

TIMEOUT = "timeout"
CONNECTION = "connection"
FORBIDDEN_DESTINATION = "forbidden_destination"
DEADLINE = "deadline"
INVALID_URL = "invalid_url"
TLS = "tls"
ERROR_KINDS = frozenset({TIMEOUT, CONNECTION, FORBIDDEN_DESTINATION, DEADLINE, INVALID_URL, TLS})

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
) -> ConnectionPool:
    """A pool of keep-alive connections (up to `pool_maxsize` idle per origin) whose every
    connection goes through the SSRF guard. Certificates are checked against certifi's
    bundle, as requests does; `ca_certs` replaces it (tests)."""
    return ConnectionPool(pool_maxsize=pool_maxsize, allow_private=allow_private, ca_certs=ca_certs)


# Only an excerpt is kept, so a compressed response would be pure cost (and a bomb risk).
_BASE_HEADERS = {"Accept-Encoding": "identity"}


def post(
    session: ConnectionPool,
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
    deadline = started + total_timeout
    try:
        route = session.route(url)
    except InvalidURL as exc:
        return _failed(started, INVALID_URL, f"invalid URL: {exc}")
    request = http11.encode_request(
        "POST", route.target, route.host_header, {**_BASE_HEADERS, **headers}, body
    )
    response: http11.Response | None = None
    connecting, reusable = True, False
    sock = session.take(route.origin)
    try:
        if sock is None:
            sock = session.connect(route.origin, min(connect_timeout, total_timeout), deadline)
        connecting = False
        http11.send_all(sock, request, deadline)
        response = http11.Response(sock, deadline)
        response.read_head()
        response.read_body(response_cap_bytes)
        reusable = response.reusable
    except (
        OSError,  # socket errors, timeouts and ssl.SSLError
        netguard.ForbiddenDestination,
        http11.ProtocolError,
        http11.ClosedEarly,
        http11.DeadlineExceeded,
    ) as exc:
        kind, error = _classify(exc, connecting, response, route, connect_timeout, total_timeout)
    else:
        kind, error = "", ""
    finally:
        if sock is not None:
            if reusable:
                session.give_back(route.origin, sock)
            else:
                sock.close()
    status = response.status if response is not None else None
    return HttpResult(
        status_code=status,
        duration_ms=round((time.monotonic() - started) * 1000),
        error=error[:_ERROR_CHARS],
        error_kind=kind,
        response_excerpt=_decode(response) if status is not None else "",
        retry_after_seconds=(
            parse_retry_after(response.headers.get("retry-after"), time.time())
            if status is not None
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


def _classify(
    exc: Exception,
    connecting: bool,
    response: http11.Response | None,
    route: Route,
    connect_timeout: float,
    total_timeout: float,
) -> tuple[str, str]:
    """(error_kind, short text) for a failed request."""
    if isinstance(exc, netguard.ForbiddenDestination):
        return FORBIDDEN_DESTINATION, f"forbidden destination: {exc}"
    if isinstance(exc, ssl.SSLError | ssl.CertificateError):
        return TLS, f"TLS error: {exc}"
    timed_out = isinstance(exc, http11.DeadlineExceeded | TimeoutError)
    if timed_out and connecting and not isinstance(exc, http11.DeadlineExceeded):
        # The TCP connect's own timeout (a handshake that times out is the deadline's).
        return TIMEOUT, f"connect timed out after {min(connect_timeout, total_timeout):g} s"
    if timed_out:
        if response is None or response.status is None:
            return DEADLINE, f"no response within {total_timeout:g} s"
        return DEADLINE, f"response body incomplete after {total_timeout:g} s"
    if isinstance(exc, socket.gaierror):
        return CONNECTION, f"connection failed: could not resolve host {route.origin[1]}"
    if isinstance(exc, http11.ProtocolError):
        return CONNECTION, f"invalid HTTP response: {exc}"
    if isinstance(exc, OSError) and exc.strerror:
        return CONNECTION, f"connection failed: {exc.strerror}"
    return CONNECTION, f"connection failed: {exc}"


def _decode(response: http11.Response) -> str:
    encoding = get_encoding_from_headers(response.headers)
    try:
        return response.body.decode(encoding or "utf-8", errors="replace")
    except LookupError:  # a charset Python does not know
        return response.body.decode("utf-8", errors="replace")

"""Outbound HTTP for deliveries, on libcurl (pycurl), and the pool of handles it runs on.

Nothing here raises for anything the network or the endpoint does: every outcome is an
`HttpResult` for policy.decide() to judge. Each request is bounded in time and in memory,
because a delivery slot held by one bad endpoint is a slot every other tenant waits for:

* one total deadline (TIMEOUT_MS) covers resolving, connecting, the TLS handshake,
  sending and reading, so an endpoint trickling a byte a second is cut at the deadline,
  whether in its headers or its body; the connect phase has its own, shorter limit;
* only `response_cap_bytes` of the response body are kept; at the first byte past the
  cap the write callback refuses the data, which ends the transfer and closes its
  connection instead of draining the rest of the body.

One request is an `Exchange`: a configured easy handle plus the per-request state its
callbacks fill in (the body so far, the final response's head, why the guard refused a
connection). An Exchange runs either inside a `pycurl.CurlMulti` (the engine's event
loop: the multi's connection cache is shared by all its transfers) or on its own with
`.perform()` (`Transport.post`, for threads). Either way `finish()` turns libcurl's
outcome into the HttpResult.

The SSRF guard (netguard.is_forbidden_address) runs in OPENSOCKETFUNCTION: libcurl asks
us for every socket it is about to connect, with the very address it will connect to,
after its own resolving. A refused address gets no socket, so no byte ever reaches it,
whatever DNS answered earlier (rebinding) and however the host was spelt (127.1,
2130706433, ::ffff:127.0.0.1). docs/ARCHITECTURE.md, "libcurl (pycurl)", says why
libcurl and lists every behaviour choice.
"""

import os
import re
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC
from email.utils import parsedate_to_datetime
from urllib.parse import quote, urlsplit

import certifi
import pycurl

from core import netguard

TIMEOUT = "timeout"
CONNECTION = "connection"
FORBIDDEN_DESTINATION = "forbidden_destination"
DEADLINE = "deadline"
INVALID_URL = "invalid_url"
TLS = "tls"
ERROR_KINDS = frozenset({TIMEOUT, CONNECTION, FORBIDDEN_DESTINATION, DEADLINE, INVALID_URL, TLS})

_ERROR_CHARS = 300  # Attempt.error holds 500; leave room for the caller's own prefix.
# Our own limit on one response head (status line and headers): libcurl's is larger
# (100 KiB a line, 300 KiB in all) and an endpoint's head has no business being big.
MAX_HEAD_BYTES = 64 * 1024
# Connections one easy handle keeps open when used alone (post()); in a CurlMulti the
# multi's cache applies instead. Idle descriptors stay below this times max_idle_handles.
CONNECTIONS_PER_HANDLE = 4
# URLs whose checked, curl-ready form a Transport remembers; past this it starts over
# (endpoint URLs are few per process, so this is rarely reached).
_REMEMBERED_URLS = 4096
_DEFAULT_PORTS = {"http": 80, "https": 443}
# What may stay as it is in a request target; anything else (spaces, non-ASCII) is
# percent-encoded, as browsers do; libcurl would refuse the URL instead.
_TARGET_SAFE = "/?&=%:@!$'()*+,;~-._[]"
_STATUS_LINE = re.compile(r"HTTP/1\.[0-9] [0-9]{3}(?: |$)")
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
# Headers libcurl writes itself from the request's framing: a caller's value would
# contradict it (a wrong Content-Length desynchronises a kept-alive connection).
_SET_HERE = frozenset({"host", "content-length", "transfer-encoding", "connection", "expect"})
# Sent unless the caller says otherwise. Only an excerpt is kept, so a compressed response
# would be pure cost (and a bomb risk); libcurl decompresses nothing anyway (no
# ACCEPT_ENCODING set, HTTP_CONTENT_DECODING off).
_BASE_HEADERS = {"accept-encoding": b"Accept-Encoding: identity"}
# libcurl's own defaults, switched off by an empty value so that a request carries only
# the headers we chose:
# "Accept: */*", the form Content-Type of a POST, pycurl's User-Agent, and "Expect: 100-continue" for a
# large body (a round trip more, and a stall on endpoints that ignore it).
_CURL_DEFAULTS_OFF = {
    "accept": b"Accept:",
    "content-type": b"Content-Type:",
    "user-agent": b"User-Agent:",  # pycurl's own "PycURL/7.49.0 libcurl/..."
}
_NO_EXPECT = b"Expect:"
# libcurl's option number for CURLOPT_QUICK_EXIT (7.87); pycurl 7.49 has no name for it.
_QUICK_EXIT = 322


@dataclass(frozen=True)
class HttpResult:
    """What one POST produced: a status, or a classified failure (`error_kind`)."""

    status_code: int | None  # set whenever a final head arrived, even if the body then failed
    duration_ms: int
    error: str  # short human text; "" when a complete response arrived
    error_kind: str  # "" or one of ERROR_KINDS
    response_excerpt: str  # the first response_cap_bytes of the body, decoded
    retry_after_seconds: float | None  # Retry-After as seconds from now, None if absent/invalid
    # The receiver's own time: from the request sent to the answer's first byte, without
    # setting up the connection (DNS, TCP, TLS), which a new connection pays and a reused
    # one does not. None without an answer.
    answer_ms: float | None = None


class _InvalidURL(ValueError):
    pass


@dataclass(frozen=True)
class _Target:
    """A URL as libcurl gets it (host in IDNA, path percent-encoded, no fragment), and
    the host as the tenant wrote it, for the guard's messages."""

    curl_url: str
    host: str


def _target_for(url: str) -> _Target:
    """Check `url` and put it in the form libcurl takes, or raise _InvalidURL saying why."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError as exc:
        raise _InvalidURL(str(exc)) from None
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS:
        raise _InvalidURL(f"{url[:80]!r} is not http(s)://")
    if not parts.hostname:
        raise _InvalidURL("no host in the URL")
    if parts.username is not None or parts.password is not None:
        raise _InvalidURL("credentials in the URL are not sent; use headers")
    try:
        # This libcurl has no IDN support: a non-ASCII name goes to it already encoded.
        host = parts.hostname.encode("idna").decode("ascii")
    except UnicodeError:
        raise _InvalidURL(f"{parts.hostname[:80]!r}, label empty or too long") from None
    shown = f"[{host}]" if ":" in host else host
    authority = shown if port is None else f"{shown}:{port}"
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    if not target.isascii() or not target.isprintable() or " " in target:
        target = quote(target, safe=_TARGET_SAFE)
    return _Target(f"{scheme}://{authority}{target}", parts.hostname)


def _header_lines(headers: Mapping[str, str]) -> list[bytes]:
    """The caller's headers as libcurl's HTTPHEADER list. Raises ValueError for a header
    that would change the request's shape: CR, LF or NUL anywhere, a name that is not a
    token, or one of the framing headers libcurl writes itself."""
    lines: list[bytes] = []
    given: list[str] = []
    for name, value in headers.items():
        prefix = _NAMES.get(name)
        if prefix is None:
            prefix = _checked_name(name)
        if _BREAKS.search(value):
            raise ValueError(f"header {name!r} has a line break or NUL in its value")
        given.append(name.lower())
        try:
            encoded = value.encode("latin-1")
        except UnicodeEncodeError:
            # Latin-1 is what HTTP/1.1 allows for field values; beyond it UTF-8 is the only
            # guess a receiver can undo. Either way a value never raises.
            encoded = value.encode("utf-8")
        # An empty value would mean "remove this header" to libcurl; "Name;" sends it empty.
        lines.append(prefix + encoded if encoded else prefix[:-2] + b";")
    for defaults in (_BASE_HEADERS, _CURL_DEFAULTS_OFF):
        lines.extend(line for lower, line in defaults.items() if lower not in given)
    lines.append(_NO_EXPECT)
    return lines


_BREAKS = re.compile("[\r\n\0]")
# Header names already checked, as b"Name: " (a worker sends the same few all day long).
_NAMES: dict[str, bytes] = {}


def _checked_name(name: str) -> bytes:
    if _BREAKS.search(name):
        raise ValueError(f"header {name!r} has a line break or NUL in its name")
    if not _TOKEN.fullmatch(name) or name.lower() in _SET_HERE:
        raise ValueError(f"header name {name!r} is not allowed")
    prefix = name.encode("ascii") + b": "
    if len(_NAMES) < 1024:
        _NAMES[name] = prefix
    return prefix


class Exchange:
    """One POST: `handle` is a configured easy handle (None when no request is made, and
    then `result` is already set); `finish()` makes the HttpResult once libcurl is done,
    and `transport.release(exchange)` takes the handle back for another request.

    With a CurlMulti: `multi.add_handle(exchange.handle)`, drive the multi, and for each
    handle `info_read()` reports done, `finish(errno, message)` (0 and "" for success),
    `multi.remove_handle(handle)`, then release. duration_ms counts from exchange(), so
    make an exchange when it is about to be added, not ahead of time.

    The callbacks below run inside libcurl's perform, on the thread driving the handle.
    """

    __slots__ = (
        "_body",
        "_cap",
        "_capped",
        "_connect_timeout",
        "_head_bytes",
        "_head_status",
        "_headers",
        "_host",
        "_malformed",
        "_refused",
        "_started",
        "_total_timeout",
        "handle",
        "result",
        "status",
        "transport",
    )

    def __init__(
        self,
        transport: "Transport",
        handle: pycurl.Curl | None,
        *,
        host: str = "",
        connect_timeout: float = 0.0,
        total_timeout: float = 0.0,
        cap: int = 0,
    ) -> None:
        self.transport = transport
        self.handle = handle
        self.result: HttpResult | None = None
        self._started = time.monotonic()
        self._host = host
        self._connect_timeout = connect_timeout
        self._total_timeout = total_timeout
        self._cap = cap
        self._body = bytearray()
        self._capped = False
        # The head being read: its status (None until a status line) and headers; a
        # final head (2xx-5xx) is adopted as `status`/`_headers` only once complete.
        self._head_status: int | None = None
        self._head_bytes = 0
        self._headers: dict[str, str] = {}
        self.status: int | None = None
        self._malformed = ""  # why our header callback stopped the transfer
        self._refused: list[tuple[str, str]] = []  # (address, reason) the guard refused

    # -- libcurl callbacks ------------------------------------------------------------

    def _on_header(self, line: bytes) -> int | None:
        """One header line, status lines and the empty line ending each head included
        (interim 1xx heads and trailers come through here too)."""
        if self.status is not None:
            return None  # trailers after the final head: read and ignored
        self._head_bytes += len(line)
        if self._head_bytes > MAX_HEAD_BYTES:
            self._malformed = "response headers too large"
            return 0  # any other count than len(line) makes libcurl stop the transfer
        text = line.decode("latin-1").rstrip("\r\n")
        if self._head_status is None:
            # libcurl reads "HTTP/1.1 2000" as a 200 and "HTTP/2.5" as HTTP/1: be strict.
            if not _STATUS_LINE.match(text):
                self._malformed = f"malformed status line {text[:40]!r}"
                return 0
            self._head_status = int(text[9:12])
            self._headers = {}
            return None
        if text:
            if text[:1] in (" ", "\t") and self._headers:  # obsolete folding: the last one's
                last = next(reversed(self._headers))
                self._headers[last] += " " + text.strip()
                return None
            name, _, value = text.partition(":")
            name, value = name.strip().lower(), value.strip(" \t")
            old = self._headers.get(name)
            self._headers[name] = value if old is None else f"{old}, {value}"
            return None
        # The empty line: this head is complete.
        status = self._head_status
        self._head_status, self._head_bytes = None, 0
        if status == 101:
            self.status = 101
            self._malformed = "unexpected 101 Switching Protocols"
            return 0
        if status >= 200:
            self.status = status
        return None

    def _on_body(self, data: bytes) -> int | None:
        room = self._cap - len(self._body)
        if len(data) <= room:
            self._body += data
            return None
        # Past the cap: keep what fits and refuse the rest, which aborts the transfer
        # (CURLE_WRITE_ERROR) and closes its connection, so nothing more is downloaded.
        self._body += data[:room]
        self._capped = True
        return room

    def _open_socket(self, _purpose: int, address: tuple) -> socket.socket | int:
        """OPENSOCKETFUNCTION: a socket only for an address the guard allows."""
        family, kind, protocol, sockaddr = address
        ip = sockaddr[0] if isinstance(sockaddr, tuple) else str(sockaddr)
        reason = netguard.is_forbidden_address(ip)
        if reason:
            self._refused.append((ip, reason))
            return pycurl.SOCKET_BAD
        # pycurl gives libcurl a dup() of this descriptor; ours closes with the object.
        return socket.socket(family, kind, protocol)

    # -- the outcome ------------------------------------------------------------------

    def finish(self, errno: int, message: str) -> HttpResult:
        """The HttpResult of the completed transfer: `errno` 0 for success, else libcurl's
        error code and message (from perform() or CurlMulti.info_read())."""
        kind, error = self._classify(errno, message)
        status = self.status if self.status is not None else None
        headers = self._headers if status is not None else {}
        self.result = HttpResult(
            status_code=status,
            duration_ms=round((time.monotonic() - self._started) * 1000),
            error=error[:_ERROR_CHARS],
            error_kind=kind,
            response_excerpt=_decode(bytes(self._body), headers) if status is not None else "",
            retry_after_seconds=(
                parse_retry_after(headers.get("retry-after"), time.time())
                if status is not None
                else None
            ),
            answer_ms=self._answer_ms() if status is not None else None,
        )
        return self.result

    def _answer_ms(self) -> float | None:
        """libcurl's time to the first byte less its time to the request's start (after
        the connection and its TLS were ready); None when it has no such figures."""
        if self.handle is None:
            return None
        ready = self.handle.getinfo(pycurl.PRETRANSFER_TIME)
        first_byte = self.handle.getinfo(pycurl.STARTTRANSFER_TIME)
        if first_byte <= 0 or first_byte < ready:
            return None
        return (first_byte - ready) * 1000

    def _redirect_note(self) -> str:
        """For a redirect, where it pointed, since it is not followed (a receiver that
        moved is told apart from one that fails); "" for any other response."""
        status = self.status
        if status is None or not 300 <= status < 400:
            return ""
        location = self._headers.get("location", "").strip()
        if not location:
            return f"redirect (HTTP {status}) without a Location, not followed"
        try:
            host = urlsplit(location).hostname or self._host  # relative: the same host
        except ValueError:
            host = ""
        if not host:
            return f"redirect (HTTP {status}) to an unreadable Location, not followed"
        return f"redirect to {host} not followed (HTTP {status})"

    def _classify(self, errno: int, message: str) -> tuple[str, str]:
        """(error_kind, short text) for libcurl's outcome; ("", "") for a response, or
        ("", where it pointed) for a redirect."""
        if errno == 0:
            if self.status is None:
                # libcurl takes a close after the status line as the end of a response
                # without a body; no complete head came, so no response came.
                return (
                    CONNECTION,
                    "connection failed: the endpoint closed the connection mid-response",
                )
            return "", self._redirect_note()
        if errno == pycurl.E_WRITE_ERROR and self._capped:
            # Stopped at the cap by us: the response is what we wanted.
            return "", self._redirect_note()
        if self._malformed:
            return CONNECTION, f"invalid HTTP response: {self._malformed}"
        if self._refused and errno == pycurl.E_COULDNT_CONNECT:
            return FORBIDDEN_DESTINATION, f"forbidden destination: {self._refusal()}"
        connect = min(self._connect_timeout, self._total_timeout)
        if errno == pycurl.E_OPERATION_TIMEDOUT:
            # libcurl names the phase: resolving, connecting (TCP and TLS), or later.
            if message.startswith("Resolving"):
                return TIMEOUT, f"resolving {self._host} timed out after {connect:g} s"
            if message.startswith("Connection timed out"):
                return TIMEOUT, f"connect timed out after {connect:g} s"
            if self.status is None:
                return DEADLINE, f"no response within {self._total_timeout:g} s"
            return DEADLINE, f"response body incomplete after {self._total_timeout:g} s"
        if errno in _TLS_ERRORS:
            if errno == pycurl.E_PEER_FAILED_VERIFICATION:
                return TLS, f"TLS error: certificate verify failed: {message}"
            return TLS, f"TLS error: {message}"
        if errno in (pycurl.E_COULDNT_RESOLVE_HOST, pycurl.E_COULDNT_RESOLVE_PROXY):
            return CONNECTION, f"connection failed: could not resolve host {self._host}"
        if errno == pycurl.E_GOT_NOTHING:
            return (
                CONNECTION,
                "connection failed: the endpoint closed the connection without a response",
            )
        if errno == pycurl.E_PARTIAL_FILE:
            return CONNECTION, "connection failed: the endpoint closed the connection mid-body"
        if errno in (_E_WEIRD_SERVER_REPLY, _E_TOO_LARGE):
            return CONNECTION, f"invalid HTTP response: {message}"
        if errno == pycurl.E_URL_MALFORMAT:
            return INVALID_URL, f"invalid URL: {message}"
        if errno == pycurl.E_UNSUPPORTED_PROTOCOL:
            # The URL was checked before: this is the response ("Received HTTP/0.9...").
            return CONNECTION, f"invalid HTTP response: {message}"
        os_errno = self._os_errno()
        if os_errno:
            return CONNECTION, f"connection failed: {os.strerror(os_errno)}"
        if errno == pycurl.E_RECV_ERROR:  # no system error: libcurl could not parse it
            return CONNECTION, f"invalid HTTP response: {message}"
        return CONNECTION, f"connection failed: {message or f'libcurl error {errno}'}"

    def _os_errno(self) -> int:
        try:
            return self.handle.getinfo(pycurl.OS_ERRNO) if self.handle is not None else 0
        except pycurl.error:
            return 0

    def _refusal(self) -> str:
        """The guard's refusals, said the way an operator reads them."""
        if {address for address, _ in self._refused} == {self._host}:
            return f"{self._host} is {self._refused[0][1]}"
        seen: dict[str, str] = dict(self._refused)  # each address once, in order
        details = "; ".join(f"{address}, {reason}" for address, reason in seen.items())
        return f"{self._host} resolves to {details}"


_E_TOO_LARGE = 100  # CURLE_TOO_LARGE (8.6); pycurl 7.49 has no name for it
_E_WEIRD_SERVER_REPLY = 8  # pycurl names it E_FTP_WEIRD_SERVER_REPLY, its old name
_TLS_ERRORS = frozenset(
    {
        pycurl.E_SSL_CONNECT_ERROR,
        pycurl.E_PEER_FAILED_VERIFICATION,
        pycurl.E_SSL_CERTPROBLEM,
        pycurl.E_SSL_CIPHER,
        pycurl.E_SSL_CACERT_BADFILE,
        pycurl.E_SSL_ENGINE_NOTFOUND,
        pycurl.E_SSL_ENGINE_SETFAILED,
        pycurl.E_SSL_SHUTDOWN_FAILED,
        pycurl.E_SSL_CRL_BADFILE,
        pycurl.E_SSL_ISSUER_ERROR,
        pycurl.E_SSL_PINNEDPUBKEYNOTMATCH,
        pycurl.E_SSL_INVALIDCERTSTATUS,
        pycurl.E_USE_SSL_FAILED,
    }
)


class Transport:
    """Makes Exchanges on easy handles it recycles; see the module docstring.

    `allow_private` turns the SSRF guard off (tests, on-premises installs); `ca_certs`
    replaces certifi's bundle (tests). Up to `max_idle_handles` handles are kept between
    requests, each with its connections (post()); clear() closes them. `resolve` is a
    test hook: libcurl RESOLVE entries ("host:port:address"), so a test can make a name
    resolve to an address without DNS.
    """

    def __init__(
        self,
        *,
        allow_private: bool,
        ca_certs: str | None = None,
        max_idle_handles: int = 64,
        resolve: Sequence[str] = (),
    ) -> None:
        self.allow_private = allow_private
        self.ca_certs = ca_certs or certifi.where()
        self.max_idle_handles = max_idle_handles
        self.resolve = list(resolve)
        self._free: list[pycurl.Curl] = []
        self._lock = threading.Lock()
        self._targets: dict[str, _Target] = {}

    def exchange(
        self,
        url: str,
        body: bytes,
        headers: Mapping[str, str],
        *,
        connect_timeout: float,
        total_timeout: float,
        response_cap_bytes: int,
    ) -> Exchange:
        """An Exchange ready to run: add its handle to a CurlMulti, or perform() it.

        Never raises for a bad URL (the Exchange then has no handle and its result is
        INVALID_URL); raises ValueError for a header with CR, LF or NUL in it, a name
        that is not a token, or a framing header (Host, Content-Length...).
        """
        lines = _header_lines(headers)
        try:
            target = self._target(url)
        except _InvalidURL as exc:
            exchange = Exchange(self, None)
            exchange.result = HttpResult(
                None, 0, f"invalid URL: {exc}"[:_ERROR_CHARS], INVALID_URL, "", None
            )
            return exchange
        handle = self._take()
        exchange = Exchange(
            self,
            handle,
            host=target.host,
            connect_timeout=connect_timeout,
            total_timeout=total_timeout,
            cap=response_cap_bytes,
        )
        total_ms = max(1, round(total_timeout * 1000))
        setopt = handle.setopt
        setopt(pycurl.URL, target.curl_url)
        setopt(pycurl.POSTFIELDS, body)
        setopt(pycurl.HTTPHEADER, lines)
        setopt(pycurl.TIMEOUT_MS, total_ms)
        setopt(pycurl.CONNECTTIMEOUT_MS, min(total_ms, max(1, round(connect_timeout * 1000))))
        setopt(pycurl.WRITEFUNCTION, exchange._on_body)
        setopt(pycurl.HEADERFUNCTION, exchange._on_header)
        if not self.allow_private:
            setopt(pycurl.OPENSOCKETFUNCTION, exchange._open_socket)
        self._configure(handle)
        return exchange

    def _configure(self, handle: pycurl.Curl) -> None:
        """What every request has in common (reset() clears it, so it is set each time)."""
        setopt = handle.setopt
        setopt(pycurl.PROTOCOLS, pycurl.PROTO_HTTP | pycurl.PROTO_HTTPS)
        setopt(pycurl.REDIR_PROTOCOLS, pycurl.PROTO_HTTP | pycurl.PROTO_HTTPS)
        setopt(pycurl.FOLLOWLOCATION, 0)  # a 3xx is a status like any other
        # Never the environment's proxy: through a proxy the socket would go to the
        # proxy's address, which the guard would vet instead of the endpoint's.
        setopt(pycurl.PROXY, "")
        setopt(pycurl.NOPROXY, "*")
        setopt(pycurl.NETRC, pycurl.NETRC_IGNORED)
        # HTTP/1.1 only: the cap closes one connection, not a stream of a shared one,
        # and every endpoint speaks it.
        setopt(pycurl.HTTP_VERSION, pycurl.CURL_HTTP_VERSION_1_1)
        setopt(pycurl.HTTP_CONTENT_DECODING, 0)
        setopt(pycurl.CAINFO, self.ca_certs)
        setopt(pycurl.SSL_VERIFYPEER, 1)
        setopt(pycurl.SSL_VERIFYHOST, 2)
        setopt(pycurl.NOSIGNAL, 1)  # threads: no SIGALRM for timeouts
        # On a timeout, do not wait for a resolver thread stuck on a slow DNS server:
        # the deadline is the deadline.
        setopt(_QUICK_EXIT, 1)
        setopt(pycurl.MAXCONNECTS, CONNECTIONS_PER_HANDLE)
        # libcurl's smallest upload buffer (its default is 64 KiB, allocated per handle):
        # a worker holds hundreds of requests open, and the buffer is a large part of
        # what each one holds (bench/inflight_memory.py; docs/ARCHITECTURE.md).
        setopt(pycurl.UPLOAD_BUFFERSIZE, 16 * 1024)
        if self.resolve:
            setopt(pycurl.RESOLVE, self.resolve)

    def post(
        self,
        url: str,
        body: bytes,
        headers: Mapping[str, str],
        *,
        connect_timeout: float,
        total_timeout: float,
        response_cap_bytes: int,
    ) -> HttpResult:
        """POST once and wait for the result (thread-safe: each call has a handle of its
        own). Redirects are not followed and nothing is retried: a POST may have been
        processed even when it failed, so whether to send it again is policy's call."""
        exchange = self.exchange(
            url,
            body,
            headers,
            connect_timeout=connect_timeout,
            total_timeout=total_timeout,
            response_cap_bytes=response_cap_bytes,
        )
        if exchange.handle is None:
            assert exchange.result is not None
            return exchange.result
        try:
            exchange.handle.perform()
        except pycurl.error as exc:
            errno, message = exc.args
            result = exchange.finish(errno, message)
        else:
            result = exchange.finish(0, "")
        self.release(exchange)
        return result

    def release(self, exchange: Exchange) -> None:
        """Give a finished exchange's handle back for reuse (its connections stay open
        for the next request). Take it out of its CurlMulti first."""
        handle, exchange.handle = exchange.handle, None
        if handle is None:
            return
        handle.reset()  # drops our callbacks, so the exchange's buffers can go
        with self._lock:
            if len(self._free) < self.max_idle_handles:
                self._free.append(handle)
                return
        handle.close()

    def clear(self) -> None:
        """Close every idle handle, and with it its connections."""
        with self._lock:
            idle, self._free = self._free, []
        for handle in idle:
            handle.close()

    def _take(self) -> pycurl.Curl:
        # The most recently used handle first: its connections are the likeliest warm.
        with self._lock:
            if self._free:
                return self._free.pop()
        return pycurl.Curl()

    def _target(self, url: str) -> _Target:
        target = self._targets.get(url)
        if target is None:
            target = _target_for(url)
            if len(self._targets) >= _REMEMBERED_URLS:
                self._targets.clear()
            self._targets[url] = target
        return target


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


def _charset(content_type: str) -> str | None:
    """The charset parameter of a Content-Type value, if any."""
    for param in content_type.split(";")[1:]:
        name, _, value = param.partition("=")
        if name.strip().lower() == "charset":
            return value.strip().strip("\"'") or None
    return None


def _decode(body: bytes, headers: Mapping[str, str]) -> str:
    encoding = _charset(headers.get("content-type", "")) or "utf-8"
    try:
        return body.decode(encoding, errors="replace")
    except LookupError:  # a charset Python does not know
        return body.decode("utf-8", errors="replace")

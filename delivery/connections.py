"""Keep-alive connections for deliveries, per origin, every one opened through the SSRF guard.

A `ConnectionPool` is what a delivery worker's slots share (transport.new_session makes
one). It keeps up to `pool_maxsize` idle connections per origin (scheme, host, port) for
up to HOST_POOLS origins, least recently used first out; an origin pushed out has its
idle sockets closed, so idle file descriptors stay bounded. A connection is taken by one
request at a time and given back only if its response was read cleanly to the end.

It never reads the environment: no HTTP(S)_PROXY, no ~/.netrc. There is no proxy support
at all, on purpose: through a proxy the socket would go to the proxy's address, which the
guard would then vet instead of the destination's.
"""

import select
import socket
import ssl
import threading
from collections import OrderedDict
from dataclasses import dataclass
from urllib.parse import quote, urlsplit

import certifi

from delivery import http11, netguard

# Origins whose idle connections a pool keeps (LRU). Each keeps up to pool_maxsize sockets,
# so this bounds idle file descriptors without reconnecting to every endpoint every time.
HOST_POOLS = 64
# URLs whose parsed route a pool remembers; past this many the memory starts over
# (endpoint URLs are few per process, so this is rarely reached).
_REMEMBERED_URLS = 4096
_DEFAULT_PORTS = {"http": 80, "https": 443}
# What may stay as it is in a request target; anything else (spaces, non-ASCII) is
# percent-encoded, as browsers and urllib3 do.
_TARGET_SAFE = "/?&=%:@!$'()*+,;~-._[]"


class InvalidURL(ValueError):
    """The URL cannot be delivered to (not http(s), no host, a bad port...)."""


@dataclass(frozen=True)
class Route:
    """Where one URL's requests go: the origin's key, and what the request line carries."""

    origin: tuple[str, str, int]  # scheme, host (IDNA, no brackets), port
    target: str  # path and query
    host_header: str


def route_for(url: str) -> Route:
    """Parse `url` into its Route, or raise InvalidURL saying why."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError as exc:
        raise InvalidURL(str(exc)) from None
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS:
        raise InvalidURL(f"{url[:80]!r} is not http(s)://")
    if not parts.hostname:
        raise InvalidURL("no host in the URL")
    if parts.username is not None or parts.password is not None:
        raise InvalidURL("credentials in the URL are not sent; use headers")
    try:
        host = parts.hostname.encode("idna").decode("ascii")
    except UnicodeError:
        raise InvalidURL(f"{parts.hostname[:80]!r}, label empty or too long") from None
    port = port or _DEFAULT_PORTS[scheme]
    shown = f"[{host}]" if ":" in host else host
    host_header = shown if port == _DEFAULT_PORTS[scheme] else f"{shown}:{port}"
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    if not target.isascii() or not target.isprintable() or " " in target:
        target = quote(target, safe=_TARGET_SAFE)
    return Route((scheme, host, port), target, host_header)


class ConnectionPool:
    """Idle keep-alive connections per origin; see the module docstring."""

    def __init__(
        self,
        *,
        pool_maxsize: int,
        allow_private: bool,
        ca_certs: str | None = None,
        host_pools: int = HOST_POOLS,
    ) -> None:
        self.pool_maxsize = pool_maxsize
        self.allow_private = allow_private
        self.host_pools = host_pools
        # Certificates are checked against certifi's bundle, as requests does (the
        # host name too); `ca_certs` replaces the bundle (tests).
        self.tls = ssl.create_default_context(cafile=ca_certs or certifi.where())
        self._lock = threading.Lock()
        self._idle: OrderedDict[tuple[str, str, int], list[socket.socket]] = OrderedDict()
        self._routes: dict[str, Route] = {}

    def route(self, url: str) -> Route:
        """`route_for(url)`, remembered per URL string: a worker posts to the same few
        URLs over and over."""
        route = self._routes.get(url)
        if route is None:
            route = route_for(url)
            if len(self._routes) >= _REMEMBERED_URLS:
                self._routes.clear()
            self._routes[url] = route
        return route

    def take(self, origin: tuple[str, str, int]) -> socket.socket | None:
        """An idle connection to `origin` that is still open, or None."""
        while True:
            with self._lock:
                idle = self._idle.get(origin)
                if not idle:
                    return None
                sock = idle.pop()
            if _still_open(sock):
                return sock
            sock.close()

    def connect(
        self, origin: tuple[str, str, int], connect_timeout: float, deadline: float
    ) -> socket.socket:
        """A new connection to `origin` through the guard (TLS for https, its handshake
        done by `deadline`). Raises what connecting raised: netguard.ForbiddenDestination,
        socket.gaierror, TimeoutError (the TCP connect), http11.DeadlineExceeded (the
        handshake), ssl.SSLError, OSError."""
        scheme, host, port = origin
        sock = netguard.open_checked_socket(
            host, port, allow_private=self.allow_private, timeout=connect_timeout
        )
        try:
            # The request goes out in one send: Nagle's delay would only add latency.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if scheme == "https":
                # The whole handshake within the deadline: CPython counts this timeout
                # down across the handshake's reads and writes.
                sock.settimeout(http11.time_left(deadline))
                try:
                    sock = self.tls.wrap_socket(sock, server_hostname=host)
                except TimeoutError:
                    raise http11.DeadlineExceeded from None
        except BaseException:
            sock.close()
            raise
        return sock

    def give_back(self, origin: tuple[str, str, int], sock: socket.socket) -> None:
        """Keep `sock` for the origin's next request, unless enough are kept already."""
        closed_origins: list[list[socket.socket]] = []
        with self._lock:
            idle = self._idle.get(origin)
            if idle is None:
                idle = self._idle[origin] = []
                while len(self._idle) > self.host_pools:
                    closed_origins.append(self._idle.popitem(last=False)[1])
            else:
                self._idle.move_to_end(origin)
            kept = len(idle) < self.pool_maxsize
            if kept:
                idle.append(sock)
        if not kept:
            sock.close()
        for sockets in closed_origins:
            for old in sockets:
                old.close()

    def clear(self) -> None:
        """Close every idle connection."""
        with self._lock:
            idle, self._idle = self._idle, OrderedDict()
        for sockets in idle.values():
            for sock in sockets:
                sock.close()


def _still_open(sock: socket.socket) -> bool:
    """An idle keep-alive connection has nothing to read: if it is readable, the endpoint
    closed it (or sent something unasked), and a request on it would fail for nothing."""
    poller = select.poll()
    try:
        poller.register(sock, select.POLLIN)
    except (OSError, ValueError):  # closed meanwhile
        return False
    return not poller.poll(0)

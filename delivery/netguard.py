"""The socket layer of outbound HTTP: which addresses a delivery may connect to.

Endpoint URLs are typed by tenants, so a URL is untrusted input that could point the
platform at itself or its network (SSRF: `http://169.254.169.254/`, `http://127.1:6379/`,
a DNS name that answers with 10.0.0.5). Checking the URL when it is saved is not enough:
DNS can answer differently a second later (rebinding), and numeric spellings such as
`2130706433` only reveal themselves once resolved. So the connections made by
`GuardedPoolManager` resolve the host themselves and check the very address they are about to
connect to; nothing else in the process decides where a delivery's socket goes.

The same connections also tell the transport, through `watch_sockets`, which socket a
request is using, so its deadline watchdog can shut that socket down (see transport.py).
"""

import ipaddress
import socket
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any
from urllib.parse import urlsplit

from django.core.exceptions import ValidationError
from urllib3 import PoolManager
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool
from urllib3.exceptions import (
    ClosedPoolError,
    ConnectTimeoutError,
    LocationParseError,
    NameResolutionError,
    NewConnectionError,
)
from urllib3.util.connection import allowed_gai_family
from urllib3.util.timeout import _DEFAULT_TIMEOUT, _TYPE_DEFAULT
from urllib3.util.url import parse_url

# Idle per-host pools a GuardedPoolManager keeps (LRU). Each holds up to pool_maxsize sockets, so
# this bounds idle file descriptors without reconnecting to every endpoint every time.
HOST_POOLS = 64
# URLs whose pool and request target GuardedPoolManager.pool_for remembers; past this many
# the memory starts over (endpoint URLs are few per process, so this is rarely reached).
_REMEMBERED_URLS = 4096

_CGNAT = ipaddress.ip_network("100.64.0.0/10")
_PRIVATE = tuple(
    ipaddress.ip_network(net)
    for net in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7")
)
# NAT64's well-known prefix carries an IPv4 address in its last 32 bits; judge that address,
# so an IPv6-only host with DNS64 can still reach public IPv4 endpoints.
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


class ForbiddenDestination(Exception):
    """A connection refused because the destination is not a public address.

    Deliberately not an OSError: urllib3 would wrap that as an ordinary
    connection error (and urllib3 might retry it), while this must reach the transport
    as itself to become a permanent failure.
    """


def is_forbidden_address(ip: str) -> str | None:
    """Why a delivery must not connect to `ip` ("a loopback address"), or None if it may.

    Addresses that embed an IPv4 address (IPv4-mapped, 6to4, NAT64) are judged by the
    embedded one: `::ffff:127.0.0.1` is loopback. Anything unparseable is refused.
    """
    try:
        address = ipaddress.ip_address(ip)
    except ValueError:
        return "a malformed address"
    if isinstance(address, ipaddress.IPv6Address):
        embedded, how = _embedded_ipv4(address)
        if embedded is not None:
            reason = is_forbidden_address(str(embedded))
            return f"{reason} ({how} {embedded})" if reason else None
    return _special_purpose(address)


def _embedded_ipv4(address: ipaddress.IPv6Address) -> tuple[ipaddress.IPv4Address | None, str]:
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped, "IPv4-mapped"
    if address.sixtofour is not None:
        return address.sixtofour, "6to4 for"
    if address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF), "NAT64 for"
    return None, ""


def _special_purpose(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    # Most specific first, so the reason names the range an operator would recognise.
    if address.is_unspecified:
        return "an unspecified address"
    if address.is_loopback:
        return "a loopback address"
    if address == ipaddress.IPv4Address("255.255.255.255"):
        return "a broadcast address"
    if address.is_link_local:
        return "a link-local address"
    if address.is_multicast:
        return "a multicast address"
    if address in _CGNAT:
        return "a carrier-grade NAT address"
    if any(address in net for net in _PRIVATE):
        return "a private address"
    if address.is_reserved:
        return "a reserved address"
    if isinstance(address, ipaddress.IPv6Address) and address.is_site_local:
        return "a site-local address"
    if not address.is_global:
        return "a non-public address"
    return None


def validate_destination_url(url: str, *, allow_private: bool) -> None:
    """Refuse an endpoint URL that cannot or must not be delivered to (the admin form's check).

    A name that resolves to several addresses is refused if any of them is forbidden:
    at save time strictness costs nothing, and the operator gets a clear message. The
    connection-time check in GuardedAdapter still applies to every delivery.
    """
    try:
        parts = urlsplit(url.strip())
    except ValueError:
        raise ValidationError("This is not a valid URL.", code="invalid") from None
    if parts.scheme.lower() not in ("http", "https"):
        raise ValidationError("The URL must start with http:// or https://.", code="scheme")
    if parts.username is not None or parts.password is not None:
        raise ValidationError(
            "The URL must not contain a username or password; send credentials in headers.",
            code="userinfo",
        )
    host = parts.hostname
    if not host:
        raise ValidationError("The URL must include a host name.", code="host")
    try:
        port = parts.port
    except ValueError:
        raise ValidationError(
            "The URL's port is not a number between 0 and 65535.", code="port"
        ) from None
    if allow_private:
        return
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        raise ValidationError(f"The host {host!r} does not resolve.", code="unresolvable") from None
    for *_, sockaddr in infos:
        reason = is_forbidden_address(sockaddr[0])
        if reason:
            raise ValidationError(
                f"The host {host!r} resolves to {sockaddr[0]}, {reason}; "
                "deliveries to internal networks are not allowed.",
                code="forbidden_destination",
            )


def _open_checked_socket(
    host: str,
    port: int,
    *,
    allow_private: bool,
    timeout: float | _TYPE_DEFAULT | None,
    source_address: tuple[str, int] | None,
    socket_options: list[tuple[int, int, int | bytes]] | None,
) -> socket.socket:
    """urllib3's create_connection, but only to addresses that pass is_forbidden_address.

    Resolving here and connecting to the same sockaddr is what makes DNS rebinding useless:
    no second lookup happens between the check and the connect. Forbidden addresses among
    several answers are skipped; the connection is refused only when none is left.
    """
    host = host.strip("[]")
    try:
        infos = socket.getaddrinfo(host, port, allowed_gai_family(), socket.SOCK_STREAM)
    except UnicodeError:  # a label IDNA cannot encode; urllib3 reports it the same way
        raise LocationParseError(f"'{host}', label empty or too long") from None
    allowed, refused = [], []
    for family, kind, proto, _, sockaddr in infos:
        reason = None if allow_private else is_forbidden_address(sockaddr[0])
        if reason:
            refused.append((sockaddr[0], reason))
        else:
            allowed.append((family, kind, proto, sockaddr))
    if not allowed:
        if [address for address, _ in refused] == [host]:
            raise ForbiddenDestination(f"{host} is {refused[0][1]}")
        details = "; ".join(f"{address}, {reason}" for address, reason in refused)
        raise ForbiddenDestination(f"{host} resolves to {details}")
    errors: list[OSError] = []
    for family, kind, proto, sockaddr in allowed:
        sock = socket.socket(family, kind, proto)
        try:
            for option in socket_options or ():
                sock.setsockopt(*option)
            if timeout is not _DEFAULT_TIMEOUT:
                sock.settimeout(timeout)
            if source_address:
                sock.bind(source_address)
            sock.connect(sockaddr)
        except OSError as exc:
            sock.close()
            errors.append(exc)
        else:
            return sock
    raise errors[-1]


class _GuardedConnectionMixin:
    """Replaces the socket-opening step of urllib3's connections; TLS, SNI, and certificate
    checks on the host name are untouched because they happen after `_new_conn`."""

    def __init__(self, *args: Any, allow_private: bool = False, **kwargs: Any) -> None:
        self.allow_private = allow_private
        super().__init__(*args, **kwargs)

    def _new_conn(self) -> socket.socket:
        # Same exception mapping as urllib3's own _new_conn, so errors read as usual.
        try:
            sock = _open_checked_socket(
                self._dns_host,
                self.port,
                allow_private=self.allow_private,
                timeout=self.timeout,
                source_address=self.source_address,
                socket_options=self.socket_options,
            )
        except socket.gaierror as exc:
            raise NameResolutionError(self.host, self, exc) from exc
        except TimeoutError as exc:
            raise ConnectTimeoutError(
                self, f"Connection to {self.host} timed out. (connect timeout={self.timeout})"
            ) from exc
        except OSError as exc:
            raise NewConnectionError(self, f"Failed to establish a new connection: {exc}") from exc
        sys.audit("http.client.connect", self, self.host, self.port)
        _announce(sock)
        return sock

    def request(self, *args: Any, **kwargs: Any) -> None:
        if self.sock is not None:  # a pooled connection, opened during an earlier request
            _announce(self.sock)
        super().request(*args, **kwargs)


class GuardedHTTPConnection(_GuardedConnectionMixin, HTTPConnection):
    pass


class GuardedHTTPSConnection(_GuardedConnectionMixin, HTTPSConnection):
    pass


_CONNECTIONS = {"http": GuardedHTTPConnection, "https": GuardedHTTPSConnection}


class GuardedPoolManager(PoolManager):
    """urllib3's PoolManager whose every connection goes through the address check.
    There is no proxy variant: through a proxy the socket would go to the proxy's address,
    which the check would then vet instead of the destination's."""

    # The flag travels on each pool's conn_kw rather than in connection_pool_kw, because
    # urllib3 builds its pool keys from connection_pool_kw and rejects unknown names.
    def __init__(self, *args: Any, allow_private: bool, **kwargs: Any) -> None:
        self.allow_private = allow_private
        self._targets: dict[str, tuple[HTTPConnectionPool, str]] = {}
        super().__init__(*args, **kwargs)
        # urllib3 2 drops an evicted pool without closing it, leaving its idle sockets to
        # the garbage collector; pool_for may still hold it. Closed, its sockets go now
        # (so HOST_POOLS really bounds them) and pool_for knows to look again.
        self.pools.dispose_func = HTTPConnectionPool.close

    def pool_for(self, url: str) -> tuple[HTTPConnectionPool, str]:
        """The connection pool for `url`'s scheme, host and port, and the request target
        (path and query) to send on it.

        PoolManager.urlopen parses the URL and looks its pool up again on every request,
        ~7% of a delivery worker's CPU (bench/delivery.py --py-spy); a worker posts to the
        same few URLs over and over, so both are remembered per URL string. A pool the
        manager has since evicted (and closed) is looked up afresh.
        """
        remembered = self._targets.get(url)
        if remembered is not None and remembered[0].pool is not None:
            return remembered
        parts = parse_url(url)
        pool = self.connection_from_host(parts.host, port=parts.port, scheme=parts.scheme)
        if len(self._targets) >= _REMEMBERED_URLS:
            self._targets.clear()
        self._targets[url] = (pool, parts.request_uri)
        return pool, parts.request_uri

    def post(self, url: str, **kw: Any) -> Any:
        """POST through `pool_for(url)`'s pool (the keywords are HTTPConnectionPool.urlopen's).

        A pool closed by eviction between the lookup and the request fails before anything
        is sent (ClosedPoolError), so that one case is tried again on a fresh pool.
        """
        pool, target = self.pool_for(url)
        try:
            return pool.urlopen("POST", target, assert_same_host=False, **kw)
        except ClosedPoolError:  # now closed, so pool_for looks the URL up again
            pool, target = self.pool_for(url)
            return pool.urlopen("POST", target, assert_same_host=False, **kw)

    def _new_pool(
        self, scheme: str, host: str, port: int, request_context: dict[str, Any] | None = None
    ) -> HTTPConnectionPool:
        pool = super()._new_pool(scheme, host, port, request_context)
        pool.ConnectionCls = _CONNECTIONS[scheme]
        pool.conn_kw["allow_private"] = self.allow_private
        return pool


_socket_watcher: ContextVar[Callable[[socket.socket], None] | None] = ContextVar(
    "socket_watcher", default=None
)


@contextmanager
def watch_sockets(callback: Callable[[socket.socket], None]) -> Iterator[None]:
    """Call `callback(sock)` for each socket a guarded connection uses in this context.

    A freshly opened socket is announced before any TLS handshake (so a handshake can be
    cut short too) and a pooled one when a request starts on it. The callback runs in the
    requesting thread and must not block.
    """
    token = _socket_watcher.set(callback)
    try:
        yield
    finally:
        _socket_watcher.reset(token)


def _announce(sock: socket.socket) -> None:
    callback = _socket_watcher.get()
    if callback is not None:
        callback(sock)

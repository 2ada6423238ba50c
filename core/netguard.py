"""Which addresses a delivery may connect to: the SSRF guard.

Endpoint URLs are typed by tenants, so a URL is untrusted input that could point the
platform at itself or its network (SSRF: `http://169.254.169.254/`, `http://127.1:6379/`,
a DNS name that answers with 10.0.0.5). Checking the URL when it is saved is not enough:
DNS can answer differently a second later (rebinding), and numeric spellings such as
`2130706433` only reveal themselves once resolved. So the transport asks
`is_forbidden_address` about the very address libcurl is about to connect to, for every
new connection (its OPENSOCKETFUNCTION, delivery/pipeline/transport.py); a refused address gets
no socket at all. `validate_destination_url` is the admin form's early, friendlier check.
"""

import ipaddress
import re
import socket
from urllib.parse import urlsplit

from django.core.exceptions import ValidationError

_CGNAT = ipaddress.ip_network("100.64.0.0/10")
_PRIVATE = tuple(
    ipaddress.ip_network(net)
    for net in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7")
)
# NAT64's well-known prefix carries an IPv4 address in its last 32 bits; judge that address,
# so an IPv6-only host with DNS64 can still reach public IPv4 endpoints.
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


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


# RFC 3986's characters: a path, query or fragment is pchars (unreserved, sub-delims, ":",
# "@", percent-encodings) and "/" ("?" too after the path); an authority the same, with
# "[" and "]" around an IPv6 host.
_PCHAR = r"(?:[A-Za-z0-9\-._~!$&'()*+,;=:@]|%[0-9A-Fa-f]{2})"
_PATH = re.compile(rf"(?:{_PCHAR}|/)*")
_QUERY = re.compile(rf"(?:{_PCHAR}|[/?])*")
_AUTHORITY = re.compile(r"(?:[A-Za-z0-9\-._~!$&'()*+,;=:@\[\]]|%[0-9A-Fa-f]{2})*")


def is_uri(url: str) -> bool:
    """Whether `url` is a URI as RFC 3986 writes one: ASCII, with spaces, non-ASCII text
    and the characters it leaves out (such as ^ { } | and a second #) percent-encoded.
    The API documents its URLs as such (OpenAPI `format: uri`); the forms take what a
    browser would, and the transport encodes it."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return False
    return bool(
        _AUTHORITY.fullmatch(parts.netloc)
        and _PATH.fullmatch(parts.path)
        and _QUERY.fullmatch(parts.query)
        and _QUERY.fullmatch(parts.fragment)
        and "#" not in parts.fragment
    )


def validate_destination_url(url: str, *, allow_private: bool) -> None:
    """Refuse an endpoint URL that cannot or must not be delivered to (the admin form's check).

    A name that resolves to several addresses is refused if any of them is forbidden:
    at save time strictness costs nothing, and the operator gets a clear message. The
    connection-time check in the transport still applies to every delivery.
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

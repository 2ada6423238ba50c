"""The SSRF guard: which addresses are refused, at connect time and in the endpoint form.

Names are made to resolve without DNS in two ways: for validate_destination_url (Python's
socket.getaddrinfo) by monkeypatching it (`fake_dns`), and for deliveries (libcurl, which
resolves in C) with libcurl's RESOLVE entries, Transport's `resolve` test hook."""

import socket
from collections.abc import Callable, Iterator

import pytest
from django.core.exceptions import ValidationError

from core import netguard
from core.netguard import is_forbidden_address, is_uri, validate_destination_url
from delivery.pipeline import transport
from tests.http_receivers import Recorder, ScriptedServer


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("127.0.0.1", "a loopback address"),
        ("127.255.0.9", "a loopback address"),
        ("::1", "a loopback address"),
        ("10.1.2.3", "a private address"),
        ("172.16.0.1", "a private address"),
        ("192.168.1.1", "a private address"),
        ("fd00::1", "a private address"),
        ("169.254.169.254", "a link-local address"),
        ("fe80::1", "a link-local address"),
        ("fe80::1%lo", "a link-local address"),
        ("100.64.0.1", "a carrier-grade NAT address"),
        ("100.127.255.254", "a carrier-grade NAT address"),
        ("224.0.0.1", "a multicast address"),
        ("ff02::1", "a multicast address"),
        ("0.0.0.0", "an unspecified address"),  # noqa: S104 (an address to judge, not to bind)
        ("::", "an unspecified address"),
        ("255.255.255.255", "a broadcast address"),
        ("240.0.0.1", "a reserved address"),
        ("::7f00:1", "a reserved address"),  # IPv4-compatible (deprecated) ::127.0.0.1
        ("fec0::1", "a site-local address"),
        ("192.0.2.10", "a non-public address"),  # documentation range
        ("198.18.0.1", "a non-public address"),  # benchmarking range
        ("2001:db8::1", "a non-public address"),  # IPv6 documentation range
        ("::ffff:127.0.0.1", "a loopback address (IPv4-mapped 127.0.0.1)"),
        ("::ffff:10.0.0.1", "a private address (IPv4-mapped 10.0.0.1)"),
        ("::ffff:169.254.169.254", "a link-local address (IPv4-mapped 169.254.169.254)"),
        ("2002:7f00:1::", "a loopback address (6to4 for 127.0.0.1)"),
        ("2002:a9fe:a9fe::1", "a link-local address (6to4 for 169.254.169.254)"),
        ("64:ff9b::7f00:1", "a loopback address (NAT64 for 127.0.0.1)"),
        ("64:ff9b::a00:1", "a private address (NAT64 for 10.0.0.1)"),
        ("64:ff9b:1::a00:1", "a reserved address"),  # local-use NAT64 prefix
        ("not-an-ip", "a malformed address"),
    ],
)
def test_forbidden_addresses_say_why(address, reason):
    assert is_forbidden_address(address) == reason


@pytest.mark.parametrize(
    "address",
    [
        "8.8.8.8",
        "1.1.1.1",
        "93.184.216.34",
        "2606:4700:4700::1111",
        "::ffff:8.8.8.8",
        "2002:808:808::1",  # 6to4 for 8.8.8.8
        "64:ff9b::808:808",  # NAT64 for 8.8.8.8: IPv6-only hosts behind DNS64 still deliver
    ],
)
def test_public_addresses_are_allowed(address):
    assert is_forbidden_address(address) is None


@pytest.fixture
def strict_session() -> Iterator[transport.Transport]:
    session = transport.Transport(allow_private=False, max_idle_handles=2)
    yield session
    session.clear()


@pytest.fixture
def endpoint() -> Iterator[Recorder]:
    """A real receiver on 127.0.0.1: if the guard ever let a request through, it would see it."""
    with Recorder() as recorder:
        yield recorder


def post(session: transport.Transport, url: str) -> transport.HttpResult:
    return session.post(
        url, b"{}", {}, connect_timeout=1.0, total_timeout=2.0, response_cap_bytes=100
    )


@pytest.fixture
def fake_dns(monkeypatch) -> Callable[..., None]:
    """Make chosen names resolve to chosen addresses, one answer per lookup (the last
    repeats), so rebinding can be played; every other name resolves as usual."""
    real_getaddrinfo = socket.getaddrinfo
    answers: dict[str, list[list[str]]] = {}

    def getaddrinfo(host, port, *args, **kwargs):
        if host not in answers:
            return real_getaddrinfo(host, port, *args, **kwargs)
        queue = answers[host]
        addresses = queue.pop(0) if len(queue) > 1 else queue[0]
        if not addresses:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [
            info
            for address in addresses
            for info in real_getaddrinfo(address, port, type=socket.SOCK_STREAM)
        ]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)

    def resolve(host: str, *lookups: list[str]) -> None:
        answers[host] = list(lookups)

    return resolve


@pytest.mark.parametrize(
    ("host", "error"),
    [
        ("127.0.0.1", "127.0.0.1 is a loopback address"),
        ("127.1", "127.1 resolves to 127.0.0.1, a loopback address"),
        ("2130706433", "2130706433 resolves to 127.0.0.1, a loopback address"),
        ("0x7f.1", "0x7f.1 resolves to 127.0.0.1, a loopback address"),
        ("0177.0.0.1", "0177.0.0.1 resolves to 127.0.0.1, a loopback address"),
        ("[::1]", "::1 is a loopback address"),
        ("[::ffff:127.0.0.1]", "::ffff:127.0.0.1 is a loopback address (IPv4-mapped 127.0.0.1)"),
        ("169.254.169.254", "169.254.169.254 is a link-local address"),
        ("100.64.0.1", "100.64.0.1 is a carrier-grade NAT address"),
        ("[fd00::1]", "fd00::1 is a private address"),
        ("0.0.0.0", "0.0.0.0 is an unspecified address"),  # noqa: S104 (Linux connects it to loopback)
        ("10.0.0.1", "10.0.0.1 is a private address"),
    ],
)
def test_guarded_session_refuses_internal_destinations(strict_session, endpoint, host, error):
    # The port is the live receiver's, so a guard that let 127.x through would be caught.
    result = post(strict_session, f"http://{host}:{endpoint.port}/")
    assert (result.status_code, result.error_kind) == (None, transport.FORBIDDEN_DESTINATION)
    assert result.error == f"forbidden destination: {error}"
    assert endpoint.requests == []


def test_a_name_resolving_to_a_private_address_is_refused(endpoint):
    port = endpoint.port
    session = transport.Transport(
        allow_private=False, resolve=[f"hooks.customer.example:{port}:10.20.30.40,127.0.0.1"]
    )
    result = post(session, f"http://hooks.customer.example:{port}/")
    assert result.error_kind == transport.FORBIDDEN_DESTINATION
    assert result.error == (
        "forbidden destination: hooks.customer.example resolves to "
        "10.20.30.40, a private address; 127.0.0.1, a loopback address"
    )
    assert endpoint.requests == []


def test_dns_rebinding_after_validation_is_refused_at_connect(endpoint, fake_dns):
    # given: the name looked public when the endpoint was saved...
    fake_dns("rebind.example", ["93.184.216.34"])
    validate_destination_url(f"http://rebind.example:{endpoint.port}/", allow_private=False)
    # when: ...and answers with loopback when the delivery connects
    session = transport.Transport(
        allow_private=False, resolve=[f"rebind.example:{endpoint.port}:127.0.0.1"]
    )
    result = post(session, f"http://rebind.example:{endpoint.port}/")
    # then
    assert result.error_kind == transport.FORBIDDEN_DESTINATION
    assert (
        result.error
        == "forbidden destination: rebind.example resolves to 127.0.0.1, a loopback address"
    )
    assert endpoint.requests == []


def test_a_public_answer_among_forbidden_ones_is_the_one_connected_to(endpoint):
    """Refused addresses are skipped, not fatal: libcurl goes on to the next one. (The
    'public' address here is the receiver's own, let through by a guard that only
    refuses 10/8, so that the test needs no route to the internet.)"""
    port = endpoint.port
    session = transport.Transport(
        allow_private=False, resolve=[f"mixed.example:{port}:10.9.8.7,127.0.0.1"]
    )
    checked: list[str] = []

    def only_ten(ip: str) -> str | None:
        checked.append(ip)
        return "a private address" if ip.startswith("10.") else None

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(netguard, "is_forbidden_address", only_ten)
        result = post(session, f"http://mixed.example:{port}/")
    assert (result.status_code, result.error_kind) == (200, "")
    assert checked == ["10.9.8.7", "127.0.0.1"]
    assert len(endpoint.wait_for(1)) == 1


def test_allow_private_reaches_a_local_receiver(endpoint):
    session = transport.Transport(max_idle_handles=2, allow_private=True)
    session.resolve = [f"receiver.internal:{endpoint.port}:127.0.0.1"]
    for host in ("127.0.0.1", "127.1", "receiver.internal"):
        result = post(session, f"http://{host}:{endpoint.port}/")
        assert (result.status_code, result.error_kind) == (200, "")
    assert len(endpoint.wait_for(3)) == 3


def test_every_new_connection_is_checked_with_the_address_connected_to(endpoint, monkeypatch):
    """The guard sees the address libcurl is about to connect to, for http and https
    (before any handshake), and again for each new connection to the same origin (here
    the receiver closes after each answer, so the second request needs a new one)."""
    checked: list[str] = []

    def spy(ip: str) -> str | None:
        checked.append(ip)
        return "refused by the test" if ip == "127.0.0.2" else None

    monkeypatch.setattr(netguard, "is_forbidden_address", spy)
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
    with ScriptedServer(answer, close_after=True) as server:
        session = transport.Transport(
            allow_private=False,
            resolve=[
                f"a.example:{server.port}:127.0.0.1",
                f"b.example:{endpoint.port}:127.0.0.2",
            ],
        )
        first = post(session, f"http://a.example:{server.port}/")
        server.wait_closed()
        second = post(session, f"http://a.example:{server.port}/")
        assert (first.status_code, second.status_code) == (200, 200)
        assert len(server.connections) == 2
    assert checked == ["127.0.0.1", "127.0.0.1"]
    for scheme in ("http", "https"):
        refused = post(session, f"{scheme}://b.example:{endpoint.port}/")
        assert refused.error == (
            "forbidden destination: b.example resolves to 127.0.0.2, refused by the test"
        )
    assert checked[2:] == ["127.0.0.2", "127.0.0.2"]
    assert endpoint.requests == []


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("ftp://example.com/hook", "The URL must start with http:// or https://."),
        ("example.com/hook", "The URL must start with http:// or https://."),
        ("javascript:alert(1)", "The URL must start with http:// or https://."),
        ("https://user:secret@example.com/", "must not contain a username or password"),
        ("https://token@example.com/", "must not contain a username or password"),
        ("https:///hook", "The URL must include a host name."),
        ("https://example.com:99999/", "The URL's port is not a number between 0 and 65535."),
        ("http://[::1/", "This is not a valid URL."),
        ("http://gone.example/", "The host 'gone.example' does not resolve."),
        (
            "http://127.0.0.1:8000/",
            "The host '127.0.0.1' resolves to 127.0.0.1, a loopback address; "
            "deliveries to internal networks are not allowed.",
        ),
        (
            "https://metadata.example/",
            "The host 'metadata.example' resolves to 169.254.169.254, a link-local address; "
            "deliveries to internal networks are not allowed.",
        ),
        ("http://2130706433/", "resolves to 127.0.0.1, a loopback address"),
        ("http://[::ffff:10.0.0.1]/", "resolves to ::ffff:10.0.0.1, a private address"),
    ],
)
def test_validate_destination_url_explains_the_refusal(fake_dns, url, message):
    fake_dns("gone.example", [])
    fake_dns("metadata.example", ["169.254.169.254"])
    with pytest.raises(ValidationError) as refused:
        validate_destination_url(url, allow_private=False)
    assert message in refused.value.messages[0]


def test_validate_destination_url_refuses_a_name_with_any_internal_address(fake_dns):
    fake_dns("mixed.example", ["93.184.216.34", "10.0.0.5"])
    with pytest.raises(ValidationError, match=r"10\.0\.0\.5, a private address"):
        validate_destination_url("https://mixed.example/", allow_private=False)


@pytest.mark.parametrize(
    "url", ["https://hooks.example/in", "http://hooks.example:8080/a?b=c", "HTTPS://hooks.example"]
)
def test_validate_destination_url_accepts_public_http_urls(fake_dns, url):
    fake_dns("hooks.example", ["93.184.216.34"])
    validate_destination_url(url, allow_private=False)


def test_validate_destination_url_with_allow_private_skips_the_address_check():
    validate_destination_url("http://127.0.0.1:8000/hook", allow_private=True)
    validate_destination_url("http://localhost/hook", allow_private=True)
    with pytest.raises(ValidationError, match="username or password"):
        validate_destination_url("http://u:p@localhost/", allow_private=True)


@pytest.mark.parametrize(
    ("url", "uri"),
    [
        ("https://example.com/hook?x=1&y=2#top", True),
        ("http://[::1]:8080/a;b=c/%7Bd%7D", True),
        ("http://127.0.0.1:9/a?b?c", True),
        ("http://127.0.0.1:9/a b", False),  # a space
        ("http://127.0.0.1:9/héllo", False),  # non-ASCII, not percent-encoded
        ("http://127.0.0.1:9/*&^Q@}Y~W!^", False),  # ^ and } are not URI characters
        ("http://127.0.0.1:9/[x]", False),  # brackets belong to an IPv6 host only
        ("http://127.0.0.1:9/a%zz", False),  # a broken percent-encoding
        ("http://127.0.0.1:9/a#b#c", False),  # a second fragment
    ],
)
def test_is_uri_follows_rfc_3986(url: str, uri: bool) -> None:
    assert is_uri(url) is uri

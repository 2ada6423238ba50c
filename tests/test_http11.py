"""The HTTP/1.1 the transport speaks, against raw scripted servers on 127.0.0.1: response
framings, interim responses, malformed answers, and when a connection may be reused."""

import socket
import time
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from delivery import http11, transport
from delivery.connections import ConnectionPool, InvalidURL, route_for
from tests.http_receivers import Recorder, ScriptedServer

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


@pytest.fixture
def session() -> Iterator[ConnectionPool]:
    session = transport.new_session(pool_maxsize=4, allow_private=True)
    yield session
    session.clear()


def post(session: ConnectionPool, url: str, cap: int = 1000, **headers: str):
    return transport.post(
        session,
        url,
        b"{}",
        headers,
        connect_timeout=2.0,
        total_timeout=3.0,
        response_cap_bytes=cap,
    )


def twice(session: ConnectionPool, answer: bytes, cap: int = 1000):
    """Post twice to a server giving `answer` to both: the results, and how many
    connections the two requests took."""
    with ScriptedServer(answer, OK) as server:
        results = [post(session, server.url, cap), post(session, server.url, cap)]
        connections = len(server.connections)
    return results, connections


def test_a_chunked_body_is_decoded_and_its_connection_reused(session):
    answer = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5;ext=1\r\nhello\r\n7\r\n, world\r\n0\r\nX-Trailer: yes\r\n\r\n"
    )
    (first, second), connections = twice(session, answer)
    assert (first.status_code, first.error_kind, first.response_excerpt) == (
        200,
        "",
        "hello, world",
    )
    assert (second.status_code, second.response_excerpt) == (200, "ok")
    assert connections == 1


def test_a_chunked_body_past_the_cap_is_cut_and_its_connection_closed(session):
    answer = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nabcd\r\n4\r\nefgh\r\n0\r\n\r\n"
    )
    (first, second), connections = twice(session, answer, cap=6)
    assert (first.status_code, first.error_kind, first.response_excerpt) == (200, "", "abcdef")
    assert second.status_code == 200
    assert connections == 2


def test_interim_responses_are_skipped(session):
    answer = (
        b"HTTP/1.1 100 Continue\r\n\r\n"
        b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n" + OK
    )
    (first, _), connections = twice(session, answer)
    assert (first.status_code, first.error_kind, first.response_excerpt) == (200, "", "ok")
    assert connections == 1


def test_bare_line_feeds_are_read_like_crlf(session):
    (first, _), _ = twice(session, b"HTTP/1.1 201 Created\nContent-Length: 3\n\nyes")
    assert (first.status_code, first.error_kind, first.response_excerpt) == (201, "", "yes")


def test_no_content_has_no_body_and_keeps_the_connection(session):
    (first, second), connections = twice(session, b"HTTP/1.1 204 No Content\r\n\r\n")
    assert (first.status_code, first.error_kind, first.response_excerpt) == (204, "", "")
    assert (second.status_code, connections) == (200, 1)


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok",
        b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok",
        # Both framings at once (a request-smuggling pattern): read as chunked, never reused.
        b"HTTP/1.1 200 OK\r\nContent-Length: 40\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
        # More bytes than the response declared: the extra is unexplained.
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1 200 OK\r\n",
    ],
    ids=["connection-close", "http-1.0", "chunked-and-length", "extra-bytes"],
)
def test_a_connection_is_reused_only_after_a_plainly_framed_response(session, answer):
    (first, second), connections = twice(session, answer)
    assert (first.status_code, first.error_kind, first.response_excerpt) == (200, "", "ok")
    assert second.status_code == 200
    assert connections == 2


def test_a_body_read_until_close_is_complete_at_the_close(session):
    with ScriptedServer(b"HTTP/1.1 200 OK\r\n\r\nuntil the end", close_after=True) as server:
        result = post(session, server.url)
    assert (result.status_code, result.error_kind, result.response_excerpt) == (
        200,
        "",
        "until the end",
    )


@pytest.mark.parametrize(
    ("answer", "status", "error"),
    [
        (b"HTP/1.1 200 OK\r\n\r\n", None, "invalid HTTP response: malformed status line"),
        (b"HTTP/1.1 2000 OK\r\n\r\n", None, "invalid HTTP response: malformed status line"),
        (b"HTTP/1.1 200 OK\r\nno colon\r\n\r\n", None, "invalid HTTP response: malformed header"),
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 2, 3\r\n\r\nok",
            200,
            "invalid HTTP response: invalid Content-Length",
        ),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            200,
            "invalid HTTP response: malformed chunk size",
        ),
        (
            b"HTTP/1.1 101 Switching Protocols\r\n\r\n",
            101,
            "invalid HTTP response: unexpected 101",
        ),
        (
            b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n",
            None,
            "invalid HTTP response: response headers too large",
        ),
    ],
    ids=["protocol", "status", "header", "length", "chunk", "upgrade", "huge-head"],
)
def test_a_malformed_response_is_a_connection_failure(session, answer, status, error):
    with ScriptedServer(answer) as server:
        result = post(session, server.url)
    assert (result.status_code, result.error_kind) == (status, transport.CONNECTION)
    assert result.error.startswith(error)


def test_a_body_cut_short_by_the_close_keeps_what_arrived(session):
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhalf"
    with ScriptedServer(answer, close_after=True) as server:
        result = post(session, server.url)
    assert (result.status_code, result.error_kind) == (200, transport.CONNECTION)
    assert result.error == "connection failed: the endpoint closed the connection mid-body"
    assert result.response_excerpt == "half"


def test_an_idle_connection_the_endpoint_closed_is_not_used(session):
    # The endpoint keeps no idle connections (closes after each answer, without saying so):
    # the pooled socket is seen closed before use, so the second request is not lost on it.
    with ScriptedServer(OK, close_after=True) as server:
        first = post(session, server.url)
        server.wait_closed()
        time.sleep(0.05)
        second = post(session, server.url)
        connections = len(server.connections)
    assert (first.status_code, second.status_code, second.error_kind) == (200, 200, "")
    assert connections == 2


def test_the_request_is_well_formed_on_the_wire(session):
    with ScriptedServer(OK) as server:
        post(session, server.url.rstrip("/") + "/hook/café?q=a b&x=1#fragment", **{"X-Id": "7"})
        [head] = server.heads
    lines = head.decode("latin-1").split("\r\n")
    assert lines[0] == "POST /hook/caf%C3%A9?q=a%20b&x=1 HTTP/1.1"
    assert lines[1] == f"Host: 127.0.0.1:{server.port}"
    assert set(lines[2:]) == {"Accept-Encoding: identity", "X-Id: 7", "Content-Length: 2"}


@pytest.mark.parametrize(
    "headers",
    [
        {"X-Evil": "a\r\nX-Injected: 1"},
        {"X-Evil": "a\nb"},
        {"X-Evil": "a\0b"},
        {"Bad Name": "a"},
        {"Host": "elsewhere.example"},
        {"Content-Length": "0"},
    ],
)
def test_a_header_that_would_change_the_request_is_refused(session, headers):
    with Recorder() as endpoint:
        with pytest.raises(ValueError, match="header"):
            post(session, endpoint.url, **headers)
        time.sleep(0.05)
        assert endpoint.requests == []


@pytest.mark.parametrize(
    ("url", "origin", "target", "host"),
    [
        ("http://Example.COM/a?b=1", ("http", "example.com", 80), "/a?b=1", "example.com"),
        ("https://example.com:8443", ("https", "example.com", 8443), "/", "example.com:8443"),
        ("http://[::1]:8080/x", ("http", "::1", 8080), "/x", "[::1]:8080"),
        ("https://bücher.example/", ("https", "xn--bcher-kva.example", 443), "/", None),
    ],
)
def test_route_for(url, origin, target, host):
    route = route_for(url)
    assert (route.origin, route.target) == (origin, target)
    assert route.host_header == (host or origin[1])


@pytest.mark.parametrize(
    "url", ["http://user:pw@example.com/", "gopher://example.com/", "http://", "http://h:99999/"]
)
def test_route_for_refuses_what_cannot_be_delivered_to(url):
    with pytest.raises(InvalidURL):
        route_for(url)


def _read(answer: bytes, cap: int = 1000) -> http11.Response:
    """Parse `answer` as the endpoint's whole output (then it closes the connection)."""
    ours, theirs = socket.socketpair()
    with ours, theirs:
        theirs.sendall(answer)
        theirs.shutdown(socket.SHUT_WR)
        response = http11.Response(ours, time.monotonic() + 2)
        response.read_head()
        response.read_body(cap)
        return response


@given(
    body=st.binary(max_size=3000),
    cuts=st.lists(st.integers(min_value=1, max_value=3000), max_size=8),
    cap=st.integers(min_value=0, max_value=4000),
)
def test_any_chunking_of_a_body_reads_back_as_the_body_up_to_the_cap(body, cuts, cap):
    chunks, start = [], 0
    for cut in sorted(set(cuts)):
        chunks.append(body[start:cut])
        start = cut
    chunks.append(body[start:])
    coded = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks if c) + b"0\r\n\r\n"
    response = _read(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + coded, cap)
    assert response.body == body[:cap]
    assert response.reusable == (len(body) <= cap)


@given(garbage=st.binary(max_size=600), cap=st.integers(min_value=0, max_value=100))
def test_garbage_from_an_endpoint_only_ever_fails_as_a_bad_response(garbage, cap):
    for answer in (garbage, b"HTTP/1.1 200 OK\r\n" + garbage):
        try:
            response = _read(answer, cap)
        except (http11.ProtocolError, http11.ClosedEarly):
            continue
        assert 200 <= response.status <= 999
        assert len(response.body) <= cap

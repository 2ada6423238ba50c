"""The HTTP/1.1 libcurl speaks for the transport, against raw scripted servers on 127.0.0.1:
response framings, interim responses, malformed and misbehaving answers, when a
connection is reused, what goes on the wire, and a slow DNS server."""

import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from delivery.pipeline import transport
from tests.http_receivers import (
    DroppingServer,
    HangingServer,
    Recorder,
    ScriptedServer,
    TricklingServer,
)

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
SLACK = 0.5  # how far past a deadline a cut-off request may finish on a busy 2-core box
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def pool() -> Iterator[transport.Transport]:
    pool = transport.Transport(allow_private=True, max_idle_handles=4)
    yield pool
    pool.clear()


def post(
    pool: transport.Transport, url: str, cap: int = 1000, total: float = 3.0, **headers: str
) -> transport.HttpResult:
    return pool.post(
        url,
        b"{}",
        headers,
        connect_timeout=2.0,
        total_timeout=total,
        response_cap_bytes=cap,
    )


def twice(pool: transport.Transport, answer: bytes, cap: int = 1000):
    """Post twice to a server giving `answer` first, then OK: the results, and how many
    connections the two requests took."""
    with ScriptedServer(answer, OK) as server:
        results = [post(pool, server.url, cap), post(pool, server.url, cap)]
        connections = len(server.connections)
    return results, connections


def test_a_chunked_body_is_decoded_and_its_connection_reused(pool):
    answer = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5;ext=1\r\nhello\r\n7\r\n, world\r\n0\r\nX-Trailer: yes\r\n\r\n"
    )
    (first, second), connections = twice(pool, answer)
    assert (first.status_code, first.error_kind, first.response_excerpt) == (
        200,
        "",
        "hello, world",
    )
    assert (second.status_code, second.response_excerpt) == (200, "ok")
    assert connections == 1


def test_a_chunked_body_past_the_cap_is_cut_and_its_connection_closed(pool):
    answer = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nabcd\r\n4\r\nefgh\r\n0\r\n\r\n"
    )
    (first, second), connections = twice(pool, answer, cap=6)
    assert (first.status_code, first.error_kind, first.response_excerpt) == (200, "", "abcdef")
    assert second.status_code == 200
    assert connections == 2


def test_a_body_exactly_at_the_cap_is_whole_and_its_connection_reused(pool):
    (first, _), connections = twice(pool, OK, cap=2)
    assert (first.status_code, first.error_kind, first.response_excerpt) == (200, "", "ok")
    assert connections == 1


def test_interim_responses_are_skipped_and_their_headers_not_taken(pool):
    answer = (
        b"HTTP/1.1 100 Continue\r\nRetry-After: 999\r\n\r\n"
        b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n"
        b"HTTP/1.1 503 Busy\r\nRetry-After: 7\r\nContent-Length: 4\r\n\r\nbusy"
    )
    (first, _), connections = twice(pool, answer)
    assert (first.status_code, first.error_kind, first.response_excerpt) == (503, "", "busy")
    assert first.retry_after_seconds == 7.0
    assert connections == 1


def test_bare_line_feeds_are_read_like_crlf(pool):
    (first, _), _ = twice(pool, b"HTTP/1.1 201 Created\nContent-Length: 3\n\nyes")
    assert (first.status_code, first.error_kind, first.response_excerpt) == (201, "", "yes")


def test_a_bare_lf_head_in_one_write_leaves_crlfs_in_the_body_alone(pool):
    (first, _), _ = twice(pool, b"HTTP/1.1 200 OK\nContent-Length: 6\n\nab\r\n\r\n")
    assert (first.status_code, first.error_kind, first.response_excerpt) == (200, "", "ab\r\n\r\n")


def test_a_space_before_a_header_colon_is_tolerated(pool):
    answer = b"HTTP/1.1 200 OK\r\nContent-Type : text/plain; charset=latin-1\r\nContent-Length: 4\r\n\r\ncaf\xe9"
    (first, second), connections = twice(pool, answer)
    assert (first.status_code, first.error_kind, first.response_excerpt) == (200, "", "café")
    assert (second.status_code, connections) == (200, 1)


def test_a_header_line_without_a_colon_is_a_malformed_response(pool):
    # libcurl refuses it ("Header without colon"); we keep that: such a head cannot be
    # trusted to frame the body, and the old client refused it too.
    answer = b"HTTP/1.1 200 OK\r\nno colon here\r\nContent-Length: 2\r\n\r\nok"
    (first, second), connections = twice(pool, answer)
    assert (first.status_code, first.error_kind) == (None, transport.CONNECTION)
    assert first.error == "invalid HTTP response: Header without colon"
    assert (second.status_code, connections) == (200, 2)


def test_no_content_has_no_body_and_keeps_the_connection(pool):
    (first, second), connections = twice(pool, b"HTTP/1.1 204 No Content\r\n\r\n")
    assert (first.status_code, first.error_kind, first.response_excerpt) == (204, "", "")
    assert (second.status_code, connections) == (200, 1)


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok",
        b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok",
        # More bytes than the response declared: the extra is unexplained.
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1 200 OK\r\n",
        # Two whole responses in one write: the second is nobody's answer.
        OK + OK,
    ],
    ids=["connection-close", "http-1.0", "extra-bytes", "two-responses"],
)
def test_a_connection_is_not_reused_after_an_unplainly_framed_response(pool, answer):
    (first, second), connections = twice(pool, answer)
    assert (first.status_code, first.error_kind, first.response_excerpt) == (200, "", "ok")
    assert (second.status_code, second.response_excerpt) == (200, "ok")
    assert connections == 2


def test_both_framings_at_once_read_as_chunked(pool):
    # libcurl follows RFC 9112: Transfer-Encoding wins over Content-Length. Unlike the
    # old client it may then reuse the connection (docs/ARCHITECTURE.md).
    answer = (
        b"HTTP/1.1 200 OK\r\nContent-Length: 40\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"2\r\nok\r\n0\r\n\r\n"
    )
    (first, second), _ = twice(pool, answer)
    assert (first.status_code, first.error_kind, first.response_excerpt) == (200, "", "ok")
    assert (second.status_code, second.response_excerpt) == (200, "ok")


def test_a_body_read_until_close_is_complete_at_the_close(pool):
    with ScriptedServer(b"HTTP/1.1 200 OK\r\n\r\nuntil the end", close_after=True) as server:
        result = post(pool, server.url)
    assert (result.status_code, result.error_kind, result.response_excerpt) == (
        200,
        "",
        "until the end",
    )


@pytest.mark.parametrize(
    ("answer", "status", "error"),
    [
        (b"HTP/1.1 200 OK\r\n\r\n", None, "invalid HTTP response: Received HTTP/0.9"),
        (b"HTTP/1.1 2000 OK\r\n\r\n", None, "invalid HTTP response: malformed status line"),
        (b"HTTP/2.5 200 OK\r\n\r\n", None, "invalid HTTP response: malformed status line"),
        (b"HTTP/1.1 200 OK\r\nno colon\r\n\r\n", None, "invalid HTTP response: Header without"),
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 2, 3\r\n\r\nok",
            None,
            "invalid HTTP response: Invalid Content-Length",
        ),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            200,
            "invalid HTTP response: chunk hex-length char not a hex digit",
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
        (
            b"HTTP/1.1 200 OK\r\n" + b"X-Many: aaaaaaaaaaaaaaaaaaaaa\r\n" * 3000 + b"\r\n",
            None,
            "invalid HTTP response: response headers too large",
        ),
        (b"\x00\xffgarbage\r\n\r\n", None, "invalid HTTP response: Received HTTP/0.9"),
    ],
    ids=[
        "protocol",
        "status",
        "version",
        "header",
        "length",
        "chunk",
        "upgrade",
        "huge-line",
        "huge-head",
        "garbage",
    ],
)
def test_a_malformed_response_is_a_connection_failure(pool, answer, status, error):
    with ScriptedServer(answer) as server:
        result = post(pool, server.url)
    assert (result.status_code, result.error_kind) == (status, transport.CONNECTION)
    assert result.error.startswith(error)


def test_a_body_cut_short_by_the_close_keeps_what_arrived(pool):
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhalf"
    with ScriptedServer(answer, close_after=True) as server:
        result = post(pool, server.url)
    assert (result.status_code, result.error_kind) == (200, transport.CONNECTION)
    assert result.error == "connection failed: the endpoint closed the connection mid-body"
    assert result.response_excerpt == "half"


def test_a_close_in_the_middle_of_the_head_is_no_response(pool):
    # libcurl itself would call this a complete response without a body.
    with ScriptedServer(b"HTTP/1.1 200 OK\r\nContent-Le", close_after=True) as server:
        result = post(pool, server.url)
    assert (result.status_code, result.error_kind) == (None, transport.CONNECTION)
    assert result.error == "connection failed: the endpoint closed the connection mid-response"


def test_a_close_without_a_word_is_no_response(pool):
    with DroppingServer() as server:
        result = post(pool, server.url)
        server.wait_closed()
    assert (result.status_code, result.error_kind) == (None, transport.CONNECTION)
    assert (
        result.error == "connection failed: the endpoint closed the connection without a response"
    )
    assert len(server.connections) == 1  # a fresh connection's failure is never retried


def test_an_idle_connection_the_endpoint_closed_is_not_a_failure(pool):
    # The endpoint keeps no idle connections (closes after each answer, without saying so):
    # libcurl sees the kept connection is dead, and the second request goes on a new one.
    with ScriptedServer(OK, close_after=True) as server:
        first = post(pool, server.url)
        server.wait_closed()
        second = post(pool, server.url)
        connections = len(server.connections)
    assert (first.status_code, second.status_code, second.error_kind) == (200, 200, "")
    assert connections == 2


def test_a_request_dropped_on_a_kept_connection_is_sent_again_once(pool):
    """libcurl's own rule, which we cannot turn off: a request on a reused connection
    that dies before any byte of answer (the endpoint's idle timeout racing the request)
    goes again on a new connection. So the endpoint may see it twice; receivers drop
    duplicates by webhook-id. On a new connection nothing is resent (DroppingServer)."""
    with ScriptedServer(OK, None, OK) as server:
        first = post(pool, server.url)
        second = post(pool, server.url)
        heads, connections = len(server.heads), len(server.connections)
    assert (first.status_code, second.status_code, second.error_kind) == (200, 200, "")
    assert (heads, connections) == (3, 2)


def test_a_server_that_never_answers_is_cut_at_the_deadline(pool):
    with HangingServer() as server:
        started = time.monotonic()
        result = post(pool, server.url, total=0.5)
        elapsed = time.monotonic() - started
        connection = server.wait_closed()
    assert (result.status_code, result.error_kind) == (None, transport.DEADLINE)
    assert result.error == "no response within 0.5 s"
    assert 0.5 <= elapsed < 0.5 + SLACK
    assert connection.closed_at is not None


@pytest.mark.parametrize("phase", ["headers", "body"])
def test_a_trickle_is_cut_at_the_deadline(pool, phase):
    with TricklingServer(phase) as server:
        started = time.monotonic()
        result = post(pool, server.url, total=0.5)
        elapsed = time.monotonic() - started
    assert result.error_kind == transport.DEADLINE
    assert result.status_code == (200 if phase == "body" else None)
    assert 0.5 <= elapsed < 0.5 + SLACK


def test_an_oversized_body_is_cut_at_the_cap_and_not_reused(pool):
    (first, second), connections = twice(
        pool, b"HTTP/1.1 200 OK\r\nContent-Length: 300000\r\n\r\n" + b"z" * 300_000, cap=100
    )
    assert (first.status_code, first.error_kind, first.response_excerpt) == (200, "", "z" * 100)
    assert (second.status_code, connections) == (200, 2)


def test_the_request_is_well_formed_on_the_wire(pool):
    with ScriptedServer(OK) as server:
        post(pool, server.url.rstrip("/") + "/hook/café?q=a b&x=1#fragment", **{"X-Id": "7"})
        [head] = server.heads
    lines = head.decode("latin-1").split("\r\n")
    assert lines[0] == "POST /hook/caf%C3%A9?q=a%20b&x=1 HTTP/1.1"
    assert lines[1] == f"Host: 127.0.0.1:{server.port}"
    # Nothing of libcurl's own: no Accept, no form Content-Type, no User-Agent, no Expect.
    assert set(lines[2:]) == {"Accept-Encoding: identity", "X-Id: 7", "Content-Length: 2"}


def test_a_large_body_goes_without_expect_100_continue(pool):
    body = b"x" * 2_000_000
    with Recorder() as endpoint:
        result = pool.post(
            endpoint.url,
            body,
            {"Content-Type": "application/json"},
            connect_timeout=2,
            total_timeout=10,
            response_cap_bytes=100,
        )
        [request] = endpoint.wait_for(1)
    assert result.status_code == 200
    assert request.body == body
    assert "Expect" not in request.headers
    assert request.headers["Content-Type"] == "application/json"


def test_header_values_beyond_latin_1_are_sent_as_utf_8(pool):
    headers = {"webhook-event-type": "注文.作成", "X-Latin": "café", "X-Empty": ""}
    with ScriptedServer(OK) as server:
        result = post(pool, server.url, **headers)
        [head] = server.heads
    assert result.status_code == 200
    lines = head.split(b"\r\n")
    assert "webhook-event-type: 注文.作成".encode() in lines
    assert "X-Latin: café".encode("latin-1") in lines
    assert b"X-Empty:" in lines


def test_a_caller_header_replaces_the_default(pool):
    with ScriptedServer(OK) as server:
        post(pool, server.url, **{"Accept-Encoding": "gzip", "Accept": "text/plain"})
        [head] = server.heads
    lines = head.split(b"\r\n")
    assert b"Accept-Encoding: gzip" in lines
    assert b"Accept: text/plain" in lines
    assert b"Accept-Encoding: identity" not in lines


def test_a_compressed_response_is_not_decompressed(pool):
    answer = (
        b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: 4\r\n\r\n\x1f\x8b\x08\x00"
    )
    with ScriptedServer(answer) as server:
        result = post(pool, server.url)
    assert (result.status_code, result.error_kind) == (200, "")
    assert result.response_excerpt == "\x1f\ufffd\x08\x00"


@pytest.mark.parametrize(
    "headers",
    [
        {"X-Evil": "a\r\nX-Injected: 1"},
        {"X-Evil": "a\nb"},
        {"X-Evil": "a\0b"},
        {"X-Evil\r\nX-Injected": "1"},
        {"Bad Name": "a"},
        {"Host": "elsewhere.example"},
        {"Content-Length": "0"},
        {"Transfer-Encoding": "chunked"},
    ],
)
def test_a_header_that_would_change_the_request_is_refused(pool, headers):
    with Recorder() as endpoint:
        with pytest.raises(ValueError, match="header"):
            post(pool, endpoint.url, **headers)
        with pytest.raises(ValueError, match="header"):
            pool.exchange(
                endpoint.url,
                b"",
                headers,
                connect_timeout=1,
                total_timeout=1,
                response_cap_bytes=10,
            )
        assert post(pool, endpoint.url).status_code == 200  # the only request sent
        assert len(endpoint.wait_for(1)) == 1
    assert len(endpoint.requests) == 1


@pytest.mark.parametrize(
    ("url", "path", "host"),
    [
        ("http://127.0.0.1:{port}/a?b=1", "/a?b=1", "127.0.0.1:{port}"),
        ("HTTP://127.0.0.1:{port}", "/", "127.0.0.1:{port}"),
        ("http://localhost:{port}/x#frag", "/x", "localhost:{port}"),
    ],
)
def test_urls_are_sent_as_meant(pool, url, path, host):
    with Recorder() as endpoint:
        result = post(pool, url.format(port=endpoint.port))
        [request] = endpoint.wait_for(1)
    assert result.status_code == 200
    assert request.path == path
    assert request.headers["Host"] == host.format(port=endpoint.port)


@pytest.mark.parametrize(
    "url",
    [
        "http://user:pw@example.com/",
        "gopher://example.com/",
        "file:///etc/passwd",
        "http://",
        "http://h:99999/",
        "http://a..b/",
        "http://[::1/",
    ],
)
def test_what_cannot_be_delivered_to_is_an_invalid_url_without_a_handle(pool, url):
    exchange = pool.exchange(
        url, b"", {}, connect_timeout=1, total_timeout=1, response_cap_bytes=10
    )
    assert exchange.handle is None
    assert exchange.result is not None
    assert (exchange.result.status_code, exchange.result.error_kind) == (
        None,
        transport.INVALID_URL,
    )
    assert exchange.result.error.startswith("invalid URL: ")
    pool.release(exchange)  # harmless


@given(
    body=st.binary(max_size=3000),
    cuts=st.lists(st.integers(min_value=1, max_value=3000), max_size=8),
    cap=st.integers(min_value=0, max_value=4000),
)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_any_chunking_of_a_body_reads_back_as_the_body_up_to_the_cap(body, cuts, cap):
    chunks, start = [], 0
    for cut in sorted(set(cuts)):
        chunks.append(body[start:cut])
        start = cut
    chunks.append(body[start:])
    coded = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks if c) + b"0\r\n\r\n"
    # Latin-1 decodes any bytes one to one, so the excerpt gives the raw body back.
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; charset=latin-1\r\n"
    answer = head + b"Transfer-Encoding: chunked\r\n\r\n" + coded
    pool = transport.Transport(allow_private=True, max_idle_handles=1)
    with ScriptedServer(answer, OK) as server:
        result = post(pool, server.url, cap=cap)
        again = post(pool, server.url)
        connections = len(server.connections)
    pool.clear()
    assert (result.status_code, result.error_kind) == (200, "")
    assert result.response_excerpt.encode("latin-1") == body[:cap]
    assert again.status_code == 200
    assert connections == (1 if len(body) <= cap else 2)  # a cut connection is not reused


@given(garbage=st.binary(max_size=600), cap=st.integers(min_value=0, max_value=100))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_garbage_from_an_endpoint_only_ever_fails_as_a_bad_response(garbage, cap):
    pool = transport.Transport(allow_private=True, max_idle_handles=1)
    for answer in (garbage, b"HTTP/1.1 200 OK\r\n" + garbage):
        with ScriptedServer(answer, close_after=True) as server:
            result = post(pool, server.url, cap=cap)
        assert result.error_kind in ("", transport.CONNECTION)
        if result.error_kind == "":
            assert 200 <= result.status_code <= 999
            assert len(result.response_excerpt) <= cap  # utf-8 with replacement: <= 1 a byte
    pool.clear()


# -- a slow DNS server ------------------------------------------------------------------

_SLOW_DNS_CHILD = textwrap.dedent(
    """
    import json, socket, sys, threading, time
    sys.path.insert(0, sys.argv[1])
    import django, os
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    from delivery.pipeline import transport

    queries = []
    server = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    server.bind(("127.0.0.1", 53))

    def answer_late():
        while True:
            query, peer = server.recvfrom(512)
            queries.append(query)
            def later(query=query, peer=peer):
                time.sleep(5)
                # NXDOMAIN, the question echoed: a valid answer, only too late.
                server.sendto(query[:2] + b"\\x81\\x83" + query[4:], peer)
            threading.Thread(target=later, daemon=True).start()

    threading.Thread(target=answer_late, daemon=True).start()
    pool = transport.Transport(allow_private=True)
    started = time.monotonic()
    result = pool.post("http://slow-dns.fairhooks.test/", b"{}", {},
                          connect_timeout=1.0, total_timeout=1.0, response_cap_bytes=10)
    elapsed = time.monotonic() - started
    # The same handle again (a literal address: no DNS), then closing it: neither may
    # wait for the resolver thread still stuck on the slow server.
    started = time.monotonic()
    pool.post("http://127.0.0.1:9/", b"{}", {},
                 connect_timeout=1.0, total_timeout=1.0, response_cap_bytes=10)
    pool.clear()
    after = time.monotonic() - started
    print(json.dumps({"elapsed": elapsed, "kind": result.error_kind, "error": result.error,
                      "queries": len(queries), "after": after}), flush=True)
    os._exit(0)
    """
)


def _can_unshare() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True, check=False)
    return probe.returncode == 0


@pytest.mark.skipif(not _can_unshare(), reason="needs root and unshare -m (a private mount)")
def test_a_slow_dns_server_is_cut_at_the_total_deadline(tmp_path):
    """The resolver is in the deadline: a DNS server answering after 5 s costs a delivery
    1 s, not 5. In a private mount namespace, resolv.conf points at a UDP server on
    127.0.0.1:53 that answers late; libcurl's threaded resolver asks it through glibc."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.bind(("127.0.0.1", 53))
        except OSError:
            pytest.skip("127.0.0.1:53 is taken on this machine")
    resolv = tmp_path / "resolv.conf"
    resolv.write_text("nameserver 127.0.0.1\noptions timeout:10 attempts:1\n")
    child = tmp_path / "child.py"
    child.write_text(_SLOW_DNS_CHILD)
    script = f"mount --bind {resolv} /etc/resolv.conf && exec {sys.executable} {child} {ROOT}"
    started = time.monotonic()
    run = subprocess.run(
        ["unshare", "-m", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    wall = time.monotonic() - started
    assert run.returncode == 0, run.stderr
    outcome = json.loads(run.stdout.strip().splitlines()[-1])
    assert outcome["queries"] >= 1  # the name really went to our slow server
    assert outcome["kind"] == transport.TIMEOUT
    assert outcome["error"] == "resolving slow-dns.fairhooks.test timed out after 1 s"
    assert 1.0 <= outcome["elapsed"] < 1.0 + SLACK + 0.5
    assert outcome["after"] < 1.0
    assert wall < 4.5  # the process did not wait for the resolver thread either

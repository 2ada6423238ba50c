"""Transport.post and Transport.exchange against real HTTP servers on 127.0.0.1: every
outcome becomes an HttpResult, on a handle alone or inside a CurlMulti."""

import contextlib
import threading
import time
from collections.abc import Iterator
from email.utils import formatdate

import certifi
import pycurl
import pytest
import requests
from hypothesis import given
from hypothesis import strategies as st

from delivery.pipeline import transport
from tests.http_receivers import (
    DroppingServer,
    FullBacklogListener,
    HangingServer,
    Recorder,
    Reply,
    TricklingServer,
    redirect_to,
    tls_context,
    unused_port,
)

TOTAL = 0.5  # total deadline for the slow-endpoint tests: short, but well above scheduling noise
SLACK = 0.3  # how far past the deadline a cut-off request may finish
BODY = b'{"type": "order.created", "id": 7}'
HEADERS = {"Content-Type": "application/json", "User-Agent": "fairhooks-test", "webhook-id": "e1"}


@pytest.fixture
def pool() -> Iterator[transport.Transport]:
    # allow_private: the test servers are on loopback (test_netguard covers the refusal).
    pool = transport.Transport(allow_private=True, max_idle_handles=4)
    yield pool
    pool.clear()


def post(pool: transport.Transport, url: str, **overrides: float) -> transport.HttpResult:
    options = {"connect_timeout": 2.0, "total_timeout": 5.0, "response_cap_bytes": 1000}
    return pool.post(url, BODY, HEADERS, **{**options, **overrides})


def test_2xx_arrives_with_body_and_headers_and_is_recorded_as_delivered(pool):
    # given
    with Recorder(Reply(202, b"accepted")) as endpoint:
        # when
        result = post(pool, endpoint.url + "hooks?x=1")
        [request] = endpoint.wait_for(1)
    # then
    assert (result.status_code, result.error_kind, result.error) == (202, "", "")
    assert result.response_excerpt == "accepted"
    assert request.method == "POST"
    assert request.path == "/hooks?x=1"
    assert request.body == BODY
    assert request.headers["Content-Type"] == "application/json"
    assert request.headers["User-Agent"] == "fairhooks-test"
    assert request.headers["Webhook-Id"] == "e1"
    assert request.headers["Accept-Encoding"] == "identity"
    assert 0 <= result.duration_ms < 1000


@pytest.mark.parametrize("status", [400, 404, 408, 410, 429, 500, 503])
def test_failure_statuses_come_back_as_plain_results(pool, status):
    with Recorder(Reply(status, b"nope")) as endpoint:
        result = post(pool, endpoint.url)
    assert (result.status_code, result.error_kind, result.error) == (status, "", "")
    assert result.response_excerpt == "nope"
    assert result.retry_after_seconds is None


def test_retry_after_in_seconds_is_parsed(pool):
    with Recorder(Reply(503, headers={"Retry-After": "120"})) as endpoint:
        result = post(pool, endpoint.url)
    assert (result.status_code, result.retry_after_seconds) == (503, 120.0)


def test_retry_after_as_http_date_becomes_seconds_from_now(pool):
    in_a_minute = formatdate(time.time() + 60, usegmt=True)
    with Recorder(Reply(429, headers={"Retry-After": in_a_minute})) as endpoint:
        result = post(pool, endpoint.url)
    assert result.status_code == 429
    assert 55 <= result.retry_after_seconds <= 61


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        ("0", 0.0),
        (" 30 ", 30.0),
        ("Sun, 06 Nov 1994 08:49:37 GMT", 0.0),  # in the past: now
        ("Thu, 01 Jan 2099 00:00:00 GMT", 4070908800.0 - 1_000_000_000),
        ("-5", None),
        ("1.5", None),
        ("soon", None),
        ("", None),
    ],
)
def test_parse_retry_after(value, expected):
    assert transport.parse_retry_after(value, now=1_000_000_000) == expected


@given(st.text())
def test_parse_retry_after_never_raises_and_is_never_negative(value):
    seconds = transport.parse_retry_after(value, now=time.time())
    assert seconds is None or seconds >= 0


def test_receiver_answers_its_replies_in_order_and_can_be_slow(pool):
    replies = (Reply(503, b"busy"), Reply(200, b"fine", delay=0.2))
    with Recorder(*replies) as endpoint:
        results = [post(pool, endpoint.url) for _ in range(3)]
    assert [(r.status_code, r.response_excerpt) for r in results] == [
        (503, "busy"),
        (200, "fine"),
        (200, "fine"),  # the last reply repeats
    ]
    assert results[1].duration_ms >= 200


def test_redirect_is_not_followed(pool):
    with Recorder() as target, Recorder(redirect_to(target.url)) as endpoint:
        result = post(pool, endpoint.url)
        endpoint.wait_for(1)
        time.sleep(0.1)  # a follow-up request would have arrived by now
        assert target.requests == []
    assert (result.status_code, result.error_kind) == (302, "")
    assert result.error == "redirect to 127.0.0.1 not followed (HTTP 302)"


@pytest.mark.parametrize(
    ("reply", "note"),
    [
        (Reply(301, b"", {"Location": "/moved"}), "redirect to 127.0.0.1 not followed (HTTP 301)"),
        (Reply(307, b"", {}), "redirect (HTTP 307) without a Location, not followed"),
        (Reply(308, b"", {"Location": "http://[::1"}), "redirect (HTTP 308) to an unreadable"),
    ],
    ids=["relative", "no-location", "unreadable"],
)
def test_a_redirect_says_where_it_pointed(pool, reply, note):
    with Recorder(reply) as endpoint:
        result = post(pool, endpoint.url)
    assert result.status_code == reply.status
    assert result.error.startswith(note)


def test_connection_refused_on_a_closed_port(pool):
    result = post(pool, f"http://127.0.0.1:{unused_port()}/")
    assert (result.status_code, result.error_kind) == (None, transport.CONNECTION)
    assert result.error == "connection failed: Connection refused"


def test_connect_timeout_when_the_server_never_accepts(pool):
    with FullBacklogListener() as endpoint:
        started = time.monotonic()
        result = post(pool, endpoint.url, connect_timeout=0.3)
    assert (result.status_code, result.error_kind) == (None, transport.TIMEOUT)
    assert result.error == "connect timed out after 0.3 s"
    assert time.monotonic() - started < 0.3 + SLACK


def test_hanging_server_is_cut_at_the_total_deadline(pool):
    with HangingServer() as endpoint:
        started = time.monotonic()
        result = post(pool, endpoint.url, total_timeout=TOTAL)
        elapsed = time.monotonic() - started
        connection = endpoint.wait_closed()
    assert (result.status_code, result.error_kind) == (None, transport.DEADLINE)
    assert result.error == f"no response within {TOTAL:g} s"
    assert TOTAL <= elapsed < TOTAL + SLACK
    assert connection.closed_at - connection.opened_at < TOTAL + SLACK  # socket really closed


def test_headers_trickled_a_byte_at_a_time_are_cut_at_the_total_deadline(pool):
    # Each byte arrives well within any per-read timeout; only a total deadline ends this.
    with TricklingServer("headers") as endpoint:
        started = time.monotonic()
        result = post(pool, endpoint.url, total_timeout=TOTAL)
        elapsed = time.monotonic() - started
        connection = endpoint.wait_closed()
    assert result.error_kind == transport.DEADLINE
    assert TOTAL <= elapsed < TOTAL + SLACK
    assert connection.closed_at - connection.opened_at < TOTAL + SLACK


def test_body_trickled_a_byte_at_a_time_is_cut_at_the_total_deadline(pool):
    with TricklingServer("body") as endpoint:
        started = time.monotonic()
        result = post(pool, endpoint.url, total_timeout=TOTAL)
        elapsed = time.monotonic() - started
        connection = endpoint.wait_closed()
    assert (result.status_code, result.error_kind) == (200, transport.DEADLINE)
    assert result.error == f"response body incomplete after {TOTAL:g} s"
    assert result.response_excerpt.startswith("aaa")  # what did arrive is kept
    assert TOTAL <= elapsed < TOTAL + SLACK
    assert connection.closed_at - connection.opened_at < TOTAL + SLACK


def test_a_body_without_length_cut_by_the_deadline_is_not_taken_as_complete(pool):
    # Read-until-close framing: the watchdog's shutdown looks exactly like a normal end.
    with HangingServer(send=b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\npartial") as endpoint:
        # A longer deadline than the others': on a loaded machine the server thread must
        # still get its head and "partial" out before the cut, or there is no 200 to see.
        result = post(pool, endpoint.url, total_timeout=3 * TOTAL)
    assert (result.status_code, result.error_kind) == (200, transport.DEADLINE)
    assert result.response_excerpt == "partial"


def test_large_response_is_read_only_up_to_the_cap(pool):
    with Recorder(Reply(200, b"x" * 5_000_000)) as endpoint:
        started = time.monotonic()
        result = post(pool, endpoint.url, response_cap_bytes=1000)
        elapsed = time.monotonic() - started
    assert (result.status_code, result.error_kind) == (200, "")
    assert result.response_excerpt == "x" * 1000
    assert elapsed < 0.5


def test_nothing_past_the_cap_is_waited_for(pool):
    # 64 KB of a declared 5 MB, then silence: reading past the cap would hit the deadline.
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 5000000\r\n\r\n"
    with HangingServer(send=head + b"y" * 65536) as endpoint:
        result = post(pool, endpoint.url, total_timeout=2.0, response_cap_bytes=20_000)
    assert (result.status_code, result.error_kind) == (200, "")
    assert result.response_excerpt == "y" * 20_000
    assert result.duration_ms < 500


def test_connection_is_reused_when_the_response_was_read_to_its_end(pool):
    with Recorder(Reply(200, b"short")) as endpoint:
        post(pool, endpoint.url)
        post(pool, endpoint.url, total_timeout=0.2)
        time.sleep(0.3)  # past the second request's deadline: its watch must be disarmed
        result = post(pool, endpoint.url)
        ports = {request.client_port for request in endpoint.wait_for(3)}
    assert result.error_kind == ""
    assert len(ports) == 1


def test_a_response_cut_at_the_cap_is_not_returned_to_the_pool(pool):
    with Recorder(Reply(200, b"x" * 100_000)) as endpoint:
        post(pool, endpoint.url, response_cap_bytes=10)
        post(pool, endpoint.url, response_cap_bytes=10)
        first, second = endpoint.wait_for(2)
    assert first.client_port != second.client_port


def test_a_handle_keeps_a_bounded_number_of_connections_and_closes_the_oldest() -> None:
    # One handle, so every request runs on it: one origin more than it keeps connections
    # for pushes the least recently used origin's connection out, closed, not left to
    # linger until the endpoint's idle timeout.
    pool = transport.Transport(allow_private=True, max_idle_handles=1)
    count = transport.CONNECTIONS_PER_HANDLE + 1
    with contextlib.ExitStack() as stack:
        endpoints = [stack.enter_context(Recorder()) for _ in range(count)]
        results = [post(pool, endpoint.url + "hook?x=1") for endpoint in endpoints]
        endpoints[0].wait_open_connections(0)
        for endpoint in endpoints[1:]:
            endpoint.wait_open_connections(1)
        again = post(pool, endpoints[-1].url)
        assert len({request.client_port for request in endpoints[-1].wait_for(2)}) == 1
        pool.clear()
        for endpoint in endpoints:
            endpoint.wait_open_connections(0)
    assert [result.status_code for result in [*results, again]] == [200] * (count + 1)
    assert endpoints[0].requests[0].path == "/hook?x=1"


def test_clear_closes_idle_connections(pool):
    with Recorder() as endpoint:
        post(pool, endpoint.url)
        endpoint.wait_open_connections(1)
        pool.clear()
        endpoint.wait_open_connections(0)
        assert post(pool, endpoint.url).status_code == 200  # and it still works after


def test_proxy_settings_in_the_environment_are_ignored(pool, monkeypatch):
    with Recorder() as proxy, Recorder() as endpoint:
        for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy"):
            monkeypatch.setenv(name, proxy.url)
        for name in ("NO_PROXY", "no_proxy"):
            monkeypatch.delenv(name, raising=False)
        # given: the environment does reroute an ordinary pool
        requests.post(endpoint.url, data=b"via proxy", timeout=5)
        assert len(proxy.wait_for(1)) == 1
        # when
        result = post(pool, endpoint.url)
        # then
        assert result.status_code == 200
        assert endpoint.wait_for(1)[0].body == BODY
        assert len(proxy.requests) == 1


@pytest.mark.parametrize(
    "url", ["http://", "ftp://example.com/", "example.com/hook", "http://a..b/"]
)
def test_invalid_urls_are_reported_not_raised(pool, url):
    result = post(pool, url)
    assert (result.status_code, result.error_kind) == (None, transport.INVALID_URL)
    assert result.error.startswith("invalid URL: ")


@pytest.mark.parametrize(
    ("content_type", "body", "excerpt"),
    [
        ("text/plain; charset=utf-8", "café".encode(), "café"),
        ("text/plain; charset=latin-1", "café".encode("latin-1"), "café"),
        ("text/plain; charset=no-such-charset", b"ok", "ok"),
        ("application/octet-stream", b"\xff\xfe", "\ufffd\ufffd"),
    ],
)
def test_excerpt_is_decoded_by_the_response_charset(pool, content_type, body, excerpt):
    with Recorder(Reply(200, body, {"Content-Type": content_type})) as endpoint:
        result = post(pool, endpoint.url)
    assert result.response_excerpt == excerpt


def test_a_transport_is_guarded_and_checks_certificates_against_certifi():
    pool = transport.Transport(max_idle_handles=7, allow_private=False)
    assert isinstance(pool, transport.Transport)
    assert pool.allow_private is False
    assert pool.max_idle_handles == 7
    assert pool.ca_certs == certifi.where()


def test_nothing_is_retried_even_when_the_connection_drops(pool):
    """A POST may have been processed before the connection died: one try only."""
    with DroppingServer() as endpoint:
        result = post(pool, endpoint.url)
        time.sleep(0.2)
    assert (result.status_code, result.error_kind) == (None, transport.CONNECTION)
    assert (
        result.error == "connection failed: the endpoint closed the connection without a response"
    )
    assert len(endpoint.connections) == 1


def test_https_through_the_guard_sends_sni_and_verifies_the_host_name(localhost_cert):
    server_names: list[str | None] = []
    pool = transport.Transport(
        max_idle_handles=1, allow_private=True, ca_certs=str(localhost_cert[0])
    )
    with Recorder(ssl_context=tls_context(*localhost_cert, server_names)) as endpoint:
        result = post(pool, f"https://localhost:{endpoint.port}/")
    assert (result.status_code, result.error_kind) == (200, "")
    assert server_names == ["localhost"]


def test_the_answers_own_time_leaves_out_the_connection_and_its_handshake(localhost_cert):
    """An adaptive limit reads answer_ms: a new connection's set-up (slow here, as across
    an ocean) is not the receiver slowing down."""

    def slow_handshake(_sock, _name, _context) -> None:
        time.sleep(0.4)

    context = tls_context(*localhost_cert, [])
    context.sni_callback = slow_handshake
    pool = transport.Transport(
        max_idle_handles=1, allow_private=True, ca_certs=str(localhost_cert[0])
    )
    with Recorder(Reply(delay=0.05), Reply(delay=0.05), ssl_context=context) as endpoint:
        first = post(pool, f"https://localhost:{endpoint.port}/")
        again = post(pool, f"https://localhost:{endpoint.port}/")  # the connection reused
    assert (first.status_code, again.status_code) == (200, 200)
    assert first.duration_ms >= 400 and again.duration_ms < 400
    for result in (first, again):
        assert 50 <= result.answer_ms < 300, (first, again)


def test_an_untrusted_certificate_is_a_tls_failure(pool, localhost_cert):
    with Recorder(ssl_context=tls_context(*localhost_cert, [])) as endpoint:
        result = post(pool, f"https://localhost:{endpoint.port}/")
        assert endpoint.requests == []
    assert (result.status_code, result.error_kind) == (None, transport.TLS)
    assert "certificate verify failed" in result.error


# -- exchanges: the same requests, driven by a CurlMulti (the engine's event loop) ----------


def run_multi(
    pool: transport.Transport,
    exchanges: list[transport.Exchange],
    multi: pycurl.CurlMulti | None = None,
) -> list[transport.HttpResult]:
    """Drive `exchanges` to their ends together on a CurlMulti (a new one unless given), as
    the engine does: finish each when libcurl reports it done, take it out, give its
    handle back."""
    own = multi is None
    multi = multi or pycurl.CurlMulti()
    by_handle = {}
    for exchange in exchanges:
        if exchange.handle is not None:
            by_handle[exchange.handle] = exchange
            multi.add_handle(exchange.handle)
    running = len(by_handle)
    while running:
        multi.select(0.05)
        while multi.perform()[0] == pycurl.E_CALL_MULTI_PERFORM:
            pass
        while True:
            queued, succeeded, failed = multi.info_read()
            for handle in succeeded:
                by_handle[handle].finish(0, "")
            for handle, errno, message in failed:
                by_handle[handle].finish(errno, message)
            for handle in [*succeeded, *(h for h, _, _ in failed)]:
                multi.remove_handle(handle)
                pool.release(by_handle[handle])
                running -= 1
            if not queued:
                break
    if own:
        multi.close()  # and with it the connections it kept
    return [exchange.result for exchange in exchanges]


def exchange(pool: transport.Transport, url: str, **overrides: float) -> transport.Exchange:
    options = {"connect_timeout": 2.0, "total_timeout": 5.0, "response_cap_bytes": 1000}
    return pool.exchange(url, BODY, HEADERS, **{**options, **overrides})


def test_exchanges_in_one_multi_share_its_kept_alive_connection(pool):
    multi = pycurl.CurlMulti()
    with Recorder(Reply(200, b"one"), Reply(201, b"two")) as endpoint:
        first = run_multi(pool, [exchange(pool, endpoint.url)], multi)
        # A fresh handle would have no connection of its own: this one is the multi's.
        pool.clear()
        second = run_multi(pool, [exchange(pool, endpoint.url)], multi)
        ports = {request.client_port for request in endpoint.wait_for(2)}
    multi.close()
    assert [(r.status_code, r.response_excerpt) for r in first + second] == [
        (200, "one"),
        (201, "two"),
    ]
    assert len(ports) == 1


def test_exchanges_run_side_by_side_each_to_its_own_outcome(pool):
    with (
        Recorder(Reply(200, b"fine")) as fine,
        Recorder(Reply(200, b"x" * 100_000)) as large,
        HangingServer() as hanging,
    ):
        started = time.monotonic()
        results = run_multi(
            pool,
            [
                exchange(pool, hanging.url, total_timeout=TOTAL),
                exchange(pool, fine.url),
                exchange(pool, large.url, response_cap_bytes=10),
                exchange(pool, "ftp://example.com/"),
                exchange(pool, f"http://127.0.0.1:{unused_port()}/"),
            ],
        )
        elapsed = time.monotonic() - started
    assert [(r.status_code, r.error_kind) for r in results] == [
        (None, transport.DEADLINE),
        (200, ""),
        (200, ""),
        (None, transport.INVALID_URL),
        (None, transport.CONNECTION),
    ]
    assert results[1].response_excerpt == "fine"
    assert results[2].response_excerpt == "x" * 10
    assert TOTAL <= elapsed < TOTAL + SLACK  # together, not one after the other


def test_the_guard_holds_inside_a_multi():
    pool = transport.Transport(allow_private=False)
    with Recorder() as endpoint:
        [result] = run_multi(pool, [exchange(pool, f"http://127.1:{endpoint.port}/")])
        assert endpoint.requests == []
    assert result.error_kind == transport.FORBIDDEN_DESTINATION
    assert result.error == "forbidden destination: 127.1 resolves to 127.0.0.1, a loopback address"


def test_a_released_handle_serves_the_next_exchange(pool):
    with Recorder() as endpoint:
        first = exchange(pool, endpoint.url)
        handle = first.handle
        run_multi(pool, [first])
        assert first.handle is None  # given back
        second = exchange(pool, endpoint.url)
        assert second.handle is handle
        [result] = run_multi(pool, [second])
    assert (result.status_code, result.error_kind) == (200, "")


def test_post_is_safe_from_many_threads_at_once(pool):
    bodies = [f'{{"n": {n}}}'.encode() for n in range(16 * 10)]
    results: list[transport.HttpResult] = []
    lock = threading.Lock()
    start = threading.Barrier(16)

    def slot(mine: list[bytes]) -> None:
        start.wait()
        for body in mine:
            result = pool.post(
                endpoint.url,
                body,
                HEADERS,
                connect_timeout=2,
                total_timeout=10,
                response_cap_bytes=100,
            )
            with lock:
                results.append(result)

    with Recorder() as endpoint:
        threads = [threading.Thread(target=slot, args=(bodies[n::16],)) for n in range(16)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert [(r.status_code, r.error_kind) for r in results] == [(200, "")] * len(bodies)
        received = endpoint.wait_for(len(bodies))
    assert sorted(request.body for request in received) == sorted(bodies)
    assert len(pool._free) <= pool.max_idle_handles

"""Every row of the input table in docs/INGEST.md: content types, odd bodies, odd framing.

Signatures are computed independently (tests/signing.py). Rows the Django test client can
produce use it; chunked bodies and a missing or lying Content-Length go to a real gunicorn
(the production server) on an ephemeral port, over raw sockets.
"""

import http.client
import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from django.test import RequestFactory
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from delivery.models import Delivery
from ingest import views
from tests import signing
from tests.delivery_helpers import database_url_for_subprocesses
from tests.factories import make_endpoint, make_source, make_tenant
from webhooks.models import Event, Source

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parents[2]
KEY = "gen-secret"
SHOP = "shop-1"
BIG_KEY = "123456789012345678901234567890"
DEEP_ARRAY = b"[" * 100_000
DEEP_OBJECT = b'{"a":' * 100_000
HUGE_INT = b"9" * 5000


@pytest.fixture
def gen():
    """Generic HMAC (hex) source whose tenant key is body.shop_id, with a shared destination."""
    make_tenant(SHOP)
    make_tenant(BIG_KEY)
    source = make_source("gen", secret=KEY, fairness_key="body.shop_id")
    source.destinations.add(make_endpoint(None, "http://127.0.0.1:9/app"))
    return source


def post(client, body: bytes, content_type: str | None = "application/json", **headers):
    headers.setdefault("X-Signature", signing.hmac_hex(KEY, body))
    # Set in the environ directly: the test client leaves both out for an empty body.
    environ = {"CONTENT_TYPE": content_type or "", "CONTENT_LENGTH": str(len(body))}
    return client.generic("POST", "/ingest/gen/", body, headers=headers, **environ)


def assert_stored(response, body: bytes, *, lane: str, reason: str = "") -> Event:
    assert response.status_code == 202, response.content
    answer = response.json()
    assert answer["lane"] == lane, answer
    event = Event.objects.get(pk=answer["id"])
    assert bytes(event.payload) == body  # stored exactly as received, whatever it is
    delivery = Delivery.objects.get(event=event)
    assert delivery.tenant_id == event.tenant_id
    if lane == "fallback":
        assert event.tenant is None
        assert reason in answer["fallback_reason"], answer
        assert reason in event.fallback_reason
    else:
        assert event.tenant is not None and answer["tenant"] == event.tenant.key
    return event


def assert_refused(response, status: int, reason: str) -> None:
    assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/json"
    assert reason in response.json()["error"]
    assert not Event.objects.exists()


# --- content types -------------------------------------------------------------------------

FORM_PAYLOAD = b"payload=%7B%22shop_id%22%3A%22shop-1%22%7D"


@dataclass(frozen=True)
class Row:
    body: bytes
    content_type: str | None
    lane: str
    reason: str = ""


CONTENT_TYPE_ROWS = {
    "json": Row(b'{"shop_id":"shop-1"}', "application/json", "tenant"),
    "json-charset": Row(b'{"shop_id":"shop-1"}', "application/json; charset=utf-8", "tenant"),
    "json-vendor-type": Row(b'{"shop_id":"shop-1"}', "application/vnd.x+json", "tenant"),
    "form-payload": Row(FORM_PAYLOAD, "application/x-www-form-urlencoded", "tenant"),
    "form-fields": Row(b"shop_id=shop-1&x=1", "application/x-www-form-urlencoded", "tenant"),
    "form-duplicate-field": Row(
        b"shop_id=shop-1&shop_id=other",
        "application/x-www-form-urlencoded",
        "fallback",
        "appears more than once",
    ),
    "form-two-payloads": Row(
        FORM_PAYLOAD + b"&" + FORM_PAYLOAD,
        "application/x-www-form-urlencoded",
        "fallback",
        "payload appears more than once",
    ),
    "form-payload-not-json": Row(
        b"payload=nope", "application/x-www-form-urlencoded", "fallback", "not valid JSON"
    ),
    "form-not-utf8": Row(
        b"shop_id=%FF%FE", "application/x-www-form-urlencoded", "fallback", "not UTF-8"
    ),
    "form-empty": Row(b"", "application/x-www-form-urlencoded", "fallback", "empty"),
    "json-labelled-text-plain": Row(b'{"shop_id":"shop-1"}', "text/plain", "tenant"),
    "no-content-type": Row(b'{"shop_id":"shop-1"}', None, "tenant"),
    "xml": Row(b"<shop_id>shop-1</shop_id>", "application/xml", "fallback", "not valid JSON"),
    "binary": Row(bytes(range(256)), "application/octet-stream", "fallback", "not UTF-8"),
    "multipart": Row(
        b'--b\r\nContent-Disposition: form-data; name="shop_id"\r\n\r\nshop-1\r\n--b--\r\n',
        "multipart/form-data; boundary=b",
        "fallback",
        "multipart",
    ),
}


@pytest.mark.parametrize("row", CONTENT_TYPE_ROWS.values(), ids=CONTENT_TYPE_ROWS.keys())
def test_content_types(client, gen, row: Row) -> None:
    response = post(client, row.body, row.content_type)
    event = assert_stored(response, row.body, lane=row.lane, reason=row.reason)
    expected_type = row.content_type or "application/octet-stream"
    assert event.content_type == expected_type


# --- odd bodies ------------------------------------------------------------------------------

ODD_BODY_ROWS = {
    "not-utf8-latin1": Row(b'{"shop_id":"caf\xe9"}', "application/json", "fallback", "not UTF-8"),
    "utf16-with-bom": Row(
        '{"shop_id":"shop-1"}'.encode("utf-16"), "application/json", "fallback", "not UTF-8"
    ),
    "utf8-bom": Row(b'\xef\xbb\xbf{"shop_id":"shop-1"}', "application/json", "tenant"),
    "empty": Row(b"", "application/json", "fallback", "body is empty"),
    "whitespace-only": Row(b" \r\n\t ", "application/json", "fallback", "body is empty"),
    "nested-100k-arrays": Row(DEEP_ARRAY, "application/json", "fallback", "nested too deeply"),
    "nested-100k-objects": Row(DEEP_OBJECT, "application/json", "fallback", "nested too deeply"),
    "nested-50-levels-ok": Row(
        b'{"shop_id":"shop-1","x":' + b"[" * 50 + b"]" * 50 + b"}", "application/json", "tenant"
    ),
    "duplicate-key-on-the-key-path": Row(
        b'{"shop_id":"shop-1","shop_id":"shop-2"}', "application/json", "fallback", "ambiguous"
    ),
    "duplicate-key-elsewhere": Row(
        b'{"shop_id":"shop-1","x":1,"x":2}', "application/json", "tenant"
    ),
    "integer-key-beyond-64-bits": Row(
        b'{"shop_id":' + BIG_KEY.encode() + b"}", "application/json", "tenant"
    ),
    "5000-digit-integer-elsewhere": Row(
        b'{"shop_id":"shop-1","n":' + HUGE_INT + b"}", "application/json", "tenant"
    ),
    "5000-digit-integer-key": Row(
        b'{"shop_id":' + HUGE_INT + b"}", "application/json", "fallback", "longer than 255"
    ),
    "float-overflow-key": Row(
        b'{"shop_id":1e400}', "application/json", "fallback", "not a string or an integer"
    ),
    "float-key": Row(
        b'{"shop_id":42.0}', "application/json", "fallback", "not a string or an integer"
    ),
    "float-overflow-elsewhere": Row(
        b'{"shop_id":"shop-1","x":1e400}', "application/json", "tenant"
    ),
    "nan-literal": Row(
        b'{"shop_id":"shop-1","x":NaN}', "application/json", "fallback", "NaN or Infinity"
    ),
    "infinity-literal": Row(
        b'{"shop_id":"shop-1","x":Infinity}', "application/json", "fallback", "NaN or Infinity"
    ),
    "minus-infinity-literal": Row(
        b'{"shop_id":"shop-1","x":-Infinity}', "application/json", "fallback", "NaN or Infinity"
    ),
    "array": Row(b'[{"shop_id":"shop-1"}]', "application/json", "fallback", "an array"),
    "string": Row(b'"shop-1"', "application/json", "fallback", "a scalar"),
    "number": Row(b"42", "application/json", "fallback", "a scalar"),
    "null": Row(b"null", "application/json", "fallback", "a scalar"),
    "truncated": Row(b'{"shop_id":"shop-1"', "application/json", "fallback", "not valid JSON"),
    "trailing-garbage": Row(
        b'{"shop_id":"shop-1"} x', "application/json", "fallback", "not valid JSON"
    ),
    "key-with-nul": Row(b'{"shop_id":"a\\u0000b"}', "application/json", "fallback", "control"),
    "key-lone-surrogate": Row(
        b'{"shop_id":"\\ud800"}', "application/json", "fallback", "unprintable"
    ),
    "key-too-long": Row(
        b'{"shop_id":"' + b"k" * 300 + b'"}', "application/json", "fallback", "longer than 255"
    ),
    "key-boolean": Row(
        b'{"shop_id":true}', "application/json", "fallback", "not a string or an integer"
    ),
}


@pytest.mark.parametrize("row", ODD_BODY_ROWS.values(), ids=ODD_BODY_ROWS.keys())
def test_odd_bodies(client, gen, row: Row) -> None:
    started = time.monotonic()
    response = post(client, row.body, row.content_type)
    assert time.monotonic() - started < 3
    assert_stored(response, row.body, lane=row.lane, reason=row.reason)


def test_a_megabyte_of_open_brackets_is_quick(client, gen) -> None:
    body = b"[" * 1_000_000
    started = time.monotonic()
    response = post(client, body)
    assert time.monotonic() - started < 3
    assert_stored(response, body, lane="fallback", reason="nested too deeply")


def shopify_source() -> Source:
    """A Shopify source keyed on the shop's domain header, with a shared destination."""
    source = make_source(
        "shop", secret=KEY, scheme=Source.SHOPIFY, fairness_key="header:X-Shopify-Shop-Domain"
    )
    source.destinations.add(make_endpoint(None))
    return source


def post_shopify(client, body: bytes, headers: dict[str, str]):
    """`body` to the Shopify source, signed, with these headers besides."""
    return client.generic(
        "POST",
        "/ingest/shop/",
        body,
        content_type="application/json",
        headers={"X-Shopify-Hmac-Sha256": signing.shopify(KEY, body), **headers},
    )


@pytest.mark.parametrize(
    "body",
    [b"", b"\xff\xfe", DEEP_ARRAY, b"[1]", b'"x"', b"NaN", b'{"a":1,"a":2}'],
    ids=["empty", "not-utf8", "deep", "array", "string", "nan", "duplicates"],
)
def test_odd_bodies_with_the_key_in_a_header_go_to_the_tenant_lane(client, body: bytes) -> None:
    tenant = make_tenant("a.example")
    shopify_source()
    response = post_shopify(client, body, {"X-Shopify-Shop-Domain": "a.example"})
    event = assert_stored(response, body, lane="tenant")
    assert event.tenant == tenant


def as_wsgi_hands_it_over(text: str, encoding: str = "utf-8") -> str:
    """A header value as a WSGI server passes it on: each byte one Latin-1 character."""
    return text.encode(encoding).decode("latin-1")


@pytest.mark.parametrize(
    ("shop", "lane", "reason"),
    [
        (as_wsgi_hands_it_over("магазин.example"), "tenant", ""),
        (as_wsgi_hands_it_over("café.example", "latin-1"), "fallback", "is not UTF-8"),
    ],
    ids=["utf-8", "latin-1"],
)
def test_header_values_are_read_as_utf_8(client, shop: str, lane: str, reason: str) -> None:
    tenant = make_tenant("магазин.example")
    shopify_source()
    body = b'{"id": 1}'
    response = post_shopify(
        client,
        body,
        {
            "X-Shopify-Shop-Domain": shop,
            "X-Shopify-Topic": as_wsgi_hands_it_over("заказы/create"),
        },
    )
    event = assert_stored(response, body, lane=lane, reason=reason)
    assert event.event_type == "заказы/create"
    if lane == "tenant":
        assert event.tenant == tenant
        assert event.headers["X-Shopify-Shop-Domain"] == "магазин.example"


def test_duplicate_type_and_id_fields_are_not_used(client) -> None:
    make_tenant("acme")
    source = make_source("st", secret="whsec_x", scheme=Source.STRIPE, fairness_key="body.account")
    source.destinations.add(make_endpoint(None))
    body = b'{"id":"evt_1","id":"evt_2","type":"a","type":"b","account":"acme"}'
    now = int(time.time())
    response = client.post(
        "/ingest/st/",
        data=body,
        content_type="application/json",
        headers={"Stripe-Signature": signing.stripe("whsec_x", now, body)},
    )
    event = assert_stored(response, body, lane="tenant")
    assert (event.event_type, event.idempotency_key) == ("", None)


# --- headers and odd requests the test client can make ---------------------------------------


def test_control_characters_in_headers_are_stored_escaped_and_not_used(client, gen) -> None:
    body = b'{"shop_id":"shop-1"}'
    response = post(
        client,
        body,
        **{"X-Event-Type": "order\x00created", "Idempotency-Key": "k\x01", "X-Note": "a\x00b"},
    )
    event = assert_stored(response, body, lane="tenant")
    assert event.event_type == "" and event.idempotency_key is None
    assert event.headers["X-Note"] == "a\\x00b"


def test_an_idempotency_key_longer_than_the_column_is_hashed_not_truncated(client, gen) -> None:
    body = b'{"shop_id":"shop-1"}'
    first = post(client, body, **{"Idempotency-Key": "k" * 300 + "1"})
    second = post(client, body, **{"Idempotency-Key": "k" * 300 + "2"})
    again = post(client, body, **{"Idempotency-Key": "k" * 300 + "1"})
    assert (first.status_code, second.status_code, again.status_code) == (202, 202, 200)
    assert again.json()["id"] == first.json()["id"]
    assert Event.objects.get(pk=first.json()["id"]).idempotency_key.startswith("sha256:")


def test_repeated_query_parameter_key_is_ambiguous(client) -> None:
    make_tenant("a")
    source = make_source("q", secret=KEY, fairness_key="query:shop")
    source.destinations.add(make_endpoint(None))
    body = b"{}"
    response = client.post(
        "/ingest/q/?shop=a&shop=b",
        data=body,
        content_type="application/json",
        headers={"X-Signature": signing.hmac_hex(KEY, body)},
    )
    assert_stored(response, body, lane="fallback", reason="more than once")


def test_control_characters_in_a_path_key_go_to_the_fallback_lane(client) -> None:
    source = make_source("p", secret=KEY, fairness_key="path:0")
    source.destinations.add(make_endpoint(None))
    body = b"{}"
    response = client.post(
        "/ingest/p/a%00b/orders",
        data=body,
        content_type="application/json",
        headers={"X-Signature": signing.hmac_hex(KEY, body)},
    )
    assert_stored(response, body, lane="fallback", reason="control")


def test_unknown_key_with_auto_registration_and_a_long_key(client, gen) -> None:
    gen.auto_register_tenants = True
    gen.save()
    key = "s" * 255
    body = json.dumps({"shop_id": key}).encode()
    event = assert_stored(post(client, body), body, lane="tenant")
    assert event.tenant.key == key and event.tenant.auto_registered


def test_compressed_body_is_415(client, gen) -> None:
    body = b"\x1f\x8b\x08\x00"
    assert_refused(post(client, body, **{"Content-Encoding": "gzip"}), 415, "Content-Encoding")


def test_identity_content_encoding_is_fine(client, gen) -> None:
    body = b'{"shop_id":"shop-1"}'
    assert_stored(post(client, body, **{"Content-Encoding": "identity"}), body, lane="tenant")


def test_declared_length_over_the_limit_is_413_before_reading(client, gen, settings) -> None:
    settings.INGEST_MAX_BODY_BYTES = 1024
    body = b"{}"
    response = client.generic(
        "POST",
        "/ingest/gen/",
        body,
        content_type="application/json",
        headers={"X-Signature": signing.hmac_hex(KEY, body)},
        CONTENT_LENGTH="5000",
    )
    assert_refused(response, 413, "larger than 1024 bytes")


def test_non_numeric_content_length_is_400_at_the_view(gen) -> None:
    # Called without the middleware: django_prometheus's middleware runs int() on the header
    # first and fails (a 500) when a server passes such a header through (runserver does;
    # gunicorn refuses it with its own 400, see test_server_refuses_a_non_numeric_...).
    body = b"{}"
    request = RequestFactory().generic(
        "POST",
        "/ingest/gen/",
        body,
        content_type="application/json",
        headers={"X-Signature": signing.hmac_hex(KEY, body)},
        CONTENT_LENGTH="12abc",
    )
    response = views.ingest(request, "gen")
    assert response.status_code == 400
    assert "Content-Length is not a number" in json.loads(response.content)["error"]
    assert not Event.objects.exists()


def test_chunked_body_on_a_server_that_cannot_delimit_it_is_411(client, gen) -> None:
    body = b'{"shop_id":"shop-1"}'
    response = client.generic(
        "POST",
        "/ingest/gen/",
        body,
        content_type="application/json",
        headers={"X-Signature": signing.hmac_hex(KEY, body), "Transfer-Encoding": "chunked"},
        CONTENT_LENGTH="",
    )
    assert_refused(response, 411, "Content-Length is required")


def test_signature_is_checked_before_the_body_is_parsed(client, gen) -> None:
    response = post(client, DEEP_ARRAY, **{"X-Signature": signing.hmac_hex("wrong", DEEP_ARRAY)})
    assert_refused(response, 401, "signature")


@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE", "PATCH"])
def test_other_methods_are_405_with_json(client, gen, method: str) -> None:
    response = client.generic(method, "/ingest/gen/")
    assert response.status_code == 405 and response["Allow"] == "POST"
    assert "POST" in response.json()["error"]


def test_unknown_and_inactive_sources_are_404(client, gen) -> None:
    gen.is_active = False
    gen.save()
    body = b'{"shop_id":"shop-1"}'
    assert_refused(post(client, body), 404, "no active source")


# --- a real server: chunked, missing and lying Content-Length --------------------------------


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# gunicorn, with the body idle timeout shortened so the stalled-body row takes a second.
_LAUNCHER = """
import sys
import ingest.body
ingest.body.BODY_IDLE_TIMEOUT_SECONDS = 1.0
from gunicorn.app.wsgiapp import run
sys.argv = ["gunicorn", *sys.argv[1:]]
run()
"""


@pytest.fixture(scope="module")
def server(django_db_setup, django_db_blocker):
    with django_db_blocker.unblock():
        database_url = database_url_for_subprocesses()
    port = _free_port()
    env = {
        **os.environ,
        "DATABASE_URL": database_url,
        "DB_CONN_MAX_AGE": "0",
        "INGEST_MAX_BODY_BYTES": "4096",
        "LOG_LEVEL": "WARNING",
    }
    process = subprocess.Popen(
        [
            *(sys.executable, "-c", _LAUNCHER, "project.wsgi", "-k", "gthread", "-w", "1"),
            *("--threads", "4", "-b", f"127.0.0.1:{port}", "--log-level", "warning"),
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                pytest.fail(f"gunicorn did not start: {process.stderr.read().decode()[-2000:]}")
            time.sleep(0.1)
    yield port
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10)


@dataclass
class RawAnswer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> dict:
        return json.loads(self.body)


def raw_post(
    port: int,
    body_bytes: bytes,
    headers: dict[str, str],
    *,
    half_close: bool = False,
    path: str = "/ingest/gen/",
) -> RawAnswer:
    """Send exactly these bytes as one request (no framing added) and read the answer."""
    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
    head += "".join(f"{name}: {value}\r\n" for name, value in headers.items()) + "\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=15) as sock:
        sock.sendall(head.encode("latin-1") + body_bytes)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        response = http.client.HTTPResponse(sock)
        response.begin()
        return RawAnswer(response.status, dict(response.getheaders()), response.read())


def chunked(*pieces: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(piece), piece) for piece in pieces) + b"0\r\n\r\n"


SIGNED_BODY = b'{"shop_id":"shop-1"}'
SIGNED = {"X-Signature": signing.hmac_hex(KEY, SIGNED_BODY), "Content-Type": "application/json"}


def test_server_chunked_body_without_content_length_is_accepted(server, gen) -> None:
    answer = raw_post(
        server,
        chunked(SIGNED_BODY[:7], SIGNED_BODY[7:]),
        {**SIGNED, "Transfer-Encoding": "chunked"},
    )
    assert answer.status == 202, answer.body
    event = Event.objects.get(pk=answer.json()["id"])
    assert bytes(event.payload) == SIGNED_BODY and event.tenant.key == SHOP


def test_server_chunked_body_over_the_limit_is_413(server, gen) -> None:
    big = b'{"shop_id":"shop-1","pad":"' + b"x" * 5000 + b'"}'
    answer = raw_post(
        server,
        chunked(big[:3000], big[3000:]),
        {"X-Signature": signing.hmac_hex(KEY, big), "Transfer-Encoding": "chunked"},
    )
    assert answer.status == 413 and "larger than 4096" in answer.json()["error"]
    assert not Event.objects.exists()


def test_server_malformed_chunk_is_400(server, gen) -> None:
    answer = raw_post(server, b"zz\r\nabc\r\n0\r\n\r\n", {**SIGNED, "Transfer-Encoding": "chunked"})
    assert answer.status == 400 and "could not be read" in answer.json()["error"]
    assert not Event.objects.exists()


def test_server_content_length_larger_than_the_body_then_close_is_400(server, gen) -> None:
    answer = raw_post(server, SIGNED_BODY, {**SIGNED, "Content-Length": "100"}, half_close=True)
    assert answer.status == 400
    assert "ended after 20 of the 100 bytes" in answer.json()["error"]
    assert not Event.objects.exists()


def test_server_content_length_larger_than_the_body_then_silence_is_408(server, gen) -> None:
    started = time.monotonic()
    answer = raw_post(server, SIGNED_BODY, {**SIGNED, "Content-Length": "100"})
    assert answer.status == 408 and "no body bytes" in answer.json()["error"]
    assert time.monotonic() - started < 10
    assert not Event.objects.exists()


def test_server_content_length_smaller_than_the_body_verifies_only_the_declared_bytes(
    server, gen
) -> None:
    # The body is the first 10 bytes, as HTTP says; they do not carry the signature.
    answer = raw_post(server, SIGNED_BODY, {**SIGNED, "Content-Length": "10"})
    assert answer.status == 401 and "signature" in answer.json()["error"]
    assert not Event.objects.exists()


def test_server_content_length_smaller_signed_over_the_declared_bytes_is_that_body(
    server, gen
) -> None:
    declared = SIGNED_BODY[:10]
    answer = raw_post(
        server,
        SIGNED_BODY,
        {"X-Signature": signing.hmac_hex(KEY, declared), "Content-Length": "10"},
    )
    assert answer.status == 202
    event = Event.objects.get()
    assert bytes(event.payload) == declared and event.tenant is None


def test_server_no_content_length_and_no_chunking_means_an_empty_body(server, gen) -> None:
    answer = raw_post(
        server,
        SIGNED_BODY,
        {"X-Signature": signing.hmac_hex(KEY, b""), "Content-Type": "application/json"},
        half_close=True,
    )
    assert answer.status == 202
    event = Event.objects.get()
    assert bytes(event.payload) == b"" and "empty" in event.fallback_reason


def test_server_refuses_content_length_with_chunking_itself(server, gen) -> None:
    # Request smuggling guard in gunicorn: a 400 (HTML, its own) before Django sees it.
    answer = raw_post(
        server,
        chunked(SIGNED_BODY),
        {**SIGNED, "Transfer-Encoding": "chunked", "Content-Length": str(len(SIGNED_BODY))},
    )
    assert answer.status == 400
    assert not Event.objects.exists()


def test_server_refuses_a_non_numeric_content_length_itself(server, gen) -> None:
    answer = raw_post(server, SIGNED_BODY, {**SIGNED, "Content-Length": "20x"})
    assert answer.status == 400
    assert not Event.objects.exists()


# --- properties: whatever an authentic body is, it is stored as sent and never a 500 ----------

JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.sampled_from(["shop_id", "a", "b"]) | st.text(max_size=5), children, max_size=4
        )
    ),
    max_leaves=20,
)
CONTENT_TYPES = st.sampled_from(
    [
        "application/json",
        "application/x-www-form-urlencoded",
        "text/plain",
        "multipart/form-data; boundary=x",
        "",
        "application/json; charset=latin-1",
    ]
)


def _assert_stored_as_sent(client, body: bytes, content_type: str) -> None:
    response = post(client, body, content_type)
    assert response.status_code == 202, (body, response.content)
    answer = response.json()
    event = Event.objects.get(pk=answer["id"])
    assert bytes(event.payload) == body
    assert answer["lane"] == ("tenant" if event.tenant_id else "fallback")
    if answer["lane"] == "tenant":
        assert event.tenant.key in (SHOP, BIG_KEY)


@hypothesis_settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(body=st.binary(max_size=600), content_type=CONTENT_TYPES)
def test_any_bytes_are_stored_as_sent(client, gen, body: bytes, content_type: str) -> None:
    _assert_stored_as_sent(client, body, content_type)


@hypothesis_settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(value=JSON_VALUES, content_type=CONTENT_TYPES)
def test_any_json_document_is_stored_as_sent(client, gen, value, content_type: str) -> None:
    _assert_stored_as_sent(client, json.dumps(value).encode(), content_type)

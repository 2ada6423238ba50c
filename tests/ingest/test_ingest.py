"""Ingest: verify first, then derive the tenant, persist, enqueue, and answer after the commit."""

import base64
import hashlib
import hmac
import json
import logging
import threading
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from delivery.models import Delivery
from delivery.scheduler import get_scheduler, reset_scheduler
from ingest import config_cache, views
from tenants.models import EndpointSecret, Tenant
from tests import signing
from tests.factories import make_endpoint, make_source, make_tenant
from tests.http_receivers import HangingServer
from webhooks.models import Event, Source, SourceSecret

SECRET = "shpss_test_secret"
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def shop_source():
    source = make_source(
        "shop", secret=SECRET, scheme=Source.SHOPIFY, fairness_key="header:X-Shopify-Shop-Domain"
    )
    source.destinations.add(make_endpoint(None, "http://127.0.0.1:9/app", max_in_flight=4))
    return source


def post_shopify(
    client: Client, body: bytes, *, shop: str | None = "a.example", secret=SECRET, **extra
):
    headers = {
        "HTTP_X_SHOPIFY_HMAC_SHA256": signing.shopify(secret, body),
        "HTTP_X_SHOPIFY_TOPIC": "orders/create",
    }
    if shop is not None:
        headers["HTTP_X_SHOPIFY_SHOP_DOMAIN"] = shop
    headers.update(extra)
    return client.post("/ingest/shop/", data=body, content_type="application/json", **headers)


def test_verified_event_is_stored_enqueued_and_acknowledged(client, shop_source) -> None:
    tenant = make_tenant("a.example")
    response = post_shopify(client, b'{"id": 1}')
    assert response.status_code == 202
    body = response.json()
    event = Event.objects.get(pk=body["id"])
    assert (event.tenant, event.event_type, bytes(event.payload)) == (
        tenant,
        "orders/create",
        b'{"id": 1}',
    )
    delivery = Delivery.objects.get(event=event)
    assert delivery.tenant == tenant and delivery.status == Delivery.Status.PENDING
    assert get_scheduler().snapshot().fresh_depth == 1


def _seen_from_another_connection(event_id: str) -> tuple[int, int]:
    """(events, deliveries) with this id as another connection sees them."""
    seen: list[tuple[int, int]] = []

    def look() -> None:
        try:
            events = Event.objects.filter(pk=event_id).count()
            seen.append((events, Delivery.objects.filter(event_id=event_id).count()))
        finally:
            connection.close()

    thread = threading.Thread(target=look)
    thread.start()
    thread.join()
    return seen[0]


def test_an_accepted_event_is_committed_when_answered_in_few_statements(
    client, shop_source
) -> None:
    """The 202 means committed: another connection sees the event and its delivery. On
    PostgreSQL the first request takes four statements (the source with its secrets and
    the configuration's version, the tenant, the destinations, then event and deliveries
    in one statement: no BEGIN/COMMIT); the next, the configuration unchanged, one: the
    write, which checks the version it assumed (ingest.config_cache). On SQLite the next
    reads the version, then writes."""
    make_tenant("a.example")
    config_cache.clear()  # a source kept by an earlier test costs a version to compare
    counts = []
    for number in (1, 2):
        with CaptureQueriesContext(connection) as statements:
            response = post_shopify(client, b'{"id": %d}' % number)
        assert response.status_code == 202
        assert _seen_from_another_connection(response.json()["id"]) == (1, 1)
        sql = [one["sql"] for one in statements.captured_queries]
        if connection.vendor == "sqlite":
            assert "webhooks_config_version" in sql[0], sql
            # BEGIN IMMEDIATE, an INSERT per table, COMMIT (no round trips there).
            assert sql[-4] == "BEGIN IMMEDIATE", sql
        else:
            assert "BEGIN" not in sql, sql
            assert ("webhooks_config_version" if number == 1 else "webhooks_config_check(") in (
                sql[0]
            ), sql
        counts.append(len(sql))
    if connection.vendor == "sqlite":
        assert counts == [3 + 4, 1 + 4]
    else:
        assert counts == [3 + 1, 1]


def test_a_fallback_event_and_its_count_are_written_together(client) -> None:
    """A duplicate fallback event neither stores a second event nor counts twice."""
    source = make_source("gen", secret="k", fairness_key="body.shop", hmac_header="X-Signature")
    source.destinations.add(make_endpoint(None))
    body = b'{"other": 1}'
    answers = [
        client.post(
            "/ingest/gen/",
            data=body,
            content_type="application/json",
            HTTP_X_SIGNATURE=signing.hmac_hex("k", body),
            HTTP_IDEMPOTENCY_KEY="same",
        ).status_code
        for _ in range(2)
    ]
    assert answers == [202, 200]
    source.refresh_from_db()
    assert source.fallback_count == 1
    assert Event.objects.count() == 1 and Delivery.objects.count() == 1


def test_bad_signature_is_refused_and_nothing_is_stored(client, shop_source) -> None:
    response = post_shopify(client, b'{"id": 1}', secret="wrong")
    assert response.status_code == 401
    assert "signature" in response.json()["error"]
    assert not Event.objects.exists()
    assert get_scheduler().snapshot().fresh_depth == 0


def test_reserialized_body_fails_verification(client, shop_source) -> None:
    signed = b'{"id": 1, "shop": "a"}'
    response = client.post(
        "/ingest/shop/",
        data=b'{"shop": "a", "id": 1}',
        content_type="application/json",
        HTTP_X_SHOPIFY_HMAC_SHA256=signing.shopify(SECRET, signed),
    )
    assert response.status_code == 401


def test_missing_signature_header_is_401_with_a_reason(client, shop_source) -> None:
    response = client.post("/ingest/shop/", data=b"{}", content_type="application/json")
    assert response.status_code == 401
    assert "X-Shopify-Hmac-Sha256" in response.json()["error"]


def test_forged_request_cannot_choose_a_lane(client, shop_source) -> None:
    make_tenant("victim.example")
    response = post_shopify(client, b"{}", shop="victim.example", secret="attacker")
    assert response.status_code == 401
    assert not Delivery.objects.exists()


def test_unknown_source_is_404(client) -> None:
    assert (
        client.post("/ingest/nope/", data=b"{}", content_type="application/json").status_code == 404
    )


def test_get_is_405(client, shop_source) -> None:
    assert client.get("/ingest/shop/").status_code == 405


def test_body_over_the_limit_is_413(client, shop_source, settings) -> None:
    settings.INGEST_MAX_BODY_BYTES = 2048
    body = b'{"pad": "' + b"x" * 4096 + b'"}'
    assert post_shopify(client, body).status_code == 413
    assert not Event.objects.exists()


def test_unknown_key_auto_registers_a_tenant_when_allowed(client, shop_source) -> None:
    shop_source.auto_register_tenants = True
    shop_source.save()
    response = post_shopify(client, b"{}", shop="new.example")
    assert response.status_code == 202
    tenant = Tenant.objects.get(key="new.example")
    assert tenant.auto_registered and tenant.weight == 1
    assert response.json()["lane"] == "tenant"


@pytest.mark.parametrize(
    ("location", "body", "reason_part"),
    [
        ("body.shop_id", b'{"other": 1}', "missing"),
        ("body.shop_id", b'{"shop_id": null}', "null"),
        ("body.shop_id", b'{"shop_id": ""}', "empty"),
        ("body.shop_id", b'{"shop_id": {"x": 1}}', "not a string"),
        ("body.shop_id", b'{"shop_id": [1]}', "not a string"),
        ("body.shop_id", b"not json", "not valid JSON"),
        ("body.shop.id", b'{"shop": "flat"}', "missing"),
        ("header:X-Shop", b"{}", "header X-Shop"),
        ("query:shop", b"{}", "query parameter"),
        ("", b'{"shop_id": "a"}', "no fairness key"),
    ],
)
def test_missing_or_unusable_key_goes_to_the_fallback_lane_and_is_counted(
    client, location: str, body: bytes, reason_part: str
) -> None:
    source = make_source("gen", secret="k", fairness_key=location, hmac_header="X-Signature")
    source.destinations.add(make_endpoint(None))
    response = client.post(
        "/ingest/gen/",
        data=body,
        content_type="application/json",
        HTTP_X_SIGNATURE=signing.hmac_hex("k", body),
    )
    assert response.status_code == 202, response.content
    assert response.json()["lane"] == "fallback"
    assert reason_part in response.json()["fallback_reason"]
    source.refresh_from_db()
    assert source.fallback_count == 1
    snapshot = get_scheduler().snapshot()
    assert snapshot.fallback_depth == 1 and snapshot.fallback_enqueued_total == 1


@pytest.mark.parametrize(
    ("location", "url", "body"),
    [
        ("body.shop.id", "/ingest/gen/", b'{"shop": {"id": 42}}'),
        ("query:shop", "/ingest/gen/?shop=42", b"{}"),
        ("path:0", "/ingest/gen/42/orders", b"{}"),
    ],
)
def test_key_locations(client, location: str, url: str, body: bytes) -> None:
    tenant = make_tenant("42")
    source = make_source("gen", secret="k", fairness_key=location)
    source.destinations.add(make_endpoint(None))
    response = client.post(
        url,
        data=body,
        content_type="application/json",
        HTTP_X_SIGNATURE=signing.hmac_hex("k", body),
    )
    assert response.status_code == 202
    assert Event.objects.get().tenant == tenant


def test_github_form_encoded_payload_is_parsed_for_the_key(client) -> None:
    tenant = make_tenant("octo-org")
    source = make_source(
        "gh", secret="gh-secret", scheme=Source.GITHUB, fairness_key="body.organization.login"
    )
    source.destinations.add(make_endpoint(None))
    body = b"payload=" + json.dumps({"organization": {"login": "octo-org"}}).encode().replace(
        b" ", b"+"
    )
    response = client.post(
        "/ingest/gh/",
        data=body,
        content_type="application/x-www-form-urlencoded",
        HTTP_X_HUB_SIGNATURE_256=signing.github("gh-secret", body),
        HTTP_X_GITHUB_EVENT="push",
        HTTP_X_GITHUB_DELIVERY="d-1",
    )
    assert response.status_code == 202, response.content
    event = Event.objects.get()
    assert (event.tenant, event.event_type, event.idempotency_key) == (tenant, "push", "d-1")


def test_repeat_of_the_same_provider_event_answers_200_with_the_original_id(
    client, shop_source
) -> None:
    make_tenant("a.example")
    first = post_shopify(client, b'{"id": 1}', HTTP_X_SHOPIFY_EVENT_ID="evt-1")
    again = post_shopify(client, b'{"id": 1}', HTTP_X_SHOPIFY_EVENT_ID="evt-1")
    assert (first.status_code, again.status_code) == (202, 200)
    assert again.json()["id"] == first.json()["id"] and again.json()["duplicate"] is True
    assert Event.objects.count() == 1 and Delivery.objects.count() == 1


def test_racing_duplicates_produce_exactly_one_event(shop_source) -> None:
    make_tenant("a.example")
    answers: list[int] = []
    barrier = threading.Barrier(6)

    def send() -> None:
        barrier.wait()
        answers.append(
            post_shopify(Client(), b'{"id": 9}', HTTP_X_SHOPIFY_EVENT_ID="evt-race").status_code
        )
        connection.close()

    threads = [threading.Thread(target=send) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert Event.objects.count() == 1
    assert sorted(answers) == [200] * 5 + [202]


def test_disabled_destination_holds_the_delivery(client, shop_source) -> None:
    make_tenant("a.example")
    shop_source.destinations.update(enabled=False)
    assert post_shopify(client, b"{}").status_code == 202
    assert Delivery.objects.get().status == Delivery.Status.HELD
    assert get_scheduler().snapshot().fresh_depth == 0


def test_database_unavailable_is_503_never_2xx(client, shop_source, tmp_path) -> None:
    original = dict(connection.settings_dict)
    connection.close()
    if connection.vendor == "sqlite":
        connection.settings_dict["NAME"] = str(tmp_path / "missing-dir" / "db.sqlite3")
    else:
        connection.settings_dict["PORT"] = "1"
    try:
        response = post_shopify(client, b"{}")
    finally:
        connection.close()
        connection.settings_dict.clear()
        connection.settings_dict.update(original)
    assert response.status_code == 503
    assert response["Retry-After"]
    assert not Event.objects.exists()


def test_redis_unavailable_still_acknowledges_and_the_sweeper_schedules_later(
    client, shop_source, settings
) -> None:
    from delivery.upkeep import maintenance

    make_tenant("a.example")
    real_url = settings.REDIS_URL
    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    reset_scheduler()
    try:
        response = post_shopify(client, b'{"n": 1}')
    finally:
        settings.REDIS_URL = real_url
        reset_scheduler()
    assert response.status_code == 202
    delivery = Delivery.objects.get()
    assert delivery.needs_schedule
    get_scheduler().start_epoch()
    result = maintenance.sweep()
    # Retention and the partitions' upkeep report what they did too; not this test's.
    assert {k: v for k, v in result.items() if not k.startswith(("pruned_", "partition"))} == {
        "rebuilt": 0,
        "flagged": 1,
        "replay_jobs": 0,
        "replay_fed": 0,
    }
    assert get_scheduler().snapshot().fresh_depth == 1
    delivery.refresh_from_db()
    assert not delivery.needs_schedule


def test_a_hanging_redis_delays_ingest_by_its_timeout_never_more(
    client, shop_source, settings
) -> None:
    """A Redis that accepts connections and never answers (a partition, a stopped
    process) costs each request a bounded wait; the event is stored and acknowledged."""

    make_tenant("a.example")
    real_url = settings.REDIS_URL
    settings.REDIS_SOCKET_TIMEOUT = 1.0
    with HangingServer() as hanging:
        settings.REDIS_URL = f"redis://127.0.0.1:{hanging.port}/0"
        reset_scheduler()
        try:
            timings = []
            for n in range(3):
                started = time.monotonic()
                response = post_shopify(client, json.dumps({"n": n}).encode())
                timings.append(time.monotonic() - started)
                assert response.status_code == 202
        finally:
            settings.REDIS_URL = real_url
            reset_scheduler()
    # The first request waits out the key counting and the enqueue (1 s each); then
    # counting pauses and only the enqueue's timeout is paid.
    assert timings[0] < 4.0, timings
    assert max(timings[1:]) < 2.5, timings
    assert Delivery.objects.filter(needs_schedule=True).count() == 3


# --- each signature scheme end to end ---------------------------------------------------------

STRIPE_SECRET = "whsec_stripe_test"
SW_SECRET = "whsec_" + base64.b64encode(b"standard-webhooks-key-24b").decode()


def gateway(slug: str, secret: str | None, scheme: str, **fields) -> Source:
    source = make_source(slug, secret=secret or "", scheme=scheme, **fields)
    source.destinations.add(make_endpoint(None))
    return source


def post_stripe(client, body: bytes, timestamp: int | None = None, secret=STRIPE_SECRET, **h):
    timestamp = int(time.time()) if timestamp is None else timestamp
    headers = {"Stripe-Signature": signing.stripe(secret, timestamp, body), **h}
    return client.post(
        "/ingest/stripe/", data=body, content_type="application/json", headers=headers
    )


def test_stripe_type_and_id_come_from_the_signed_body(client) -> None:
    tenant = make_tenant("acct_1")
    gateway("stripe", STRIPE_SECRET, Source.STRIPE, fairness_key="body.account")
    body = b'{"id":"evt_1","type":"invoice.paid","account":"acct_1"}'
    # Unsigned headers do not override what the signed body says.
    first = post_stripe(client, body, **{"Idempotency-Key": "hdr", "X-Event-Type": "hdr.type"})
    assert first.status_code == 202, first.content
    event = Event.objects.get()
    assert (event.tenant, event.event_type, event.idempotency_key) == (
        tenant,
        "invoice.paid",
        "evt_1",
    )
    again = post_stripe(client, body)  # Stripe's retry: same event id, fresh timestamp
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
    assert Event.objects.count() == 1


# Ten seconds past the 300 s tolerance, not one: the timestamp is whole seconds of the
# wall clock and the view reads the clock again later (301 s ahead read as 300.x on a busy
# CI machine). The exact boundary is tests/core/test_signatures.py's, on a fixed clock.
@pytest.mark.parametrize(("offset", "word"), [(-310, "too old"), (310, "in the future")])
def test_stripe_stale_or_future_timestamp_is_401(client, offset: int, word: str) -> None:
    gateway("stripe", STRIPE_SECRET, Source.STRIPE, fairness_key="body.account")
    response = post_stripe(client, b'{"id":"evt_1"}', timestamp=int(time.time()) + offset)
    assert response.status_code == 401 and word in response.json()["error"]
    assert not Event.objects.exists()


def post_standard(
    client, body: bytes, msg_id="msg_1", timestamp=None, secret=SW_SECRET, family="webhook"
):
    timestamp = int(time.time()) if timestamp is None else timestamp
    headers = {
        f"{family}-id": msg_id,
        f"{family}-timestamp": str(timestamp),
        f"{family}-signature": signing.standard_webhooks(secret, msg_id, timestamp, body),
    }
    return client.post("/ingest/sw/", data=body, content_type="application/json", headers=headers)


@pytest.mark.parametrize("family", ["webhook", "svix"])
def test_standard_webhooks_id_is_the_idempotency_key(client, family: str) -> None:
    tenant = make_tenant("t1")
    gateway("sw", SW_SECRET, Source.STANDARD_WEBHOOKS, fairness_key="body.data.tenant")
    body = b'{"type":"user.created","data":{"tenant":"t1"}}'
    first = post_standard(client, body, family=family)
    again = post_standard(client, body, family=family)
    other = post_standard(client, body, msg_id="msg_2", family=family)
    assert (first.status_code, again.status_code, other.status_code) == (202, 200, 202)
    assert again.json()["id"] == first.json()["id"]
    event = Event.objects.get(pk=first.json()["id"])
    assert (event.tenant, event.event_type, event.idempotency_key) == (
        tenant,
        "user.created",
        "msg_1",
    )


@pytest.mark.parametrize(("offset", "word"), [(-3600, "too old"), (3600, "in the future")])
def test_standard_webhooks_stale_or_future_timestamp_is_401(client, offset: int, word: str) -> None:
    gateway("sw", SW_SECRET, Source.STANDARD_WEBHOOKS, fairness_key="body.data.tenant")
    response = post_standard(client, b"{}", timestamp=int(time.time()) + offset)
    assert response.status_code == 401 and word in response.json()["error"]


def test_timestamp_tolerance_follows_the_setting(client, settings) -> None:
    settings.INGEST_TIMESTAMP_TOLERANCE_SECONDS = 10
    gateway("sw", SW_SECRET, Source.STANDARD_WEBHOOKS)
    assert post_standard(client, b"{}", timestamp=int(time.time()) - 60).status_code == 401
    assert post_standard(client, b"{}", timestamp=int(time.time()) - 5).status_code == 202


def b64_hmac(secret: str, body: bytes) -> str:
    return base64.b64encode(hmac.new(secret.encode(), body, hashlib.sha256).digest()).decode()


def test_generic_hmac_with_base64_and_a_prefix(client) -> None:
    make_tenant("acme")
    gateway(
        "gen64",
        "k64",
        Source.HMAC_SHA256,
        hmac_header="X-Hook-Sig",
        hmac_encoding="base64",
        hmac_prefix="v1=",
        fairness_key="body.shop_id",
    )
    body = b'{"shop_id":"acme"}'

    def send(value: str):
        return client.post(
            "/ingest/gen64/",
            data=body,
            content_type="application/json",
            headers={"X-Hook-Sig": value, "Idempotency-Key": "i-1"},
        )

    assert send(b64_hmac("k64", body)).status_code == 401  # prefix missing
    assert send("v1=" + signing.hmac_hex("k64", body)).status_code == 401  # hex, not base64
    assert send("v1=" + b64_hmac("other", body)).status_code == 401
    response = send("v1=" + b64_hmac("k64", body))
    assert response.status_code == 202 and response.json()["tenant"] == "acme"
    assert Event.objects.get().idempotency_key == "i-1"


def test_none_scheme_accepts_unsigned_requests(client) -> None:
    make_tenant("acme")
    gateway("open", None, Source.NONE, fairness_key="query:shop")
    response = client.post("/ingest/open/?shop=acme", data=b"anything", content_type="text/plain")
    assert response.status_code == 202 and response.json()["tenant"] == "acme"


def test_rotation_two_active_secrets_pass_the_expired_one_is_refused(client) -> None:
    make_tenant("a.example")
    source = gateway("rot", "new-secret", Source.SHOPIFY, fairness_key="header:X-Shop")
    SourceSecret.objects.create(
        source=source, secret="old-secret", expires_at=timezone.now() + timedelta(hours=1)
    )
    SourceSecret.objects.create(
        source=source, secret="retired-secret", expires_at=timezone.now() - timedelta(seconds=1)
    )

    def send(secret: str):
        body = json.dumps({"secret": secret}).encode()
        return client.post(
            "/ingest/rot/",
            data=body,
            content_type="application/json",
            headers={"X-Shopify-Hmac-Sha256": signing.shopify(secret, body), "X-Shop": "a.example"},
        )

    assert send("new-secret").status_code == 202
    assert send("old-secret").status_code == 202
    refused = send("retired-secret")
    assert refused.status_code == 401 and "does not match" in refused.json()["error"]
    assert Event.objects.count() == 2


# --- misconfigured secrets never make a 500 ---------------------------------------------------


def test_standard_webhooks_source_with_only_an_undecodable_secret_is_401_misconfigured(
    client, caplog
) -> None:
    gateway("sw", "whsec_not*base64!", Source.STANDARD_WEBHOOKS)
    views._last_warned.clear()  # warnings are rate-limited per source and problem
    with caplog.at_level(logging.WARNING, logger="ingest.views"):
        response = post_standard(client, b"{}", secret=SW_SECRET)
    assert response.status_code == 401
    assert "source misconfigured" in response.json()["error"]
    assert "whsec_not" not in response.content.decode()  # the secret is never echoed
    assert any("misconfigured" in record.getMessage() for record in caplog.records)
    assert not Event.objects.exists()


def test_an_undecodable_secret_beside_a_good_one_is_skipped(client, caplog) -> None:
    source = gateway("sw", SW_SECRET, Source.STANDARD_WEBHOOKS)
    SourceSecret.objects.create(source=source, secret="whsec_%%%")
    views._last_warned.clear()
    with caplog.at_level(logging.WARNING, logger="ingest.views"):
        assert post_standard(client, b"{}").status_code == 202
    assert any("not whsec_<base64>" in record.getMessage() for record in caplog.records)


def test_source_without_any_active_secret_is_401_misconfigured(client) -> None:
    source = gateway("shopx", "gone", Source.SHOPIFY)
    source.secrets.update(expires_at=timezone.now() - timedelta(minutes=1))
    response = client.post(
        "/ingest/shopx/",
        data=b"{}",
        content_type="application/json",
        headers={"X-Shopify-Hmac-Sha256": signing.shopify("gone", b"{}")},
    )
    assert response.status_code == 401
    assert "no usable signing secret" in response.json()["error"]


def test_source_with_an_invalid_scheme_in_the_database_is_401_misconfigured(client) -> None:
    source = gateway("odd", "k", Source.HMAC_SHA256)
    Source.objects.filter(pk=source.pk).update(hmac_encoding="base32")
    response = client.post(
        "/ingest/odd/",
        data=b"{}",
        content_type="application/json",
        headers={"X-Signature": signing.hmac_hex("k", b"{}")},
    )
    assert response.status_code == 401 and "misconfigured" in response.json()["error"]


def test_destination_with_an_undecodable_endpoint_secret_does_not_affect_ingest(client) -> None:
    make_tenant("a.example")
    source = make_source(
        "shopy", secret=SECRET, scheme=Source.SHOPIFY, fairness_key="header:X-Shop"
    )
    endpoint = make_endpoint(None)
    EndpointSecret.objects.create(endpoint=endpoint, secret="whsec_***not base64***")
    source.destinations.add(endpoint)
    response = client.post(
        "/ingest/shopy/",
        data=b"{}",
        content_type="application/json",
        headers={"X-Shopify-Hmac-Sha256": signing.shopify(SECRET, b"{}"), "X-Shop": "a.example"},
    )
    # Ingest never signs: the endpoint's secret matters only when delivering.
    assert response.status_code == 202
    assert Delivery.objects.get().endpoint == endpoint

"""Ingest: verify first, then derive the tenant, persist, enqueue, and answer after the commit."""

import json
import threading

import pytest
from django.db import connection
from django.test import Client

from delivery.enqueueing import get_scheduler
from delivery.models import Delivery
from tenants.models import Tenant
from tests import signing
from tests.factories import make_endpoint, make_source, make_tenant
from webhooks.models import Event, Source

SECRET = "shpss_test_secret"
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def shop_source():
    source = make_source(
        "shop", secret=SECRET, scheme=Source.SHOPIFY, fairness_key="header:X-Shopify-Shop-Domain"
    )
    source.destinations.add(make_endpoint(None, "http://127.0.0.1:9/app", max_in_flight=4))
    return source


def post_shopify(client: Client, body: bytes, *, shop: str | None = "a.example", secret=SECRET, **extra):
    headers = {"HTTP_X_SHOPIFY_HMAC_SHA256": signing.shopify(secret, body), "HTTP_X_SHOPIFY_TOPIC": "orders/create"}
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
    assert (event.tenant, event.event_type, bytes(event.payload)) == (tenant, "orders/create", b'{"id": 1}')
    delivery = Delivery.objects.get(event=event)
    assert delivery.tenant == tenant and delivery.status == Delivery.PENDING
    assert get_scheduler().snapshot().fresh_depth == 1


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
    assert client.post("/ingest/nope/", data=b"{}", content_type="application/json").status_code == 404


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
        ("body.shop_id", b"not json", "not JSON"),
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
        "/ingest/gen/", data=body, content_type="application/json",
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
        url, data=body, content_type="application/json", HTTP_X_SIGNATURE=signing.hmac_hex("k", body)
    )
    assert response.status_code == 202
    assert Event.objects.get().tenant == tenant


def test_github_form_encoded_payload_is_parsed_for_the_key(client) -> None:
    tenant = make_tenant("octo-org")
    source = make_source("gh", secret="gh-secret", scheme=Source.GITHUB, fairness_key="body.organization.login")
    source.destinations.add(make_endpoint(None))
    body = b"payload=" + json.dumps({"organization": {"login": "octo-org"}}).encode().replace(b" ", b"+")
    response = client.post(
        "/ingest/gh/", data=body, content_type="application/x-www-form-urlencoded",
        HTTP_X_HUB_SIGNATURE_256=signing.github("gh-secret", body),
        HTTP_X_GITHUB_EVENT="push", HTTP_X_GITHUB_DELIVERY="d-1",
    )
    assert response.status_code == 202, response.content
    event = Event.objects.get()
    assert (event.tenant, event.event_type, event.idempotency_key) == (tenant, "push", "d-1")


def test_repeat_of_the_same_provider_event_answers_200_with_the_original_id(client, shop_source) -> None:
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
        answers.append(post_shopify(Client(), b'{"id": 9}', HTTP_X_SHOPIFY_EVENT_ID="evt-race").status_code)
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
    assert Delivery.objects.get().status == Delivery.HELD
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


def test_redis_unavailable_still_acknowledges_and_the_sweeper_schedules_later(client, shop_source, settings) -> None:
    from delivery import enqueueing, maintenance

    make_tenant("a.example")
    real_url = settings.REDIS_URL
    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    enqueueing.reset_scheduler()
    try:
        response = post_shopify(client, b'{"n": 1}')
    finally:
        settings.REDIS_URL = real_url
        enqueueing.reset_scheduler()
    assert response.status_code == 202
    delivery = Delivery.objects.get()
    assert delivery.needs_schedule
    get_scheduler().start_epoch()
    assert maintenance.sweep() == {"rebuilt": 0, "flagged": 1}
    assert get_scheduler().snapshot().fresh_depth == 1
    delivery.refresh_from_db()
    assert not delivery.needs_schedule

"""The bad-input catalogue: every case gets a clear 4xx or a validation message, never a
500, and nothing is stored for what was refused."""

import json
import socket

import pytest
from django.urls import reverse

from delivery.models import Delivery
from tenants.models import Endpoint, Tenant
from tests import signing
from tests.factories import make_endpoint, make_source, make_tenant
from webhooks.models import ApiToken, Event, Source

pytestmark = pytest.mark.django_db


@pytest.fixture
def source():
    source = make_source("shop", secret="k", scheme=Source.SHOPIFY, fairness_key="body.shop_id")
    source.destinations.add(make_endpoint(None))
    return source


INGEST_CASES = [
    # (description, body, headers, expected status)
    ("no signature", b"{}", {}, 401),
    ("empty signature", b"{}", {"HTTP_X_SHOPIFY_HMAC_SHA256": ""}, 401),
    ("signature not base64", b"{}", {"HTTP_X_SHOPIFY_HMAC_SHA256": "%%%"}, 401),
    (
        "signature of another body",
        b"{}",
        {"HTTP_X_SHOPIFY_HMAC_SHA256": signing.shopify("k", b"[]")},
        401,
    ),
    (
        "signature with another secret",
        b"{}",
        {"HTTP_X_SHOPIFY_HMAC_SHA256": signing.shopify("x", b"{}")},
        401,
    ),
    (
        "signature hex instead of base64",
        b"{}",
        {"HTTP_X_SHOPIFY_HMAC_SHA256": signing.hmac_hex("k", b"{}")},
        401,
    ),
]


@pytest.mark.parametrize(
    ("case", "body", "headers", "status"), INGEST_CASES, ids=[c[0] for c in INGEST_CASES]
)
def test_ingest_refusals(client, source, case, body, headers, status) -> None:
    response = client.post("/ingest/shop/", data=body, content_type="application/json", **headers)
    assert response.status_code == status
    assert response.json()["error"]
    assert not Event.objects.exists()


def test_ingest_to_an_inactive_source_is_404(client, source) -> None:
    Source.objects.update(is_active=False)
    body = b"{}"
    response = client.post(
        "/ingest/shop/",
        data=body,
        content_type="application/json",
        HTTP_X_SHOPIFY_HMAC_SHA256=signing.shopify("k", body),
    )
    assert response.status_code == 404 and not Event.objects.exists()


def test_ingest_body_over_limit_is_413(client, source, settings) -> None:
    settings.INGEST_MAX_BODY_BYTES = 1024
    body = b"x" * 5000
    response = client.post(
        "/ingest/shop/",
        data=body,
        content_type="application/json",
        HTTP_X_SHOPIFY_HMAC_SHA256=signing.shopify("k", body),
    )
    assert response.status_code == 413 and not Event.objects.exists()


@pytest.fixture
def token():
    make_tenant("acme")
    return ApiToken.issue("t")[1]


PUBLISH_CASES = [
    ("not json", b"{oops", 400),
    ("json string", json.dumps("hello").encode(), 422),
    ("json number", b"42", 422),
    ("null", b"null", 422),
    (
        "tenant is a number",
        json.dumps({"tenant": 5, "event_type": "x", "payload": {}}).encode(),
        422,
    ),
    (
        "tenant is blank",
        json.dumps({"tenant": "  ", "event_type": "x", "payload": {}}).encode(),
        422,
    ),
    (
        "event type too long",
        json.dumps({"tenant": "acme", "event_type": "x" * 300, "payload": {}}).encode(),
        422,
    ),
    (
        "event type is a list",
        json.dumps({"tenant": "acme", "event_type": ["x"], "payload": {}}).encode(),
        422,
    ),
    ("events is not a list", json.dumps({"events": {"a": 1}}).encode(), 422),
    ("batch item not an object", json.dumps({"events": [1]}).encode(), 422),
    (
        "idempotency key too long",
        json.dumps(
            {"tenant": "acme", "event_type": "x", "payload": {}, "idempotency_key": "k" * 300}
        ).encode(),
        422,
    ),
]


@pytest.mark.parametrize(
    ("case", "body", "status"), PUBLISH_CASES, ids=[c[0] for c in PUBLISH_CASES]
)
def test_publish_refusals(client, token, case, body, status) -> None:
    response = client.post(
        "/api/v1/events",
        data=body,
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {token}",
    )
    assert response.status_code == status
    assert response.json()["error"]
    assert not Event.objects.exists() and not Delivery.objects.exists()


def test_publish_with_a_basic_auth_header_is_401(client, token) -> None:
    response = client.post(
        "/api/v1/events",
        data=b"{}",
        content_type="application/json",
        HTTP_AUTHORIZATION="Basic Zm9vOmJhcg==",
    )
    assert response.status_code == 401


SSRF_URLS = [
    "http://127.1/hook",
    "http://2130706433/hook",
    "http://0x7f.1/hook",
    "http://0.0.0.0/hook",
    "http://[::1]/hook",
    "http://[::ffff:127.0.0.1]/hook",
    "http://169.254.169.254/latest/meta-data",
    "http://100.64.0.1/hook",
    "http://[fd00::1]/hook",
    "http://10.0.0.5/hook",
    "http://192.168.1.1/hook",
    "http://localhost/hook",
    "ftp://example.com/hook",
    "http://user:pass@example.com/hook",
    "not a url",
]


@pytest.mark.parametrize("url", SSRF_URLS)
def test_endpoint_urls_to_private_or_odd_destinations_are_refused(
    staff_client, settings, url
) -> None:
    settings.ALLOW_PRIVATE_DESTINATIONS = False
    response = staff_client.post(
        reverse("admin:tenants_endpoint_add"),
        {
            "url": url,
            "max_in_flight": 2,
            "retry_max_in_flight": 1,
            "timeout_seconds": 30,
            "enabled": "on",
            "secrets-TOTAL_FORMS": 0,
            "secrets-INITIAL_FORMS": 0,
        },
    )
    assert response.status_code == 200  # the form again, with the error
    assert response.context["adminform"].form.errors["url"]
    assert not Endpoint.objects.exists()


def test_a_name_resolving_to_a_private_address_is_refused(
    staff_client, settings, monkeypatch
) -> None:
    settings.ALLOW_PRIVATE_DESTINATIONS = False
    real = socket.getaddrinfo

    def resolve(host, *args, **kwargs):
        if host == "internal.example":  # stands in for a DNS record pointing inside
            return real("10.1.2.3", *args, **kwargs)
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    response = staff_client.post(
        reverse("admin:tenants_endpoint_add"),
        {
            "url": "http://internal.example/hook",
            "max_in_flight": 2,
            "retry_max_in_flight": 1,
            "timeout_seconds": 30,
            "secrets-TOTAL_FORMS": 0,
            "secrets-INITIAL_FORMS": 0,
        },
    )
    assert "url" in response.context["adminform"].form.errors
    assert not Endpoint.objects.exists()


ADMIN_FORM_CASES = [
    ("tenants_tenant_add", {"key": "", "weight": 1}, "key"),
    ("tenants_tenant_add", {"key": "k", "weight": 3}, "weight"),
    ("tenants_tenant_add", {"key": "k", "weight": -1}, "weight"),
    (
        "webhooks_source_add",
        {"slug": "s", "scheme": "hmac-sha256", "fairness_key": "body.", "hmac_encoding": "hex"},
        "fairness_key",
    ),
    (
        "webhooks_source_add",
        {"slug": "s", "scheme": "hmac-sha256", "fairness_key": "cookie:x", "hmac_encoding": "hex"},
        "fairness_key",
    ),
    (
        "webhooks_source_add",
        {"slug": "has space", "scheme": "none", "hmac_encoding": "hex"},
        "slug",
    ),
    ("webhooks_source_add", {"slug": "s", "scheme": "md5", "hmac_encoding": "hex"}, "scheme"),
    (
        "tenants_endpoint_add",
        {
            "url": "https://example.com/",
            "max_in_flight": 0,
            "retry_max_in_flight": 1,
            "timeout_seconds": 30,
        },
        "max_in_flight",
    ),
    (
        "tenants_endpoint_add",
        {
            "url": "https://example.com/",
            "max_in_flight": 2,
            "retry_max_in_flight": 3,
            "timeout_seconds": 30,
        },
        "retry_max_in_flight",
    ),
    (
        "tenants_endpoint_add",
        {
            "url": "https://example.com/",
            "max_in_flight": 2,
            "retry_max_in_flight": 1,
            "timeout_seconds": 999,
        },
        "timeout_seconds",
    ),
]


@pytest.mark.parametrize(("page", "data", "field"), ADMIN_FORM_CASES)
def test_admin_forms_explain_what_is_wrong(staff_client, page, data, field) -> None:
    inline_management = {
        f"{prefix}-{name}": 0
        for prefix in ("secrets", "endpoints", "memberships")
        for name in ("TOTAL_FORMS", "INITIAL_FORMS")
    }
    response = staff_client.post(reverse(f"admin:{page}"), {**data, **inline_management})
    assert response.status_code == 200
    assert field in response.context["adminform"].form.errors
    assert (
        not Tenant.objects.exists()
        and not Source.objects.exists()
        and not Endpoint.objects.exists()
    )

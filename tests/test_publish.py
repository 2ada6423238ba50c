"""The publish API and publish(): tokens, validation with the field named, batches, idempotency."""

import json

import pytest

from delivery.enqueueing import get_scheduler
from delivery.models import Delivery
from tests.factories import make_endpoint, make_tenant
from webhooks.models import ApiToken, Event
from webhooks.publish import PublishError, publish

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def tenant():
    tenant = make_tenant("acme")
    make_endpoint(tenant, "http://127.0.0.1:9/orders", event_types="order.created")
    make_endpoint(tenant, "http://127.0.0.1:9/all")
    return tenant


@pytest.fixture
def token() -> str:
    return ApiToken.issue("test")[1]


def call(client, body, token: str | None):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token else {}
    data = body if isinstance(body, bytes) else json.dumps(body)
    return client.post("/api/v1/events", data=data, content_type="application/json", **headers)


def test_published_event_fans_out_to_matching_endpoints(client, tenant, token) -> None:
    response = call(client, {"tenant": "acme", "event_type": "order.created", "payload": {"n": 1}}, token)
    assert response.status_code == 202
    assert response.json()["deliveries"] == 2
    response = call(client, {"tenant": "acme", "event_type": "user.deleted", "payload": {}}, token)
    assert response.json()["deliveries"] == 1
    assert get_scheduler().snapshot().fresh_depth == 3


@pytest.mark.parametrize("auth", [None, "whp_not-a-real-token"])
def test_missing_or_wrong_token_is_401(client, tenant, auth) -> None:
    response = call(client, {"tenant": "acme", "event_type": "x", "payload": {}}, auth)
    assert response.status_code == 401
    assert not Event.objects.exists()


def test_revoked_token_is_401(client, tenant) -> None:
    token, plain = ApiToken.issue("old")
    token.is_active = False
    token.save()
    assert call(client, {"tenant": "acme", "event_type": "x", "payload": {}}, plain).status_code == 401


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"event_type": "x", "payload": {}}, "tenant"),
        ({"tenant": "nobody", "event_type": "x", "payload": {}}, "tenant"),
        ({"tenant": "acme", "payload": {}}, "event_type"),
        ({"tenant": "acme", "event_type": "", "payload": {}}, "event_type"),
        ({"tenant": "acme", "event_type": "x"}, "payload"),
        ({"tenant": "acme", "event_type": "x", "payload": 1, "idempotency_key": 5}, "idempotency_key"),
        ([1, 2], "body"),
        ({"events": []}, "events"),
        ({"events": [{"tenant": "acme", "event_type": "x", "payload": {}}, {"tenant": "acme"}]}, "events[1].event_type"),
    ],
)
def test_validation_errors_name_the_field_and_store_nothing(client, tenant, token, body, field) -> None:
    response = call(client, body, token)
    assert response.status_code == 422
    assert response.json()["field"] == field
    assert not Event.objects.exists()


def test_unreadable_json_is_400(client, tenant, token) -> None:
    assert call(client, b"{nope", token).status_code == 400


def test_batch_is_stored_in_one_go(client, tenant, token, settings) -> None:
    events = [{"tenant": "acme", "event_type": "user.x", "payload": {"i": i}} for i in range(5)]
    response = call(client, {"events": events}, token)
    assert response.status_code == 202
    assert len(response.json()["events"]) == 5
    assert Delivery.objects.count() == 5
    settings.PUBLISH_MAX_BATCH = 3
    assert call(client, {"events": events}, token).status_code == 422


def test_token_bound_to_a_tenant_cannot_publish_for_another(client, tenant) -> None:
    other = make_tenant("other")
    _, plain = ApiToken.issue("acme-only", tenant=tenant)
    response = call(client, {"tenant": other.key, "event_type": "x", "payload": {}}, plain)
    assert response.status_code == 422 and response.json()["field"] == "tenant"
    assert call(client, {"tenant": "acme", "event_type": "x", "payload": {}}, plain).status_code == 202


def test_idempotency_key_makes_a_repeat_harmless(client, tenant, token) -> None:
    body = {"tenant": "acme", "event_type": "x", "payload": {}, "idempotency_key": "k-1"}
    first, again = call(client, body, token), call(client, body, token)
    assert (first.status_code, again.status_code) == (202, 200)
    assert first.json()["id"] == again.json()["id"]
    assert Event.objects.count() == 1


def test_publish_function_for_in_process_producers(tenant) -> None:
    accepted = publish(tenant, "order.created", {"total": 3})
    assert accepted.created and accepted.deliveries == 2
    assert json.loads(bytes(Event.objects.get().payload)) == {"total": 3}
    with pytest.raises(PublishError) as error:
        publish("missing", "x", {})
    assert error.value.field == "tenant"

"""The publish API and publish(): tokens, validation with the field named, batches, idempotency."""

import json
import threading

import pytest
from django.db import connection
from django.test import Client

from delivery.models import Delivery
from delivery.scheduler import get_scheduler
from ingest.accept import accept
from ingest.publish import PublishError, publish
from tests.factories import make_endpoint, make_source, make_tenant
from webhooks.models import ApiToken, Event

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
    response = call(
        client, {"tenant": "acme", "event_type": "order.created", "payload": {"n": 1}}, token
    )
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
    assert (
        call(client, {"tenant": "acme", "event_type": "x", "payload": {}}, plain).status_code == 401
    )


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"event_type": "x", "payload": {}}, "tenant"),
        ({"tenant": "nobody", "event_type": "x", "payload": {}}, "tenant"),
        ({"tenant": "acme", "payload": {}}, "event_type"),
        ({"tenant": "acme", "event_type": "", "payload": {}}, "event_type"),
        ({"tenant": "acme", "event_type": "x"}, "payload"),
        (
            {"tenant": "acme", "event_type": "x", "payload": 1, "idempotency_key": 5},
            "idempotency_key",
        ),
        ([1, 2], "body"),
        ({"events": []}, "events"),
        (
            {"events": [{"tenant": "acme", "event_type": "x", "payload": {}}, {"tenant": "acme"}]},
            "events[1].event_type",
        ),
    ],
)
def test_validation_errors_name_the_field_and_store_nothing(
    client, tenant, token, body, field
) -> None:
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
    assert (
        call(client, {"tenant": "acme", "event_type": "x", "payload": {}}, plain).status_code == 202
    )


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


# --- batches: one bulk write, same idempotency answers as one by one --------------------------


def batch(*items: dict) -> dict:
    return {"events": list(items)}


def item(key: str | None = None, **fields) -> dict:
    body = {"tenant": "acme", "event_type": "order.created", "payload": {"k": key}}
    if key is not None:
        body["idempotency_key"] = key
    return {**body, **fields}


def test_repeat_within_a_batch_answers_with_the_first(client, tenant, token) -> None:
    response = call(client, batch(item("a"), item("b"), item("a")), token)
    assert response.status_code == 202
    first, second, third = response.json()["events"]
    assert third == {"id": first["id"], "deliveries": 0, "duplicate": True}
    assert not first["duplicate"] and not second["duplicate"]
    assert Event.objects.count() == 2 and Delivery.objects.count() == 4


def test_keys_already_stored_answer_with_the_stored_event(client, tenant, token) -> None:
    earlier = call(client, item("a"), token).json()
    response = call(client, batch(item("a"), item("c"), item()), token)
    assert response.status_code == 202
    answers = response.json()["events"]
    assert answers[0] == {"id": earlier["id"], "deliveries": 0, "duplicate": True}
    assert [one["duplicate"] for one in answers[1:]] == [False, False]
    assert Event.objects.count() == 3
    # Nothing new at all: 200.
    again = call(client, batch(item("a"), item("c")), token)
    assert again.status_code == 200
    assert all(one["duplicate"] for one in again.json()["events"])


def test_same_key_for_two_tenants_is_two_events(client, tenant, token) -> None:
    make_tenant("other")
    response = call(client, batch(item("k"), item("k", tenant="other")), token)
    assert [one["duplicate"] for one in response.json()["events"]] == [False, False]
    assert Event.objects.count() == 2


def test_batch_costs_a_bounded_number_of_queries(
    client, tenant, token, django_assert_max_num_queries
) -> None:
    make_tenant("other")
    events = [item(f"k{i}", tenant="acme" if i % 2 else "other") for i in range(200)]
    with django_assert_max_num_queries(15):
        response = call(client, batch(*events), token)
    assert response.status_code == 202
    assert Event.objects.count() == 200 and Delivery.objects.count() == 200
    assert get_scheduler().snapshot().fresh_depth == 200


def test_batch_is_enqueued_only_after_the_commit_and_all_or_nothing(client, tenant, token) -> None:
    bad = batch(item("a"), {"tenant": "acme", "event_type": "x"})
    assert call(client, bad, token).status_code == 422
    assert not Event.objects.exists()
    assert get_scheduler().snapshot().fresh_depth == 0


def test_a_batch_item_that_is_not_an_object_is_named_by_its_index(client, tenant, token) -> None:
    # Found by tests/fuzz/test_fuzz_api.py: the field read "events[1]." (a dangling dot).
    answer = call(client, batch(item("a"), 7), token)
    assert answer.status_code == 422
    assert answer.json()["field"] == "events[1]"
    assert "JSON object" in answer.json()["error"]


def test_concurrent_overlapping_batches_store_each_key_once(tenant, token) -> None:
    keys = [f"k{i}" for i in range(40)]
    orders = [keys, list(reversed(keys)), keys[::2]]
    answers: dict[int, object] = {}
    barrier = threading.Barrier(len(orders))

    def send(index: int) -> None:
        barrier.wait()
        answers[index] = call(Client(), batch(*[item(key) for key in orders[index]]), token)
        connection.close()

    threads = [threading.Thread(target=send, args=(index,)) for index in range(len(orders))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    ids_by_key: dict[str, set[str]] = {}
    for index, order in enumerate(orders):
        assert answers[index].status_code in (200, 202), answers[index].content
        for key, one in zip(order, answers[index].json()["events"], strict=True):
            ids_by_key.setdefault(key, set()).add(one["id"])
    assert all(len(ids) == 1 for ids in ids_by_key.values())  # everyone got the same event
    stored = dict(Event.objects.values_list("idempotency_key", "id"))
    assert {key: ids.pop() for key, ids in ids_by_key.items()} == stored
    assert Delivery.objects.count() == 80


# --- strict JSON and safe text ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b'{"tenant":"acme","event_type":"x","payload":NaN}', "NaN"),
        (b'{"tenant":"acme","event_type":"x","payload":{"v":-Infinity}}', "-Infinity"),
        (b'{"tenant":"acme","event_type":"x","payload":1e400}', "too large"),
        (b'{"tenant":"caf\xe9","event_type":"x","payload":1}', "not UTF-8"),
        (b"[" * 100_000, "nested too deeply"),
        (b"", "not valid JSON"),
        (b'{"tenant":"acme","tenant":"other","event_type":"x","payload":1}', "'tenant' appears"),
        (b'{"tenant":"acme","event_type":"x","payload":{"a":1,"b":{"c":1,"c":2}}}', "'c' appears"),
    ],
    ids=["nan", "infinity", "float-overflow", "latin1", "deep", "empty", "dup-key", "dup-deep"],
)
def test_body_must_be_strict_json(client, tenant, token, raw: bytes, reason: str) -> None:
    response = call(client, raw, token)
    assert response.status_code == 400 and reason in response.json()["error"]
    assert not Event.objects.exists()


def test_utf8_bom_is_ignored(client, tenant, token) -> None:
    raw = b'\xef\xbb\xbf{"tenant":"acme","event_type":"x","payload":1}'
    assert call(client, raw, token).status_code == 202


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"tenant": "ac\x00me", "event_type": "x", "payload": 1}, "tenant"),
        ({"tenant": "acme", "event_type": "x\x00y", "payload": 1}, "event_type"),
        (
            {"tenant": "acme", "event_type": "x", "payload": 1, "idempotency_key": "\ud800"},
            "idempotency_key",
        ),
    ],
    ids=["tenant-nul", "event-type-nul", "key-surrogate"],
)
def test_control_characters_are_422_not_a_database_error(
    client, tenant, token, body, field
) -> None:
    raw = json.dumps(body).encode()  # \u escapes: valid JSON, unstorable text
    response = call(client, raw, token)
    assert response.status_code == 422 and response.json()["field"] == field


def test_huge_integers_in_a_payload_are_kept_exactly(client, tenant, token) -> None:
    raw = b'{"tenant":"acme","event_type":"x","payload":{"n":123456789012345678901234567890}}'
    assert call(client, raw, token).status_code == 202
    assert bytes(Event.objects.get().payload) == b'{"n":123456789012345678901234567890}'


def test_publish_function_refuses_what_is_not_json(tenant) -> None:
    for payload in (float("nan"), {"x": float("inf")}, {1, 2}):
        with pytest.raises(PublishError) as error:
            publish(tenant, "x", payload)
        assert error.value.field == "payload"
    assert not Event.objects.exists()


def test_get_is_405_with_json(client, token) -> None:
    response = client.get("/api/v1/events", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert response.status_code == 405 and response["Allow"] == "POST"
    assert "POST" in response.json()["error"]


def test_last_used_is_written_at_most_once_a_minute(client, tenant) -> None:
    api_token, plain = ApiToken.issue("t")
    call(client, {"tenant": "acme", "event_type": "x", "payload": 1}, plain)
    api_token.refresh_from_db()
    first = api_token.last_used_at
    call(client, {"tenant": "acme", "event_type": "x", "payload": 2}, plain)
    api_token.refresh_from_db()
    assert first is not None and api_token.last_used_at == first


def test_fast_inserts_read_back_exactly_like_orm_rows(client, tenant, token) -> None:
    """accept() and the batch path insert with executemany() instead of Model.save() and
    bulk_create(); what they store must read back like rows the ORM wrote, field by field
    (JSON, bytes, aware datetimes, booleans), on SQLite and PostgreSQL alike."""
    source = make_source("src", secret="k", fairness_key="header:X-Shop")
    endpoints = list(tenant.endpoints.order_by("pk"))
    reference = Event.objects.create(
        source=source,
        tenant=tenant,
        event_type="order.created",
        headers={"X-Shop": "acme", "Note": "é\\x00"},
        content_type="application/json",
        payload=b'{"n":[1,"\xc3\xa9"]}',
        idempotency_key="ref",
    )
    for endpoint in endpoints:
        Delivery.objects.create(event=reference, endpoint=endpoint, tenant=tenant)
    fast = accept(
        source=source,
        tenant=tenant,
        event_type="order.created",
        headers={"X-Shop": "acme", "Note": "é\\x00"},
        content_type="application/json",
        payload=b'{"n":[1,"\xc3\xa9"]}',
        idempotency_key="fast",
    )
    batched = call(
        client,
        batch({"tenant": "acme", "event_type": "order.created", "payload": {"n": [1, "é"]}}),
        token,
    ).json()["events"][0]
    skip_event = {"id", "received_at", "idempotency_key"}
    skip_delivery = {"id", "event", "enqueued_at", "updated_at"}

    def fields(obj, skip):
        return {
            f.attname: getattr(obj, f.attname)
            for f in obj._meta.concrete_fields
            if f.name not in skip
        }

    def deliveries(event_id):
        rows = Delivery.objects.filter(event_id=event_id).order_by("endpoint_id")
        return [fields(row, skip_delivery) for row in rows]

    stored_reference = Event.objects.get(pk=reference.pk)
    stored_fast = Event.objects.get(pk=fast.event.id)
    assert fields(stored_fast, skip_event) == fields(stored_reference, skip_event)
    assert bytes(stored_fast.payload) == bytes(stored_reference.payload)
    assert stored_fast.idempotency_key == "fast"
    assert abs((stored_fast.received_at - stored_reference.received_at).total_seconds()) < 60
    assert deliveries(fast.event.id) == deliveries(reference.pk)

    stored_batch = Event.objects.get(pk=batched["id"])
    assert json.loads(bytes(stored_batch.payload)) == json.loads(bytes(stored_reference.payload))
    assert (stored_batch.headers, stored_batch.idempotency_key, stored_batch.source_id) == (
        {},
        None,
        None,
    )
    assert deliveries(batched["id"]) == deliveries(reference.pk)
    for row in Delivery.objects.all():
        assert row.enqueued_at.tzinfo is not None and row.updated_at is not None

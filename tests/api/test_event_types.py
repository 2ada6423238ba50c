"""The event type catalogue: operators keep it through the API, every management token
reads it, and publishing applies it (an enforced schema refuses a payload that breaks it;
EVENT_TYPES_REQUIRE_CATALOGUE refuses a type it does not list)."""

import json

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from ingest import catalogue
from ingest.publish import publish_to_endpoint
from tenants.models import AuditEntry
from tests.api.helpers import Api, operator_token, tenant_token
from tests.factories import make_endpoint, make_tenant
from webhooks.models import ApiToken, Event, EventType

pytestmark = pytest.mark.django_db(transaction=True)

ORDER_SCHEMA = {
    "type": "object",
    "properties": {"id": {"type": "integer"}, "total": {"type": "number", "minimum": 0}},
    "required": ["id"],
}


@pytest.fixture(autouse=True)
def fresh_validators():
    catalogue.clear()
    yield
    catalogue.clear()


@pytest.fixture
def operator() -> Api:
    return Api(operator_token())


@pytest.fixture
def tenant():
    return make_tenant("acme")


def publish(body: object, token: str | None = None):
    token = token or ApiToken.issue("publisher")[1]
    return Client().post(
        "/api/v1/events",
        data=json.dumps(body),
        content_type="application/json",
        headers={"Authorization": f"Bearer {token}"},
    )


def order(payload: object, event_type: str = "order.created") -> dict:
    return {"tenant": "acme", "event_type": event_type, "payload": payload}


def test_an_operator_creates_reads_changes_and_archives_a_type(operator) -> None:
    made = operator.post(
        "/api/v1/event-types",
        {
            "name": "order.created",
            "description": "An order was placed.",
            "schema": ORDER_SCHEMA,
            "example": {"id": 7, "total": 12.5},
        },
    )
    assert made.status_code == 201, made.json()
    body = made.json()
    assert (body["name"], body["schema"], body["example"]) == (
        "order.created",
        ORDER_SCHEMA,
        {"id": 7, "total": 12.5},
    )
    assert (body["enforce_schema"], body["archived"]) == (False, False)

    read = operator.get("/api/v1/event-types/order.created")
    assert read.status_code == 200
    assert read.json() == body

    changed = operator.patch(
        "/api/v1/event-types/order.created", {"description": "Placed.", "enforce_schema": True}
    )
    assert changed.status_code == 200, changed.json()
    assert (changed.json()["description"], changed.json()["enforce_schema"]) == ("Placed.", True)
    assert changed.json()["updated_at"] > body["updated_at"]
    row = EventType.objects.get(name="order.created")
    assert (row.description, row.enforce_schema) == ("Placed.", True)

    gone = operator.delete("/api/v1/event-types/order.created")
    assert gone.status_code == 204
    assert EventType.objects.get(name="order.created").archived  # archived, not deleted
    assert operator.delete("/api/v1/event-types/order.created").status_code == 204
    assert operator.get("/api/v1/event-types").json()["data"] == []
    listed = operator.get("/api/v1/event-types?include_archived=true").json()["data"]
    assert [item["name"] for item in listed] == ["order.created"]
    assert operator.get("/api/v1/event-types/order.created").json()["archived"] is True

    back = operator.patch("/api/v1/event-types/order.created", {"archived": False})
    assert back.json()["archived"] is False


def test_every_change_to_the_catalogue_is_audited_once(operator) -> None:
    path = "/api/v1/event-types/order.created"
    operator.post("/api/v1/event-types", {"name": "order.created", "schema": ORDER_SCHEMA})
    operator.patch(path, {"description": "Placed.", "enforce_schema": True})
    operator.patch(path, {"description": "Placed."})  # nothing changes: nothing recorded
    operator.delete(path)
    operator.delete(path)  # archived already
    entries = AuditEntry.objects.order_by("pk")
    assert [(e.action, e.via, e.tenant_id, e.target) for e in entries] == [
        (action, "api", None, "event type order.created")
        for action in ("event_type.created", "event_type.changed", "event_type.archived")
    ]
    assert entries[1].detail == {"fields": ["description", "enforce_schema"]}
    assert all(entry.actor_name.startswith("API token") for entry in entries)


def test_a_taken_name_is_a_conflict_and_a_missing_one_is_not_found(operator) -> None:
    EventType.objects.create(name="order.created")
    taken = operator.post("/api/v1/event-types", {"name": "order.created"})
    assert taken.status_code == 409
    assert taken["Content-Type"] == "application/problem+json"
    assert operator.get("/api/v1/event-types/nothing.here").status_code == 404
    assert operator.patch("/api/v1/event-types/nothing.here", {}).status_code == 404
    assert operator.delete("/api/v1/event-types/nothing.here").status_code == 404
    assert EventType.objects.count() == 1


def test_names_with_a_slash_are_addressed_percent_encoded(operator) -> None:
    assert operator.post("/api/v1/event-types", {"name": "orders/create"}).status_code == 201
    read = operator.get("/api/v1/event-types/orders%2Fcreate")
    assert read.status_code == 200
    assert read.json()["name"] == "orders/create"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"name": "order.created", "schema": {"type": "nope"}}, "schema"),
        ({"name": "order.created", "schema": {"pattern": "("}}, "schema"),
        ({"name": "order.created", "schema": [1, 2]}, "schema"),
        ({"name": "order.created", "schema": {"$ref": "#/$defs/missing"}}, "schema"),
        ({"name": "order.created", "schema": {"$ref": "http://127.0.0.1:9/s.json"}}, "schema"),
        ({"name": "order.created", "schema": {"$ref": "#"}}, "schema"),  # never ends
        ({"name": "order.created", "schema": {"$schema": 5}}, "schema"),
        ({"name": "order.created", "schema": {"$id": "http://[::1"}}, "schema"),
        ({"name": "order.created", "schema": ORDER_SCHEMA, "example": {"id": "x"}}, "example"),
        ({"name": "order.created", "enforce_schema": True}, "enforce_schema"),
        ({"name": "order,created"}, "name"),
        ({"name": "order\ncreated"}, "name"),
        ({"name": "order.created", "colour": "red"}, "colour"),
    ],
)
def test_a_bad_type_is_refused_naming_the_field(operator, body, field) -> None:
    answer = operator.post("/api/v1/event-types", body)
    assert answer.status_code == 422, answer.json()
    assert [error["field"] for error in answer.json()["errors"]] == [field]
    assert not EventType.objects.exists()


def test_a_change_is_checked_against_what_is_saved(operator) -> None:
    EventType.objects.create(name="order.created", schema=ORDER_SCHEMA, enforce_schema=True)
    dropped = operator.patch("/api/v1/event-types/order.created", {"schema": None})
    assert dropped.status_code == 422
    assert dropped.json()["errors"][0]["field"] == "enforce_schema"
    example = operator.patch("/api/v1/event-types/order.created", {"example": {"total": 1}})
    assert example.status_code == 422
    assert "'id' is a required property" in example.json()["errors"][0]["detail"]
    assert EventType.objects.get().schema == ORDER_SCHEMA


def test_the_list_pages_by_name(operator) -> None:
    for name in ("c.one", "a.one", "b.one", "d.one"):
        EventType.objects.create(name=name)
    first = operator.get("/api/v1/event-types?limit=3").json()
    assert [item["name"] for item in first["data"]] == ["a.one", "b.one", "c.one"]
    rest = operator.get(f"/api/v1/event-types?limit=3&cursor={first['next_cursor']}").json()
    assert ([item["name"] for item in rest["data"]], rest["next_cursor"]) == (["d.one"], None)
    assert operator.get("/api/v1/event-types?include_archived=maybe").status_code == 422


def test_a_tenant_token_reads_the_catalogue_but_cannot_change_it(tenant) -> None:
    EventType.objects.create(name="order.created", description="Placed.")
    mine = Api(tenant_token(tenant))
    assert [item["name"] for item in mine.get("/api/v1/event-types").json()["data"]] == [
        "order.created"
    ]
    assert mine.get("/api/v1/event-types/order.created").status_code == 200
    assert mine.post("/api/v1/event-types", {"name": "user.deleted"}).status_code == 403
    assert mine.patch("/api/v1/event-types/order.created", {"description": "x"}).status_code == 403
    assert mine.delete("/api/v1/event-types/order.created").status_code == 403
    read_only = Api(operator_token(access=ApiToken.Access.READ))
    assert read_only.post("/api/v1/event-types", {"name": "user.deleted"}).status_code == 403
    row = EventType.objects.get()
    assert (row.description, row.archived, EventType.objects.count()) == ("Placed.", False, 1)


def test_an_enforced_schema_refuses_a_payload_that_breaks_it(tenant) -> None:
    EventType.objects.create(name="order.created", schema=ORDER_SCHEMA, enforce_schema=True)
    bad = publish(order({"id": "seven"}))
    assert bad.status_code == 422
    assert bad.json()["field"] == "payload"
    assert bad.json()["error"] == (
        "does not match the schema of order.created: $.id: 'seven' is not of type 'integer'"
    )
    batch = publish({"events": [order({"id": 1}), order({"id": 2, "total": -1})]})
    assert batch.status_code == 422
    assert batch.json()["field"] == "events[1].payload"
    assert not Event.objects.exists()  # all or nothing
    good = publish(order({"id": 7, "total": 3}))
    assert good.status_code == 202, good.json()
    assert Event.objects.count() == 1


def test_a_schema_not_enforced_lets_every_payload_through(tenant) -> None:
    EventType.objects.create(name="order.created", schema=ORDER_SCHEMA, enforce_schema=False)
    assert publish(order({"id": "seven"})).status_code == 202
    assert publish(order({"id": 7})).status_code == 202
    assert Event.objects.count() == 2


def test_a_changed_schema_applies_to_the_next_event(operator, tenant) -> None:
    EventType.objects.create(name="order.created", schema=ORDER_SCHEMA, enforce_schema=True)
    assert publish(order({"id": 7})).status_code == 202  # its validator is now kept
    stricter = {**ORDER_SCHEMA, "required": ["id", "total"]}
    assert (
        operator.patch("/api/v1/event-types/order.created", {"schema": stricter}).status_code == 200
    )
    refused = publish(order({"id": 8}))
    assert refused.status_code == 422
    assert "'total' is a required property" in refused.json()["error"]
    assert (
        operator.patch("/api/v1/event-types/order.created", {"enforce_schema": False}).status_code
        == 200
    )
    assert publish(order({"id": 9})).status_code == 202


def test_a_batch_reads_the_catalogue_once(tenant) -> None:
    EventType.objects.create(name="order.created", schema=ORDER_SCHEMA, enforce_schema=True)
    EventType.objects.create(name="order.paid")
    token = ApiToken.issue("publisher")[1]
    events = [order({"id": n}, ("order.created", "order.paid", "other")[n % 3]) for n in range(30)]

    def catalogue_queries() -> int:
        with CaptureQueriesContext(connection) as queries:
            assert publish({"events": events}, token).status_code == 202
        return sum("webhooks_eventtype" in query["sql"] for query in queries)

    assert catalogue_queries() == 2  # the rows, then the schema to compile
    assert catalogue_queries() == 1  # the rows alone: the validator is kept


def test_the_catalogue_can_be_required(settings, tenant) -> None:
    settings.EVENT_TYPES_REQUIRE_CATALOGUE = True
    EventType.objects.create(name="order.created")
    EventType.objects.create(name="order.old", archived=True)
    unknown = publish(order({"id": 1}, "user.deleted"))
    assert unknown.status_code == 422
    assert unknown.json() == {
        "error": "'user.deleted' is not in the event type catalogue",
        "field": "event_type",
    }
    archived = publish(order({"id": 1}, "order.old"))
    assert (archived.status_code, archived.json()["field"]) == (422, "event_type")
    assert not Event.objects.exists()
    assert publish(order({"id": 1})).status_code == 202
    settings.EVENT_TYPES_REQUIRE_CATALOGUE = False
    assert publish(order({"id": 1}, "user.deleted")).status_code == 202


def test_test_events_are_not_held_to_the_catalogue(settings, tenant) -> None:
    settings.EVENT_TYPES_REQUIRE_CATALOGUE = True
    endpoint = make_endpoint(tenant, "http://127.0.0.1:9/hook")
    accepted = publish_to_endpoint(endpoint, "webhook.test", {"message": "hello"})
    assert accepted.created


def test_the_admin_checks_the_schema_and_keeps_the_name(staff_client) -> None:
    add = reverse("admin:webhooks_eventtype_add")
    form = {"name": "order.created", "description": "", "example": "", "archived": ""}
    refused = staff_client.post(add, {**form, "schema": '{"type": "nope"}'})
    assert refused.status_code == 200  # the form again, with the error
    assert "Not a usable JSON Schema" in refused.content.decode()
    assert not EventType.objects.exists()
    saved = staff_client.post(add, {**form, "schema": json.dumps(ORDER_SCHEMA)})
    assert saved.status_code == 302
    row = EventType.objects.get()
    assert row.schema == ORDER_SCHEMA
    change = staff_client.get(reverse("admin:webhooks_eventtype_change", args=[row.pk]))
    assert 'name="name"' not in change.content.decode()  # read-only once made

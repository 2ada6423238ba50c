"""Messages through the API: the portal's log and event page as JSON, an endpoint's
attempts, and resend. Every lookup is the tenant's own: another tenant's ids are 404."""

import json
from datetime import timedelta
from urllib.parse import urlencode

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from delivery.models import Attempt, Delivery
from tenants.models import AuditEntry
from tests.api.helpers import Api, operator_token, tenant_token
from tests.factories import make_endpoint, make_tenant
from tests.pg_plans import assert_no_scan_of_history
from webhooks.models import ApiToken, Event

pytestmark = pytest.mark.django_db(transaction=True)
KINDS = ["order.created", "order.paid", "order.created", "order.paid", "x", "x", "x"]


@pytest.fixture
def shop() -> dict:
    """Tenant A: seven events an hour apart (oldest first) to hook1, the order.paid ones
    to hook2 too; tenant B: an endpoint, an event, a dead delivery and an attempt."""
    a = make_tenant("a.example")
    b = make_tenant("b.example")
    hook1 = make_endpoint(a, "http://127.0.0.1:9/a-one")
    hook2 = make_endpoint(a, "http://127.0.0.1:9/a-two", event_types="order.paid")
    b_hook = make_endpoint(b, "http://127.0.0.1:9/b-hook")
    base = timezone.now().replace(microsecond=0) - timedelta(hours=10)
    events = []
    for i, kind in enumerate(KINDS):
        event = Event.objects.create(
            tenant=a,
            event_type=kind,
            payload=json.dumps({"i": i}).encode(),
            received_at=base + timedelta(hours=i),
        )
        Delivery.objects.create(event=event, endpoint=hook1, tenant=a)
        if kind == "order.paid":
            Delivery.objects.create(event=event, endpoint=hook2, tenant=a)
        events.append(event)
    b_event = Event.objects.create(tenant=b, event_type="order.created", payload=b"{}")
    b_delivery = Delivery.objects.create(
        event=b_event, endpoint=b_hook, tenant=b, status=Delivery.Status.DEAD
    )
    Attempt.objects.create(
        delivery=b_delivery, endpoint=b_hook, number=1, outcome=Attempt.Outcome.FAILED
    )
    return {
        "a": a,
        "b": b,
        "hook1": hook1,
        "hook2": hook2,
        "b_hook": b_hook,
        "events": events,
        "b_event": b_event,
        "b_delivery": b_delivery,
        "base": base,
    }


@pytest.fixture
def api(shop) -> Api:
    return Api(tenant_token(shop["a"]))


def set_status(event: Event, status: str, endpoint=None) -> None:
    rows = Delivery.objects.filter(event=event)
    if endpoint is not None:
        rows = rows.filter(endpoint=endpoint)
    rows.update(status=status)


def delivery_of(shop: dict, index: int = 0, status: str | None = None) -> Delivery:
    delivery = Delivery.objects.get(event=shop["events"][index], endpoint=shop["hook1"])
    if status is not None:
        Delivery.objects.filter(pk=delivery.pk).update(status=status, attempts=5)
        delivery.refresh_from_db()
    return delivery


def messages_url(query: dict | None = None, key: str = "a.example") -> str:
    url = f"/api/v1/tenants/{key}/messages"
    return f"{url}?{urlencode(query)}" if query else url


def listed(api: Api, **query) -> list[str]:
    answer = api.get(messages_url(query))
    assert answer.status_code == 200, answer.json()
    return [item["id"] for item in answer.json()["data"]]


def fields_of(answer) -> set[str]:
    assert answer["Content-Type"] == "application/problem+json"
    return {error["field"] for error in answer.json()["errors"]}


# --- the list and its filters ------------------------------------------------------------


def test_the_list_is_newest_first_with_each_events_deliveries(api, shop) -> None:
    events = shop["events"]
    Event.objects.filter(pk=events[0].pk).update(payload=b"", payload_pruned_at=timezone.now())
    set_status(events[1], Delivery.Status.DELIVERED, endpoint=shop["hook1"])
    Delivery.objects.filter(event=events[1], endpoint=shop["hook1"]).update(
        delivered_at=shop["base"], attempts=2, last_error="HTTP 503"
    )

    answer = api.get(messages_url())

    assert answer.status_code == 200
    body = answer.json()
    assert [item["id"] for item in body["data"]] == [e.pk for e in reversed(events)]
    assert body["next_cursor"] is None
    paid = body["data"][-2]
    assert (paid["event_type"], paid["payload_removed"]) == ("order.paid", False)
    assert paid["received_at"] == (shop["base"] + timedelta(hours=1)).isoformat()
    chips = {d["endpoint_id"]: d for d in paid["deliveries"]}
    assert set(chips) == {shop["hook1"].pk, shop["hook2"].pk}
    assert chips[shop["hook1"].pk]["status"] == "delivered"
    assert chips[shop["hook1"].pk]["attempts"] == 2
    assert chips[shop["hook1"].pk]["last_error"] == "HTTP 503"
    assert chips[shop["hook1"].pk]["delivered_at"] == shop["base"].isoformat()
    assert chips[shop["hook2"].pk]["status"] == "pending"
    assert body["data"][-1]["payload_removed"] is True
    assert shop["b_event"].pk not in answer.content.decode()


def test_the_deliveries_of_a_page_are_one_query(api, shop) -> None:
    with CaptureQueriesContext(connection) as captured:
        assert api.get(messages_url()).status_code == 200
    reads = [q["sql"] for q in captured.captured_queries if 'FROM "delivery_delivery"' in q["sql"]]
    assert len(reads) == 1


def test_each_filter_narrows_the_list(api, shop) -> None:
    events, hook1, hook2 = shop["events"], shop["hook1"], shop["hook2"]
    set_status(events[0], Delivery.Status.DEAD)
    set_status(events[1], Delivery.Status.DELIVERED, endpoint=hook1)
    set_status(events[1], Delivery.Status.HELD, endpoint=hook2)
    set_status(events[2], Delivery.Status.RETRY_SCHEDULED)
    newest_first = [e.pk for e in reversed(events)]
    fmt = "%Y-%m-%dT%H:%M:%SZ"
    since = (shop["base"] + timedelta(hours=1)).strftime(fmt)
    until = (shop["base"] + timedelta(hours=3)).strftime(fmt)

    assert listed(api, event_type="order.paid") == [events[3].pk, events[1].pk]
    assert listed(api, status="dead") == [events[0].pk]
    assert listed(api, status="delivered") == [events[1].pk]
    assert listed(api, status="held") == [events[1].pk]
    assert listed(api, status="retrying") == [events[2].pk]
    assert listed(api, status="pending") == newest_first[:4]
    assert listed(api, endpoint=hook2.pk) == [events[3].pk, events[1].pk]
    # Status and endpoint narrow to the same delivery.
    assert listed(api, endpoint=hook2.pk, status="delivered") == []
    assert listed(api, endpoint=hook2.pk, status="held") == [events[1].pk]
    assert listed(api, since=since) == newest_first[:6]
    assert listed(api, until=until) == newest_first[3:]
    assert listed(api, since=since, until=until) == [events[3].pk, events[2].pk, events[1].pk]
    assert listed(api, id=events[2].pk) == [events[2].pk]
    assert listed(api, id=events[2].pk.lower()) == [events[2].pk]
    assert listed(api, id=shop["b_event"].pk) == []  # another tenant's event is not found
    # A filter is left out, not sent empty: the document's types hold for every value.
    for name in ("status", "event_type", "endpoint", "id", "since"):
        refused = api.get(messages_url({name: ""}))
        assert refused.status_code == 422
        assert fields_of(refused) == {name}


def test_pagination_walks_every_event_once(api, shop) -> None:
    events = shop["events"]
    # Two events in the same instant: the id breaks the tie.
    Event.objects.filter(pk__in=[events[5].pk, events[6].pk]).update(
        received_at=shop["base"] + timedelta(hours=5)
    )
    expected = list(
        Event.objects.filter(tenant=shop["a"])
        .order_by("-received_at", "-pk")
        .values_list("pk", flat=True)
    )
    seen, pages, cursor = [], 0, None
    while True:
        query = {"limit": 3, **({"cursor": cursor} if cursor else {})}
        body = api.get(messages_url(query)).json()
        pages += 1
        seen += [item["id"] for item in body["data"]]
        cursor = body["next_cursor"]
        if cursor is None:
            break
    assert seen == expected and len(expected) == 7 and pages == 3


def test_pagination_keeps_the_filters(api, shop) -> None:
    first = api.get(messages_url({"event_type": "x", "limit": 2})).json()
    assert len(first["data"]) == 2
    rest = api.get(
        messages_url({"event_type": "x", "limit": 2, "cursor": first["next_cursor"]})
    ).json()
    assert [item["id"] for item in first["data"] + rest["data"]] == [
        e.pk for e in reversed(shop["events"][4:])
    ]
    assert rest["next_cursor"] is None


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ({"cursor": "garbage"}, "cursor"),
        ({"limit": "0"}, "limit"),
        ({"status": "lost"}, "status"),
        ({"endpoint": "abc"}, "endpoint"),
        ({"endpoint": str(2**70)}, "endpoint"),
        ({"since": "yesterday"}, "since"),
        ({"until": "2026-13-01T00:00:00Z"}, "until"),
        ({"id": "not-an-id"}, "id"),
        ({"event_type": "a\x00b"}, "event_type"),
    ],
)
def test_bad_filters_are_422_naming_the_parameter(api, shop, query, field) -> None:
    answer = api.get(messages_url(query))
    assert answer.status_code == 422
    assert fields_of(answer) == {field}


def test_another_tenants_endpoint_is_not_found_like_one_that_does_not_exist(api, shop) -> None:
    theirs = api.get(messages_url({"endpoint": shop["b_hook"].pk}))
    nobodys = api.get(messages_url({"endpoint": 999_999}))
    assert theirs.status_code == nobodys.status_code == 404
    assert theirs.json()["detail"] == nobodys.json()["detail"]
    assert "b-hook" not in theirs.content.decode()


def test_a_window_that_ends_before_it_starts_holds_nothing(api, shop) -> None:
    assert listed(api, since="2026-01-02T00:00:00Z", until="2026-01-01T00:00:00Z") == []


# --- one event -----------------------------------------------------------------------------


def test_an_event_shows_payload_headers_and_attempts_with_signatures_masked(api, shop) -> None:
    a, event = shop["a"], shop["events"][1]
    Event.objects.filter(pk=event.pk).update(
        headers={
            "Content-Type": "application/json",
            "X-Shopify-Hmac-Sha256": "c2VjcmV0LWhtYWM=",
            "X-Request-Id": "req-42",
        }
    )
    delivery = Delivery.objects.get(event=event, endpoint=shop["hook1"])
    Delivery.objects.filter(pk=delivery.pk).update(
        status=Delivery.Status.DEAD, attempts=2, last_error="HTTP 500"
    )
    for number in (1, 2):
        Attempt.objects.create(
            delivery=delivery,
            endpoint=shop["hook1"],
            number=number,
            started_at=shop["base"] + timedelta(minutes=number),
            duration_ms=123,
            status_code=500,
            outcome=Attempt.Outcome.RETRY if number == 1 else Attempt.Outcome.FAILED,
            error="HTTP 500",
            response_excerpt="boom from the receiver",
            request_headers={"webhook-id": event.pk, "webhook-signature": "v1,TOPSECRETSIG="},
        )
    shared = make_endpoint(None, "http://127.0.0.1:9/gateway-secret-url", description="Gateway")
    Delivery.objects.create(event=event, endpoint=shared, tenant=a)

    answer = api.get(f"/api/v1/tenants/a.example/messages/{event.pk}")

    assert answer.status_code == 200
    body = answer.json()
    text = answer.content.decode()
    assert body["payload"] == {"i": 1} and body["payload_is_json"] is True
    assert body["payload_removed"] is False and body["payload_clipped"] is False
    assert body["headers"] == {"Content-Type": "application/json", "X-Request-Id": "req-42"}
    assert "c2VjcmV0LWhtYWM=" not in text and "TOPSECRETSIG" not in text
    by_endpoint = {d["endpoint_id"]: d for d in body["deliveries"]}
    dead = by_endpoint[shop["hook1"].pk]
    assert (dead["status"], dead["resendable"], dead["endpoint"]) == (
        "dead",
        True,
        "http://127.0.0.1:9/a-one",
    )
    assert [attempt["number"] for attempt in dead["attempt_log"]] == [1, 2]
    last = dead["attempt_log"][-1]
    assert (last["status_code"], last["duration_ms"], last["outcome"]) == (500, 123, "failed")
    assert last["response_excerpt"] == "boom from the receiver"
    assert last["request_headers"]["webhook-id"] == event.pk
    assert last["request_headers"]["webhook-signature"] == "•••••• (masked)"
    gateway = by_endpoint[shared.pk]
    assert (gateway["endpoint"], gateway["shared"]) == ("Gateway", True)
    assert "gateway-secret-url" not in text
    assert by_endpoint[shop["hook2"].pk]["attempt_log"] == []


def test_the_whole_payload_is_answered_and_text_stays_text(api, shop) -> None:
    big, plain = shop["events"][2], shop["events"][3]
    Event.objects.filter(pk=big.pk).update(payload=json.dumps({"blob": "x" * 100_000}).encode())
    Event.objects.filter(pk=plain.pk).update(payload=b"a=1&b=2", content_type="text/plain")

    body = api.get(f"/api/v1/tenants/a.example/messages/{big.pk}").json()
    assert len(body["payload"]["blob"]) == 100_000  # the portal clips at 64 KB; the API does not
    assert body["payload_clipped"] is False
    body = api.get(f"/api/v1/tenants/a.example/messages/{plain.pk}").json()
    assert (body["payload"], body["payload_is_json"]) == ("a=1&b=2", False)


@pytest.mark.parametrize("depth", [10_000, 201])
def test_a_payload_nested_too_deep_to_lay_out_is_answered_as_its_text(api, shop, depth) -> None:
    event, shallow = shop["events"][2], shop["events"][3]
    deep = b"[" * depth + b"]" * depth
    Event.objects.filter(pk=event.pk).update(payload=deep)
    Event.objects.filter(pk=shallow.pk).update(payload=b"[" * 200 + b"]" * 200)

    answer = api.get(f"/api/v1/tenants/a.example/messages/{event.pk}")

    assert answer.status_code == 200
    assert (answer.json()["payload"], answer.json()["payload_is_json"]) == (deep.decode(), False)
    laid_out = api.get(f"/api/v1/tenants/a.example/messages/{shallow.pk}").json()
    assert laid_out["payload_is_json"] is True


def test_a_payload_removed_by_retention_is_said_so(api, shop) -> None:
    event = shop["events"][0]
    Event.objects.filter(pk=event.pk).update(payload=b"", payload_pruned_at=timezone.now())
    set_status(event, Delivery.Status.DEAD)

    body = api.get(f"/api/v1/tenants/a.example/messages/{event.pk}").json()

    assert (body["payload"], body["payload_removed"]) == (None, True)
    assert body["deliveries"][0]["resendable"] is False


# --- an endpoint's attempts and one delivery -----------------------------------------------


def make_attempts(shop: dict, count: int) -> list[Attempt]:
    """`count` attempts on hook1, a minute apart (oldest first), over the first events."""
    made = []
    for n in range(count):
        delivery = delivery_of(shop, n % len(shop["events"]))
        made.append(
            Attempt.objects.create(
                delivery=delivery,
                endpoint=shop["hook1"],
                number=1,
                started_at=shop["base"] + timedelta(minutes=n),
                status_code=200 if n % 2 else 500,
                outcome=Attempt.Outcome.DELIVERED if n % 2 else Attempt.Outcome.RETRY,
                error="" if n % 2 else "HTTP 500",
            )
        )
    return made


def test_an_endpoints_attempts_newest_first_paged_and_filtered(api, shop) -> None:
    made = make_attempts(shop, 7)
    # A tie in started_at: the id breaks it.
    Attempt.objects.filter(pk=made[3].pk).update(started_at=made[4].started_at)
    Attempt.objects.create(  # another endpoint's attempt is not in the list
        delivery=Delivery.objects.get(event=shop["events"][1], endpoint=shop["hook2"]),
        endpoint=shop["hook2"],
        number=1,
        outcome=Attempt.Outcome.DELIVERED,
    )
    url = f"/api/v1/tenants/a.example/endpoints/{shop['hook1'].pk}/attempts"
    expected = list(
        Attempt.objects.filter(endpoint=shop["hook1"])
        .order_by("-started_at", "-pk")
        .values_list("pk", flat=True)
    )
    seen, cursor = [], None
    while True:
        body = api.get(f"{url}?limit=3" + (f"&cursor={cursor}" if cursor else "")).json()
        seen += body["data"]
        cursor = body["next_cursor"]
        if cursor is None:
            break
    assert [item["id"] for item in seen] == expected and len(expected) == 7
    newest = seen[0]
    assert newest["delivery_id"] == made[6].delivery_id
    assert newest["event_id"] == shop["events"][6].pk
    assert (newest["outcome"], newest["status_code"], newest["error"]) == ("retry", 500, "HTTP 500")
    assert newest["started_at"] == made[6].started_at.isoformat()
    retries = api.get(f"{url}?outcome=retry").json()["data"]
    assert [item["id"] for item in retries] == [made[n].pk for n in (6, 4, 2, 0)]
    bad = api.get(f"{url}?outcome=lost")
    assert bad.status_code == 422 and fields_of(bad) == {"outcome"}


def test_one_delivery_with_its_attempts(api, shop) -> None:
    delivery = delivery_of(shop, 0, Delivery.Status.DEAD)
    make_attempts(shop, 1)

    answer = api.get(f"/api/v1/tenants/a.example/deliveries/{delivery.pk}")

    assert answer.status_code == 200
    body = answer.json()
    assert (body["id"], body["event_id"], body["status"]) == (
        delivery.pk,
        shop["events"][0].pk,
        "dead",
    )
    assert (body["attempts"], body["resendable"], body["shared"]) == (5, True, False)
    assert [a["error"] for a in body["attempt_log"]] == ["HTTP 500"]


# --- isolation -----------------------------------------------------------------------------


def test_another_tenants_ids_are_404_and_nothing_changes(api, shop) -> None:
    b_event, b_delivery, b_hook = shop["b_event"], shop["b_delivery"], shop["b_hook"]
    operator = Api(operator_token())
    reads = [
        f"/api/v1/tenants/{{key}}/messages/{b_event.pk}",
        f"/api/v1/tenants/{{key}}/deliveries/{b_delivery.pk}",
        f"/api/v1/tenants/{{key}}/endpoints/{b_hook.pk}/attempts",
    ]
    resend = f"/api/v1/tenants/{{key}}/deliveries/{b_delivery.pk}/resend"
    # B's ids under A's URL, by A's token and by an operator's.
    for caller in (api, operator):
        for url in reads:
            answer = caller.get(url.format(key="a.example"))
            assert answer.status_code == 404, url
            assert answer["Content-Type"] == "application/problem+json"
        assert caller.post(resend.format(key="a.example")).status_code == 404
    # B's URL through A's token: B's tenant is not there for it.
    for url in [*reads, "/api/v1/tenants/{key}/messages"]:
        assert api.get(url.format(key="b.example")).status_code == 404, url
    assert api.post(resend.format(key="b.example")).status_code == 404
    b_delivery.refresh_from_db()
    assert b_delivery.status == Delivery.Status.DEAD
    assert not AuditEntry.objects.exists()
    # The operator reaches it under B's own URL.
    assert operator.get(reads[0].format(key="b.example")).status_code == 200


# --- resend --------------------------------------------------------------------------------


def resend_url(delivery: Delivery) -> str:
    return f"/api/v1/tenants/a.example/deliveries/{delivery.pk}/resend"


@pytest.mark.parametrize("finished", [Delivery.Status.DEAD, Delivery.Status.DELIVERED])
def test_resend_queues_a_finished_delivery_and_is_audited(api, shop, finished) -> None:
    delivery = delivery_of(shop, 0, finished)

    answer = api.post(resend_url(delivery))

    assert answer.status_code == 202, answer.json()
    assert (answer.json()["id"], answer.json()["status"]) == (delivery.pk, "pending")
    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts) == (Delivery.Status.PENDING, 0)
    entry = AuditEntry.objects.get()
    assert (entry.tenant, entry.action, entry.via) == (
        shop["a"],
        AuditEntry.Action.DELIVERY_RESENT,
        "api",
    )
    assert entry.target == f"delivery {delivery.pk}"
    assert entry.detail["previous_status"] == finished
    assert entry.actor_name.startswith("API token a.example token")


@pytest.mark.parametrize(
    "waiting", [Delivery.Status.PENDING, Delivery.Status.RETRY_SCHEDULED, Delivery.Status.HELD]
)
def test_resend_of_a_delivery_on_its_way_is_409(api, shop, waiting) -> None:
    delivery = delivery_of(shop, 0, waiting)

    answer = api.post(resend_url(delivery))

    assert answer.status_code == 409
    assert "only delivered or dead" in answer.json()["detail"]
    delivery.refresh_from_db()
    assert delivery.status == waiting
    assert not AuditEntry.objects.exists()


def test_resend_after_the_payload_was_removed_is_409(api, shop) -> None:
    delivery = delivery_of(shop, 0, Delivery.Status.DEAD)
    Event.objects.filter(pk=delivery.event_id).update(payload=b"", payload_pruned_at=timezone.now())

    answer = api.post(resend_url(delivery))

    assert answer.status_code == 409
    assert "payload was removed" in answer.json()["detail"]
    delivery.refresh_from_db()
    assert delivery.status == Delivery.Status.DEAD
    assert not AuditEntry.objects.exists()


def test_a_read_only_token_may_not_resend(shop) -> None:
    delivery = delivery_of(shop, 0, Delivery.Status.DEAD)
    reader = Api(tenant_token(shop["a"], access=ApiToken.Access.READ))

    assert reader.get(f"/api/v1/tenants/a.example/deliveries/{delivery.pk}").status_code == 200
    answer = reader.post(resend_url(delivery))

    assert answer.status_code == 403
    delivery.refresh_from_db()
    assert delivery.status == Delivery.Status.DEAD
    assert not AuditEntry.objects.exists()


def test_a_resend_retried_with_its_idempotency_key_happens_once(api, shop) -> None:
    delivery = delivery_of(shop, 0, Delivery.Status.DEAD)
    key = {"Idempotency-Key": "k-1"}
    first = api.post(resend_url(delivery), **key)
    assert first.status_code == 202
    Delivery.objects.filter(pk=delivery.pk).update(status=Delivery.Status.DEAD)
    again = api.post(resend_url(delivery), **key)
    assert again.status_code == 202 and again["Idempotent-Replayed"] == "true"
    assert again.json() == first.json()
    delivery.refresh_from_db()
    assert delivery.status == Delivery.Status.DEAD  # the second was not sent again
    assert AuditEntry.objects.count() == 1


# --- the plans -----------------------------------------------------------------------------


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's query planner")
def test_every_list_and_lookup_is_served_by_an_index(api, shop) -> None:
    events, hook1 = shop["events"], shop["hook1"]
    make_attempts(shop, 3)
    cursor = api.get(messages_url({"limit": 2})).json()["next_cursor"]
    attempts = f"/api/v1/tenants/a.example/endpoints/{hook1.pk}/attempts"
    urls = [
        messages_url(),
        messages_url({"limit": 2, "cursor": cursor}),
        messages_url({"event_type": "order.paid"}),
        messages_url({"status": "dead"}),
        messages_url({"status": "delivered"}),
        messages_url({"endpoint": hook1.pk, "status": "pending"}),
        messages_url({"since": shop["base"].isoformat()}),
        messages_url({"id": events[2].pk}),
        f"/api/v1/tenants/a.example/messages/{events[2].pk}",
        attempts,
        f"{attempts}?outcome=retry",
        f"/api/v1/tenants/a.example/deliveries/{delivery_of(shop, 0).pk}",
    ]
    for url in urls:
        with CaptureQueriesContext(connection) as captured:
            assert api.get(url).status_code == 200, url
        assert_no_scan_of_history(captured.captured_queries, url)

"""The tenant portal's message log (/t/<key>/messages/), an event's page and its resend."""

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from dashboards import messages as log
from delivery.models import Attempt, Delivery
from ingest.publish import publish
from tenants import share
from tenants.models import AuditEntry, Endpoint, Membership
from tests.factories import make_endpoint, make_tenant, make_user
from tests.pg_plans import assert_no_scan_of_history
from webhooks.models import Event

pytestmark = pytest.mark.django_db(transaction=True)


def member(username: str, tenant, role: str = Membership.VIEWER):
    return make_user(username, tenant=tenant, role=role)


@pytest.fixture
def shop():
    """Tenant A with two endpoints and five events an hour apart (newest last), and tenant
    B with one of its own, so every page has something of B's to leak."""
    a = make_tenant("a.example", name="Shop A")
    b = make_tenant("b.example", name="Rival B")
    hook1 = make_endpoint(a, "http://127.0.0.1:9/a-one")
    hook2 = make_endpoint(a, "http://127.0.0.1:9/a-two", event_types="orders/paid")
    b_hook = make_endpoint(b, "http://127.0.0.1:9/b-hook")
    base = timezone.now().replace(microsecond=0) - timedelta(hours=10)
    events = []
    for i, kind in enumerate(["orders/create", "orders/paid", "orders/create", "orders/paid", "x"]):
        event = publish(a, kind, {"i": i}).event
        Event.objects.filter(pk=event.pk).update(received_at=base + timedelta(hours=i))
        events.append(Event.objects.get(pk=event.pk))
    b_event = publish(b, "orders/create", {"rival": True}).event
    return {
        "a": a,
        "b": b,
        "hook1": hook1,
        "hook2": hook2,
        "b_hook": b_hook,
        "events": events,
        "b_event": b_event,
        "base": base,
    }


def log_url(tenant, **query) -> str:
    url = reverse("tenants:messages", args=[tenant.key])
    if query:
        from urllib.parse import urlencode

        url += "?" + urlencode(query)
    return url


def shown_ids(response) -> list[str]:
    """Event ids in the log's table, in order."""
    body = response.content.decode()
    table = body[body.index('id="events"') :]
    return re.findall(r"/messages/([0-9A-HJKMNP-TV-Z]{26})/", table)


def set_status(event, status, endpoint=None) -> None:
    rows = Delivery.objects.filter(event=event)
    if endpoint is not None:
        rows = rows.filter(endpoint=endpoint)
    rows.update(status=status)


# --- the log and its filters ---------------------------------------------------------


def test_log_lists_the_tenants_events_newest_first_with_chips(client, shop) -> None:
    client.force_login(member("ann", shop["a"]))
    response = client.get(log_url(shop["a"]))
    assert response.status_code == 200
    assert "no-store" in response["Cache-Control"]
    # Not "no-referrer": Chromium would post this portal's forms with "Origin: null".
    assert response["Referrer-Policy"] == "same-origin"
    assert shown_ids(response) == [e.pk for e in reversed(shop["events"])]
    body = response.content.decode()
    assert shop["b_event"].pk not in body and "b-hook" not in body and "Rival B" not in body
    assert 'class="chip chip-pending"' in body
    # Times to the second, with the machine-readable instant beside them.
    newest = timezone.localtime(shop["events"][-1].received_at)
    assert newest.strftime("%Y-%m-%d %H:%M:%S") in body


def test_each_filter_narrows(client, shop) -> None:
    a, events = shop["a"], shop["events"]
    client.force_login(member("ann", a))
    set_status(events[0], Delivery.Status.DEAD)
    set_status(events[1], Delivery.Status.DELIVERED, endpoint=shop["hook1"])
    set_status(events[1], Delivery.Status.HELD, endpoint=shop["hook2"])
    set_status(events[2], Delivery.Status.RETRY_SCHEDULED)

    def ids(**query) -> list[str]:
        response = client.get(log_url(a, **query))
        assert response.status_code == 200, response.content
        return shown_ids(response)

    assert ids(event_type="orders/paid") == [events[3].pk, events[1].pk]
    assert ids(status="dead") == [events[0].pk]
    assert ids(status="delivered") == [events[1].pk]
    assert ids(status="held") == [events[1].pk]
    assert ids(status="retrying") == [events[2].pk]
    assert ids(status="pending") == [events[4].pk, events[3].pk]
    # hook2 takes orders/paid only.
    assert ids(endpoint=shop["hook2"].pk) == [events[3].pk, events[1].pk]
    # Status and endpoint apply to the same delivery: events[1]'s hook2 delivery is held.
    assert ids(endpoint=shop["hook2"].pk, status="delivered") == []
    assert ids(endpoint=shop["hook2"].pk, status="held") == [events[1].pk]
    fmt = "%Y-%m-%dT%H:%M:%S"
    since = timezone.localtime(shop["base"] + timedelta(hours=1)).strftime(fmt)
    until = timezone.localtime(shop["base"] + timedelta(hours=3)).strftime(fmt)
    assert ids(since=since) == [e.pk for e in reversed(events[1:])]
    assert ids(until=until) == [e.pk for e in reversed(events[:4])]
    assert ids(since=since, until=until) == [events[3].pk, events[2].pk, events[1].pk]
    assert ids(event_id=events[2].pk) == [events[2].pk]
    assert ids(event_id=events[2].pk.lower()) == [events[2].pk]  # ids are case-blind


@pytest.mark.parametrize(
    ("query", "reason"),
    [
        ({"status": "lost"}, "Select a valid choice"),
        ({"endpoint": "abc"}, "Not one of your endpoints"),
        ({"endpoint": "999999"}, "Not one of your endpoints"),
        ({"since": "yesterday"}, "Enter a valid date/time"),
        ({"since": "2026-01-02T00:00:00", "until": "2026-01-01T00:00:00"}, "must be before"),
        ({"event_id": "not-an-id"}, "26 letters and digits"),
        ({"before": "garbage"}, "page link is not valid"),
        ({"before": "99999999999999999999-01ARZ3NDEKTSV4RRFFQ69G5FAV"}, "not valid"),
        (
            {"before": "1-01ARZ3NDEKTSV4RRFFQ69G5FAV", "after": "1-01ARZ3NDEKTSV4RRFFQ69G5FAV"},
            "not both",
        ),
    ],
)
def test_bad_filters_get_400_with_the_reason(client, shop, query, reason) -> None:
    client.force_login(member("ann", shop["a"]))
    response = client.get(log_url(shop["a"], **query))
    assert response.status_code == 400
    assert reason in response.content.decode()


def test_pagination_walks_every_row_once_both_ways(client, shop, monkeypatch) -> None:
    a = shop["a"]
    # More events, two of them in the same microsecond: the id breaks the tie.
    extra = [publish(a, "bulk", {"n": n}).event for n in range(6)]
    same = timezone.now().replace(microsecond=0)
    Event.objects.filter(pk__in=[extra[0].pk, extra[1].pk]).update(received_at=same)
    monkeypatch.setattr(log.page, "__kwdefaults__", {"before": None, "after": None, "size": 3})
    client.force_login(member("ann", a))
    expected = list(
        Event.objects.filter(tenant=a).order_by("-received_at", "-pk").values_list("pk", flat=True)
    )
    assert len(expected) == 11
    seen, pages, url = [], [], log_url(a)
    while url:
        response = client.get(url)
        assert response.status_code == 200
        pages.append(response)
        seen += shown_ids(response)
        found = re.search(r'href="([^"]+)" rel="next"', response.content.decode())
        url = found and found[1].replace("&amp;", "&")
    assert seen == expected and len(pages) == 4
    # And back up through the "newer" links from the last page.
    back, url = [], None
    found = re.search(r'href="([^"]+)" rel="prev"', pages[-1].content.decode())
    url = found and found[1].replace("&amp;", "&")
    while url:
        response = client.get(url)
        back = shown_ids(response) + back
        found = re.search(r'href="([^"]+)" rel="prev"', response.content.decode())
        url = found and found[1].replace("&amp;", "&")
    assert back + shown_ids(pages[-1]) == expected


def test_pagination_keeps_the_filters(client, shop, monkeypatch) -> None:
    a = shop["a"]
    for n in range(4):
        publish(a, "bulk", {"n": n})
    monkeypatch.setattr(log.page, "__kwdefaults__", {"before": None, "after": None, "size": 2})
    client.force_login(member("ann", a))
    first = client.get(log_url(a, event_type="bulk"))
    older = re.search(r'href="([^"]+)" rel="next"', first.content.decode())[1]
    assert "event_type=bulk" in older
    second = client.get(older.replace("&amp;", "&"))
    assert len(shown_ids(second)) == 2
    assert set(shown_ids(first)).isdisjoint(shown_ids(second))
    assert all(
        Event.objects.get(pk=pk).event_type == "bulk" for pk in shown_ids(first) + shown_ids(second)
    )


# --- an event's page ---------------------------------------------------------------------


def test_event_page_shows_payload_deliveries_attempts_and_hides_signatures(client, shop) -> None:
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
    Attempt.objects.create(
        delivery=delivery,
        number=1,
        duration_ms=123,
        status_code=500,
        outcome=Attempt.Outcome.FAILED,
        error="HTTP 500",
        response_excerpt="boom from the receiver",
        request_headers={"webhook-id": event.pk, "webhook-signature": "v1,TOPSECRETSIG="},
    )
    shared = make_endpoint(None, "http://10.0.0.9/gateway-secret-url", description="Gateway")
    Delivery.objects.create(event=event, endpoint=shared, tenant=a)
    client.force_login(member("ann", a))
    response = client.get(reverse("tenants:message", args=[a.key, event.pk]))
    assert response.status_code == 200
    body = response.content.decode().replace("<wbr>", "")  # URLs may wrap at separators
    assert "&quot;i&quot;: 1" in body  # pretty-printed JSON
    assert "req-42" in body
    assert "Hmac" not in body and "c2VjcmV0LWhtYWM=" not in body
    assert "TOPSECRETSIG" not in body and "masked" in body
    assert "boom from the receiver" in body and "123 ms" in body and "HTTP 500" in body
    assert "http://127.0.0.1:9/a-one" in body and "http://127.0.0.1:9/a-two" in body
    assert "Gateway" in body and "gateway-secret-url" not in body


def test_big_payload_is_clipped_with_a_note(client, shop) -> None:
    a = shop["a"]
    event = publish(a, "big", {"blob": "x" * 100_000}).event
    client.force_login(member("ann", a))
    body = client.get(reverse("tenants:message", args=[a.key, event.pk])).content.decode()
    assert 'id="payload-clipped"' in body and "64 KB" in body
    assert body.count("x") < 70_000


def test_a_payload_nested_too_deep_to_lay_out_is_shown_as_its_text(client, shop) -> None:
    a, event = shop["a"], shop["events"][1]
    Event.objects.filter(pk=event.pk).update(payload=b"[" * 10_000 + b"]" * 10_000)
    client.force_login(member("ann", a))
    response = client.get(reverse("tenants:message", args=[a.key, event.pk]))
    assert response.status_code == 200
    assert "[[[[[[[[" in response.content.decode()


# --- isolation -----------------------------------------------------------------------------


def test_member_of_a_cannot_reach_b(client, shop) -> None:
    a, b, b_event = shop["a"], shop["b"], shop["b_event"]
    client.force_login(member("ann", a, role=Membership.ADMIN))
    assert client.get(log_url(b)).status_code == 404
    assert client.get(reverse("tenants:message", args=[b.key, b_event.pk])).status_code == 404
    # B's event id under A's key.
    assert client.get(reverse("tenants:message", args=[a.key, b_event.pk])).status_code == 404
    response = client.get(log_url(a, event_id=b_event.pk))
    assert response.status_code == 200 and shown_ids(response) == []
    # B's endpoint as a filter: not one of A's endpoints.
    response = client.get(log_url(a, endpoint=shop["b_hook"].pk))
    assert response.status_code == 400 and "b-hook" not in response.content.decode()
    # B's delivery, under A's key (with B's or A's event id) and under B's key.
    b_delivery = Delivery.objects.get(event=b_event)
    b_delivery.status = Delivery.Status.DEAD
    b_delivery.save()
    for key, event_id in [(a.key, b_event.pk), (a.key, shop["events"][0].pk), (b.key, b_event.pk)]:
        url = reverse("tenants:resend", args=[key, event_id, b_delivery.pk])
        assert client.post(url).status_code == 404
    b_delivery.refresh_from_db()
    assert b_delivery.status == Delivery.Status.DEAD
    assert not AuditEntry.objects.exists()


def test_share_links_cannot_open_the_log(client, shop) -> None:
    a, event = shop["a"], shop["events"][0]
    token = share.make_token(a)
    assert client.get(reverse("tenants:shared", args=[a.key, token])).status_code == 200
    shared_page = client.get(reverse("tenants:shared", args=[a.key, token])).content.decode()
    assert "/messages/" not in shared_page  # no link to the log on the read-only view
    base = f"/t/{a.key}/s/{token}"
    for url in [
        f"{base}/messages/",
        f"{base}/messages/{event.pk}/",
        f"{base}/messages/{event.pk}/deliveries/{event.deliveries.first().pk}/resend/",
    ]:
        assert client.get(url).status_code == 404, url
        assert client.post(url).status_code == 404, url
    # Without a session the log itself sends the visitor to sign in, token or not.
    response = client.get(log_url(a) + f"?token={token}")
    assert response.status_code == 302 and "/accounts/login/" in response["Location"]


def test_dashboard_links_the_log_for_members(client, shop) -> None:
    a = shop["a"]
    client.force_login(member("ann", a))
    page = client.get(reverse("tenants:dashboard", args=[a.key])).content.decode()
    assert f'href="{log_url(a)}"' in page


# --- resend --------------------------------------------------------------------------------


def dead_delivery(shop, status: str = Delivery.Status.DEAD) -> Delivery:
    delivery = Delivery.objects.get(event=shop["events"][0], endpoint=shop["hook1"])
    Delivery.objects.filter(pk=delivery.pk).update(status=status, attempts=5)
    delivery.refresh_from_db()
    return delivery


def resend_url(shop, delivery) -> str:
    return reverse("tenants:resend", args=[shop["a"].key, delivery.event_id, delivery.pk])


@pytest.mark.parametrize("finished", [Delivery.Status.DEAD, Delivery.Status.DELIVERED])
def test_admin_resends_a_finished_delivery_and_it_is_audited(client, shop, finished) -> None:
    a = shop["a"]
    delivery = dead_delivery(shop, finished)
    admin = member("boss", a, role=Membership.ADMIN)
    client.force_login(admin)
    page = client.get(reverse("tenants:message", args=[a.key, delivery.event_id])).content.decode()
    assert resend_url(shop, delivery) in page
    response = client.post(resend_url(shop, delivery), follow=True)
    assert response.redirect_chain[-1][0] == reverse(
        "tenants:message", args=[a.key, delivery.event_id]
    )
    assert "queued again" in response.content.decode()
    delivery.refresh_from_db()
    assert delivery.status == Delivery.Status.PENDING and delivery.attempts == 0
    entry = AuditEntry.objects.get()
    assert (entry.actor, entry.tenant, entry.action, entry.via) == (
        admin,
        a,
        AuditEntry.Action.DELIVERY_RESENT,
        AuditEntry.Via.PORTAL,
    )
    assert entry.target == f"delivery {delivery.pk}"
    assert entry.detail["previous_status"] == finished


def test_open_deliveries_are_not_resent(client, shop) -> None:
    a = shop["a"]
    delivery = Delivery.objects.get(event=shop["events"][0], endpoint=shop["hook1"])
    assert delivery.status == Delivery.Status.PENDING
    client.force_login(member("boss", a, role=Membership.ADMIN))
    page = client.get(reverse("tenants:message", args=[a.key, delivery.event_id])).content.decode()
    assert resend_url(shop, delivery) not in page
    response = client.post(resend_url(shop, delivery), follow=True)
    assert "only delivered or dead deliveries can be resent" in response.content.decode()
    assert not AuditEntry.objects.exists()


def test_viewer_sees_no_button_and_gets_403(client, shop) -> None:
    a = shop["a"]
    delivery = dead_delivery(shop)
    client.force_login(member("val", a))
    page = client.get(reverse("tenants:message", args=[a.key, delivery.event_id])).content.decode()
    assert "Resend" not in page
    assert client.post(resend_url(shop, delivery)).status_code == 403
    delivery.refresh_from_db()
    assert delivery.status == Delivery.Status.DEAD
    assert not AuditEntry.objects.exists()


def test_staff_who_may_view_cannot_resend_from_the_portal(staff_client, shop) -> None:
    delivery = dead_delivery(shop)
    assert staff_client.get(log_url(shop["a"])).status_code == 200
    assert staff_client.post(resend_url(shop, delivery)).status_code == 403


def test_resend_needs_csrf_and_post(shop) -> None:
    a = shop["a"]
    delivery = dead_delivery(shop)
    client = Client(enforce_csrf_checks=True)
    client.force_login(member("boss", a, role=Membership.ADMIN))
    assert client.post(resend_url(shop, delivery)).status_code == 403
    delivery.refresh_from_db()
    assert delivery.status == Delivery.Status.DEAD
    assert client.get(resend_url(shop, delivery)).status_code == 405
    # With the page's token it goes through.
    page = client.get(reverse("tenants:message", args=[a.key, delivery.event_id])).content.decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)[1]
    response = client.post(resend_url(shop, delivery), {"csrfmiddlewaretoken": token})
    assert response.status_code == 302
    delivery.refresh_from_db()
    assert delivery.status == Delivery.Status.PENDING
    assert AuditEntry.objects.count() == 1


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's query planner")
def test_every_filter_of_the_log_is_served_by_an_index(shop) -> None:
    a, events = shop["a"], shop["events"]
    client = Client()
    client.force_login(member("ann", a))
    since = (shop["base"] + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M")
    pages = [
        {},
        {"event_type": "orders/paid"},
        {"status": "dead"},
        {"status": "delivered"},
        {"endpoint": shop["hook1"].pk},
        {"endpoint": shop["hook2"].pk, "status": "held"},
        {"since": since},
        {"event_id": events[2].pk},
    ]
    for query in pages:
        with CaptureQueriesContext(connection) as captured:
            assert client.get(log_url(a, **query)).status_code == 200
        assert_no_scan_of_history(captured.captured_queries, str(query))
    with CaptureQueriesContext(connection) as captured:
        page = reverse("tenants:message", args=[a.key, events[2].pk])
        assert client.get(page).status_code == 200
    assert_no_scan_of_history(captured.captured_queries, "an event's page")


def test_a_resend_to_a_disabled_endpoint_says_it_is_held(client, shop) -> None:
    a = shop["a"]
    delivery = dead_delivery(shop)
    Endpoint.objects.filter(pk=shop["hook1"].pk).update(enabled=False)
    client.force_login(member("boss", a, role=Membership.ADMIN))

    page = client.post(resend_url(shop, delivery), follow=True).content.decode()

    assert "that endpoint is disabled: it is held" in page
    assert "goes out in your turn" not in page


def test_the_event_page_counts_every_attempt_made(client, shop) -> None:
    a = shop["a"]
    delivery = dead_delivery(shop)
    for number in range(1, 6):
        Attempt.objects.create(
            delivery=delivery, number=number, status_code=500, outcome=Attempt.Outcome.RETRY
        )
    client.force_login(member("boss", a, role=Membership.ADMIN))
    client.post(resend_url(shop, delivery))

    page = client.get(reverse("tenants:message", args=[a.key, delivery.event_id])).content
    facts = re.sub(r"\s+", " ", page.decode())

    assert "<dt>Attempts</dt><dd>5 " in facts
    assert "(0 since it was sent again)" in facts

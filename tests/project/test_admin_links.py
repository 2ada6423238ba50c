"""Operators walk from an event to its deliveries, from a tenant or an endpoint to its
history, find an attempt by event id, tenant key or URL, and read what was sent and
answered on the delivery's own page, with times to the second."""

from datetime import UTC, datetime

import pytest
from django.urls import reverse

from delivery.models import Attempt, Delivery
from ingest.publish import publish
from tests.factories import make_endpoint, make_tenant
from webhooks.models import Event

pytestmark = pytest.mark.django_db


@pytest.fixture
def two_shops():
    """acme with two endpoints and two events; other with one of each."""
    acme, other = make_tenant("acme"), make_tenant("other")
    make_endpoint(acme, "http://127.0.0.1:9/acme-a")
    make_endpoint(acme, "http://127.0.0.1:9/acme-b")
    make_endpoint(other, "http://127.0.0.1:9/other")
    first = publish(acme, "order.created", {"n": 1}).event
    publish(acme, "order.paid", {"n": 2})
    publish(other, "order.created", {"n": 3})
    return acme, other, first


def listed_ids(response) -> set[str]:
    return {str(row.pk) for row in response.context["cl"].result_list}


def follow_link(client, page: str, text: str):
    """The admin list a page's link with `text` points at."""
    html = client.get(page).content.decode()
    head = html[: html.index(f">{text}</a>")]
    href = head[head.rindex('href="') + 6 :].split('"', 1)[0].replace("&amp;", "&")
    return client.get(href)


def test_an_event_links_to_exactly_its_deliveries(staff_client, two_shops) -> None:
    _acme, _other, first = two_shops
    page = reverse("admin:webhooks_event_change", args=[first.pk])

    listed = follow_link(staff_client, page, "2 deliveries")

    assert listed.status_code == 200
    assert listed_ids(listed) == set(first.deliveries.values_list("id", flat=True))


def test_a_tenant_links_to_its_events_and_deliveries_only(staff_client, two_shops) -> None:
    acme, _other, _first = two_shops
    page = reverse("admin:tenants_tenant_change", args=[acme.pk])

    events = follow_link(staff_client, page, "events")
    deliveries = follow_link(staff_client, page, "deliveries")

    assert listed_ids(events) == set(Event.objects.filter(tenant=acme).values_list("id", flat=True))
    assert listed_ids(deliveries) == set(
        Delivery.objects.filter(tenant=acme).values_list("id", flat=True)
    )
    assert len(listed_ids(deliveries)) == 4


def test_an_endpoint_links_to_its_deliveries(staff_client, two_shops) -> None:
    endpoint = Delivery.objects.filter(tenant=two_shops[0]).first().endpoint
    page = reverse("admin:tenants_endpoint_change", args=[endpoint.pk])

    listed = follow_link(staff_client, page, "this endpoint&#x27;s deliveries")

    assert listed_ids(listed) == set(endpoint.deliveries.values_list("id", flat=True))
    assert len(listed_ids(listed)) == 2


def record_attempts() -> None:
    for number, delivery in enumerate(Delivery.objects.order_by("id"), start=1):
        Attempt.objects.create(
            delivery=delivery,
            endpoint_id=delivery.endpoint_id,  # as delivery.pipeline.records writes them
            number=1,
            started_at=datetime(2026, 12, 4, 10, 0, number, tzinfo=UTC),
            status_code=500,
            outcome=Attempt.Outcome.RETRY,
            response_excerpt=f"boom {number}",
            request_headers={"webhook-id": delivery.event_id, "X-Try": str(number)},
        )


@pytest.mark.parametrize("by", ["event id", "tenant key", "part of the URL"])
def test_attempts_are_found_by_event_id_tenant_key_or_url(staff_client, two_shops, by) -> None:
    _acme, other, _first = two_shops
    record_attempts()
    wanted = Attempt.objects.filter(delivery__tenant=other)
    term = {
        "event id": wanted.get().delivery.event_id,
        "tenant key": "other",
        "part of the URL": "9/other",
    }[by]

    listed = staff_client.get(reverse("admin:delivery_attempt_changelist"), {"q": term})

    assert listed_ids(listed) == {str(wanted.get().pk)}


def test_the_attempts_tenant_box_narrows_to_one_tenant(staff_client, two_shops) -> None:
    acme, _other, _first = two_shops
    record_attempts()
    listed = staff_client.get(reverse("admin:delivery_attempt_changelist"), {"tenant_key": "acme"})
    wanted = Attempt.objects.filter(delivery__tenant=acme).values_list("id", flat=True)
    assert listed_ids(listed) == {str(pk) for pk in wanted} and wanted


def test_a_delivery_page_shows_what_was_sent_and_answered_to_the_second(
    staff_client, two_shops
) -> None:
    record_attempts()
    attempt = Attempt.objects.select_related("delivery").order_by("started_at").last()

    html = staff_client.get(
        reverse("admin:delivery_delivery_change", args=[attempt.delivery_id])
    ).content.decode()

    second = attempt.started_at.second
    assert f"10:00:{second:02d}" in html  # the admin's default showed 10 a.m.
    assert f"X-Try: {attempt.request_headers['X-Try']}" in html
    assert attempt.response_excerpt in html

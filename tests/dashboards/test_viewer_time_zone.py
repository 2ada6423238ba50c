"""Times on the portal in the viewer's own zone (the `tz` cookie the portal's script sets):
shown in it, and typed into filters in it."""

from datetime import UTC, datetime

import pytest
from django.urls import reverse

from ingest.publish import publish
from tenants.models import Membership
from tests.factories import make_endpoint, make_tenant, make_user
from webhooks.models import Event

pytestmark = pytest.mark.django_db

RECEIVED = datetime(2026, 1, 15, 12, 0, 5, tzinfo=UTC)  # 13:00:05 in Berlin (CET)


@pytest.fixture
def viewer(client):
    tenant = make_tenant("a.example")
    make_endpoint(tenant)
    event = publish(tenant, "orders/create", {}).event
    Event.objects.filter(pk=event.pk).update(received_at=RECEIVED)
    user = make_user("ann", tenant=tenant)
    assert Membership.objects.filter(user=user, tenant=tenant).exists()
    client.force_login(user)
    return client, tenant, event


def test_without_the_cookie_times_are_in_the_servers_zone(viewer) -> None:
    client, tenant, event = viewer
    page = client.get(reverse("tenants:message", args=[tenant.key, event.pk])).content.decode()
    assert "2026-01-15 12:00:05" in page
    assert "(UTC)" in page


@pytest.mark.parametrize("cookie", ["Europe/Berlin", "Europe%2FBerlin"])
def test_the_browsers_zone_is_used_for_what_is_shown(viewer, cookie) -> None:
    client, tenant, event = viewer
    client.cookies["tz"] = cookie
    page = client.get(reverse("tenants:message", args=[tenant.key, event.pk])).content.decode()
    assert "2026-01-15 13:00:05" in page
    assert "Europe/Berlin" in page
    log = client.get(reverse("tenants:messages", args=[tenant.key])).content.decode()
    assert "2026-01-15 13:00:05" in log and "in Europe/Berlin" in log


def test_times_typed_into_a_filter_are_read_in_the_browsers_zone(viewer) -> None:
    client, tenant, event = viewer
    client.cookies["tz"] = "Europe/Berlin"
    url = reverse("tenants:messages", args=[tenant.key])
    # 13:00 Berlin is 12:00 UTC: from 13:00 includes the event, from 13:01 does not.
    assert event.pk in client.get(url, {"since": "2026-01-15T13:00"}).content.decode()
    assert event.pk not in client.get(url, {"since": "2026-01-15T13:01"}).content.decode()


@pytest.mark.parametrize(
    "cookie", ["Mars/Olympus_Mons", "../../etc/passwd", "Europe/Berlin\x00", "x" * 200, ""]
)
def test_a_bad_zone_cookie_falls_back_to_the_servers_zone(viewer, cookie) -> None:
    client, tenant, event = viewer
    client.cookies["tz"] = cookie
    response = client.get(reverse("tenants:message", args=[tenant.key, event.pk]))
    assert response.status_code == 200
    assert "2026-01-15 12:00:05" in response.content.decode()

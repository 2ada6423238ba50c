"""Every tenant page and the operators' overview fit a phone, a laptop and a desktop
window: Chromium finds no page wider than its window at 390, 1280 and 1440 px.

The scene is the one that made pages too wide: long endpoint URLs, a failing endpoint
with its attempts, held deliveries, counts in the tens of thousands, an audit trail.
Screenshots of each page at each width go to test-artifacts/ (docs/screenshots/ holds a
copy of the 390 and 1440 px ones)."""

from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from delivery.models import Attempt, Delivery
from ingest.publish import publish
from tenants.models import Membership
from tests.factories import make_endpoint, make_tenant, make_user

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

WIDTHS = (390, 1280, 1440)
LONG_URL = (
    "http://127.0.0.1:9/webhooks/shopify/orders/very-long-path-segment-for-a-customer"
    "/with?query=parameters&that=never&end=true&and-some-more=to-be-sure"
)


@pytest.fixture
def scene(browser_settings) -> dict:
    tenant = make_tenant("big-shop-with-a-long-name.example", name="Big Shop With A Long Name")
    failing = make_endpoint(tenant, LONG_URL, description="orders to the warehouse")
    healthy = make_endpoint(tenant, "http://127.0.0.1:9/ok", description="healthy")
    for i in range(30):
        publish(tenant, "orders/create-with-a-rather-long-event-type-name", {"i": i, "x": "y" * 80})
    deliveries = list(Delivery.objects.filter(endpoint=failing).order_by("id"))
    for delivery in deliveries[:20]:
        Attempt.objects.create(
            delivery=delivery,
            endpoint=failing,
            number=1,
            status_code=500,
            outcome=Attempt.Outcome.RETRY,
            error="HTTP 500",
            response_excerpt="<html><body>" + "Internal Server Error " * 20 + "</body></html>",
        )
    Delivery.objects.filter(pk__in=[d.pk for d in deliveries[:10]]).update(
        status=Delivery.Status.RETRY_SCHEDULED,
        attempts=1,
        next_attempt_at=timezone.now() + timedelta(minutes=3),
    )
    Delivery.objects.filter(pk__in=[d.pk for d in deliveries[10:20]]).update(
        status=Delivery.Status.DEAD,
        attempts=1,
        # The longest error a delivery keeps, without a space to wrap at.
        last_error="connection refused by " + "upstream-" * 40,
    )
    failing.consecutive_failures = 12
    failing.failing_since = timezone.now() - timedelta(minutes=20)
    # As the workers leave an endpoint that failed its last attempts: the page's health
    # line then shows both times, as it does for a real one.
    failing.last_failure_at = timezone.now() - timedelta(seconds=40)
    failing.last_success_at = failing.failing_since
    failing.save()
    admin = make_user("boss", tenant=tenant, role=Membership.ADMIN)
    event = deliveries[0].event
    return {
        "tenant": tenant,
        "endpoint": failing,
        "healthy": healthy,
        "admin": admin,
        "event": event,
    }


def _pages(scene: dict) -> dict[str, str]:
    key = scene["tenant"].key
    return {
        "tenant-dashboard": reverse("tenants:dashboard", args=[key]),
        "tenant-endpoints": reverse("tenants:endpoints", args=[key]),
        "tenant-endpoint": reverse("tenants:endpoint", args=[key, scene["endpoint"].pk]),
        "tenant-endpoint-new": reverse("tenants:endpoint-new", args=[key]),
        "tenant-message-log": reverse("tenants:messages", args=[key]),
        "tenant-message": reverse("tenants:message", args=[key, scene["event"].pk]),
        "tenant-replay": reverse("tenants:replays", args=[key]),
        "tenant-audit": reverse("tenants:audit", args=[key]),
        "tenant-home": reverse("tenants:home"),
    }


def _signed_in(chromium, live_server, user: User, width: int) -> Iterator[object]:
    client = Client()
    client.force_login(user)
    context = chromium.new_context(viewport={"width": width, "height": 900})
    context.add_cookies(
        [{"name": "sessionid", "value": client.cookies["sessionid"].value, "url": live_server.url}]
    )
    return context


def _overflow(page) -> dict:
    return page.evaluate(
        """() => {
            const root = document.documentElement;
            const wide = [...document.querySelectorAll('body *')]
              .filter((el) => el.getBoundingClientRect().right > root.clientWidth + 1)
              .slice(0, 5)
              .map((el) => el.tagName.toLowerCase() + (el.id ? '#' + el.id : '')
                   + (el.className && typeof el.className === 'string'
                      ? '.' + el.className.split(' ').join('.') : ''));
            return {page: root.scrollWidth, window: root.clientWidth, wide};
        }"""
    )


@pytest.mark.parametrize("width", WIDTHS)
def test_no_tenant_page_is_wider_than_its_window(
    chromium, live_server, scene, width, artifacts
) -> None:
    context = _signed_in(chromium, live_server, scene["admin"], width)
    page = context.new_page()
    too_wide = {}
    try:
        for name, path in _pages(scene).items():
            page.goto(live_server.url + path)
            page.wait_for_load_state("networkidle")
            page.screenshot(path=str(artifacts / f"{name}-{width}.png"), full_page=True)
            found = _overflow(page)
            if found["page"] > found["window"]:
                too_wide[name] = found
    finally:
        context.close()
    assert not too_wide, too_wide


@pytest.mark.parametrize("width", WIDTHS)
def test_the_overview_is_no_wider_than_its_window(
    chromium, live_server, scene, width, artifacts
) -> None:
    ops = User.objects.create_superuser("ops", "ops@example.com", "pw-ops")
    context = _signed_in(chromium, live_server, ops, width)
    page = context.new_page()
    try:
        page.goto(live_server.url + "/admin/overview/")
        page.screenshot(path=str(artifacts / f"admin-overview-{width}.png"), full_page=True)
        found = _overflow(page)
    finally:
        context.close()
    assert found["page"] <= found["window"], found

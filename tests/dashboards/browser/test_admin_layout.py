"""The admin as an operator sees it in real headless Chromium: the index's overview link
and the changelists at a laptop's width, with long URLs and ULIDs in the rows."""

from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from delivery.models import Attempt, Delivery
from tests.factories import make_endpoint, make_source, make_tenant
from webhooks.models import Event

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

LONG_KEYS = [
    "northwind-outdoor-supplies-eu-west.myshopify.com",
    "contoso-premium-garden-furniture-and-decor.myshopify.com",
    # What an unbounded fairness key registers before the key guard stops it.
    "session-" + "7f3c9a1e2b4d6f8091a2b3c4d5e6f708" * 4,
]
LONG_URL = (
    "https://hooks.integrations.example-fulfilment-partner.com/webhooks/v2/receive/"
    "7f3c9a1e2b4d6f8091a2b3c4d5e6f708?account=northwind-outdoor&signature_version=2"
)
FIRST_URL = f"{LONG_URL}&n=0"
# Each changelist, and a long value it clips that must stay whole in a title.
CHANGELISTS = {
    "delivery_delivery": FIRST_URL,
    "delivery_attempt": None,
    "webhooks_event": "fulfillment_orders/cancellation_request_submitted",
    "tenants_endpoint": FIRST_URL,
    "tenants_tenant": LONG_KEYS[2],
}


@pytest.fixture
def realistic_rows() -> None:
    """A few rows of each kind with the longest values operators really see."""
    source = make_source("storefront-platform-orders")
    now = timezone.now()
    for n, key in enumerate(LONG_KEYS):
        tenant = make_tenant(key, name=f"Shop {n} with a rather long trading name Ltd")
        endpoint = make_endpoint(
            tenant, f"{LONG_URL}&n={n}", disabled_reason="HTTP 410 Gone from the receiver"
        )
        for i in range(3):
            event = Event.objects.create(
                source=source,
                tenant=tenant,
                event_type="fulfillment_orders/cancellation_request_submitted",
                payload=b"{}",
            )
            delivery = Delivery.objects.create(
                event=event,
                endpoint=endpoint,
                tenant=tenant,
                status=Delivery.Status.RETRY_SCHEDULED,
                lane=Delivery.Lane.RETRY,
                attempts=7,
                next_attempt_at=now + timedelta(hours=i),
                delivered_at=now,
            )
            Attempt.objects.create(
                delivery=delivery,
                number=1,
                duration_ms=30_000,
                status_code=503,
                outcome=Attempt.Outcome.RETRY,
                error="timed out",
            )
    Event.objects.create(
        source=source,
        event_type="orders/create",
        payload=b"{}",
        fallback_reason="no tenant key at body.shop_id (the fairness key)",
    )


@pytest.fixture
def admin_page(chromium, live_server, browser_settings) -> Iterator[object]:
    """A page signed in as a superuser, at a 1400 x 900 viewport."""
    user = User.objects.create_superuser("ops", "ops@example.com", "pw-ops")
    client = Client()
    client.force_login(user)
    context = chromium.new_context(viewport={"width": 1400, "height": 900})
    context.add_cookies(
        [{"name": "sessionid", "value": client.cookies["sessionid"].value, "url": live_server.url}]
    )
    page = context.new_page()
    yield page
    context.close()


def test_the_operations_overview_link_reads_as_one_line(admin_page, live_server, artifacts) -> None:
    admin_page.goto(live_server.url + reverse("admin:index"))
    admin_page.screenshot(path=str(artifacts / "admin-index.png"))
    link = admin_page.locator("#operations-overview-link a", has_text="Operations overview")
    box = link.bounding_box()
    line_height = admin_page.evaluate(
        "(el) => parseFloat(getComputedStyle(el).lineHeight) || el.getBoundingClientRect().height",
        link.element_handle(),
    )
    # One letter per line made it about 19 lines tall and one letter wide.
    assert box["height"] <= line_height * 1.5, box
    assert box["width"] > 100, box


@pytest.mark.parametrize("changelist", CHANGELISTS)
def test_changelists_fit_a_1400px_window(
    admin_page, live_server, realistic_rows, changelist, artifacts
) -> None:
    admin_page.goto(live_server.url + reverse(f"admin:{changelist}_changelist"))
    assert admin_page.locator("#result_list tbody tr").count() > 0
    widths = admin_page.evaluate(
        """() => {
            const table = document.querySelector('#result_list');
            const area = document.querySelector('#changelist .results');
            const page = document.documentElement;
            return {table: table.scrollWidth, area: area.clientWidth,
                    page: page.scrollWidth, window: page.clientWidth};
        }"""
    )
    admin_page.screenshot(path=str(artifacts / f"admin-{changelist}.png"), full_page=True)
    assert widths["table"] <= widths["area"], widths
    assert widths["page"] <= widths["window"], widths
    if full := CHANGELISTS[changelist]:
        assert admin_page.locator(f'#result_list [title="{full}"]').count() > 0

"""A tenant admin in real headless Chromium: finds an event in the message log by its id,
opens it, resends its dead delivery and reads the confirmation."""

from datetime import timedelta

import pytest
from django.utils import timezone

from delivery.models import Attempt, Delivery
from ingest.publish import publish
from tenants.models import AuditEntry, Membership
from tests.factories import make_endpoint, make_tenant, make_user
from webhooks.models import Event

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

KINDS = ["orders/create", "orders/paid", "fulfillments/create", "refunds/create"]


@pytest.fixture
def history():
    """A shop with a dozen events over the last hour: delivered, retrying, dead, pending."""
    shop = make_tenant("north-shop.example", name="North Shop")
    make_user("owner", tenant=shop)
    Membership.objects.filter(user__username="owner").update(role=Membership.ADMIN)
    orders = make_endpoint(shop, "https://hooks.north-shop.example/orders")
    make_endpoint(shop, "https://erp.north-shop.example/webhooks", event_types="orders/paid")
    now = timezone.now().replace(microsecond=0)
    events = []
    for n in range(12):
        event = publish(shop, KINDS[n % 4], {"order": {"id": 1000 + n, "total": "19.90"}}).event
        Event.objects.filter(pk=event.pk).update(received_at=now - timedelta(minutes=5 * (12 - n)))
        events.append(event)
    for event in events[:9]:
        Delivery.objects.filter(event=event).update(
            status=Delivery.Status.DELIVERED, attempts=1, delivered_at=now
        )
    Delivery.objects.filter(event=events[9]).update(
        status=Delivery.Status.RETRY_SCHEDULED, attempts=2, next_attempt_at=now
    )
    dead = Delivery.objects.get(event=events[5], endpoint=orders)
    Delivery.objects.filter(pk=dead.pk).update(
        status=Delivery.Status.DEAD, attempts=5, delivered_at=None, last_error="HTTP 503"
    )
    for number in range(1, 6):
        Attempt.objects.create(
            delivery=dead,
            number=number,
            started_at=now - timedelta(minutes=30 - number),
            duration_ms=40 + number,
            status_code=503,
            outcome=Attempt.Outcome.FAILED if number == 5 else Attempt.Outcome.RETRY,
            error="HTTP 503",
            response_excerpt='{"error": "maintenance"}',
            request_headers={
                "content-type": "application/json",
                "webhook-id": events[5].pk,
                "webhook-signature": "v1,c2lnbmF0dXJlLXZhbHVl",
            },
        )
    return shop, events[5], dead


def test_admin_finds_an_event_by_id_and_resends_it(
    chromium, live_server, browser_settings, history, artifacts
) -> None:
    shop, event, dead = history
    base = live_server.url
    context = chromium.new_context(
        viewport={"width": 1400, "height": 1000}, timezone_id="Europe/Berlin"
    )
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))

    page.goto(f"{base}/accounts/login/?next=/t/{shop.key}/")
    page.fill("#id_username", "owner")
    page.fill("#id_password", "pw-owner")
    page.click("button[type=submit]")
    page.wait_for_url(f"{base}/t/{shop.key}/")
    page.click("#message-log-link")
    page.wait_for_url(f"{base}/t/{shop.key}/messages/")
    assert page.locator("#events tbody tr").count() == 12
    assert page.locator("#events .chip-dead").count() == 1
    # The browser's zone, told by the portal's script on the login page, is the page's.
    assert "in Europe/Berlin" in page.inner_text("main")
    page.screenshot(path=str(artifacts / "tenant-message-log.png"), full_page=True)

    page.fill("#id_event_id", event.pk.lower())
    page.click("#filters button[type=submit]")
    page.wait_for_load_state("networkidle")
    rows = page.locator("#events tbody tr")
    assert rows.count() == 1
    page.click(f"#events a:has-text('{event.pk}')")
    page.wait_for_url(f"{base}/t/{shop.key}/messages/{event.pk}/")
    assert page.inner_text("#event-id") == event.pk
    card = page.locator(f"#delivery-{dead.pk}")
    assert card.locator("table.attempts > tbody > tr").count() == 5
    assert "c2lnbmF0dXJlLXZhbHVl" not in page.content()

    card.locator("button:has-text('Resend')").click()
    page.wait_for_url(f"{base}/t/{shop.key}/messages/{event.pk}/")
    assert "queued again" in page.inner_text("#flash")
    page.screenshot(path=str(artifacts / "tenant-message-resent.png"), full_page=True)
    dead.refresh_from_db()
    assert dead.status == Delivery.Status.PENDING
    assert AuditEntry.objects.filter(target=f"delivery {dead.pk}").count() == 1
    # Members' pages post their forms with a real Origin (Referrer-Policy: same-origin):
    # under no-referrer Chromium sent "Origin: null" and CSRF refused the resend.
    page.click("button:has-text('Sign out')")
    page.wait_for_url(f"{base}/accounts/login/")
    assert errors == []
    context.close()

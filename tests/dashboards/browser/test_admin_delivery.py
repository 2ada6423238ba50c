"""A dead delivery's admin page in real headless Chromium: read-only, and its Resend
button posts (with the CSRF token the page carries) and comes back with a message."""

from datetime import UTC, datetime

import pytest
from django.urls import reverse

from delivery.models import Attempt, Delivery
from delivery.scheduler import get_scheduler
from ingest.publish import publish
from tenants.models import AuditEntry
from tests.dashboards.browser.test_admin_layout import admin_page  # noqa: F401 (a fixture)
from tests.factories import make_endpoint, make_tenant

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def dead_delivery() -> Delivery:
    tenant = make_tenant("northwind-outdoor.myshopify.com")
    make_endpoint(tenant, "https://hooks.example-fulfilment.com/webhooks/v2/receive")
    publish(tenant, "orders/create", {"order_id": 1234})
    scheduler = get_scheduler()
    [lease] = scheduler.pick("w", 1).leases
    scheduler.ack([lease], outcome="dead")
    delivery = Delivery.objects.get(pk=lease.delivery_id)
    for number in range(1, 4):
        Attempt.objects.create(
            delivery=delivery,
            number=number,
            started_at=datetime(2026, 12, 4, 10, number, 7, tzinfo=UTC),
            duration_ms=120,
            status_code=500,
            outcome=Attempt.Outcome.FAILED if number == 3 else Attempt.Outcome.RETRY,
            response_excerpt='{"error": "database is locked"}',
            request_headers={"webhook-id": delivery.event_id, "content-type": "application/json"},
        )
    Delivery.objects.filter(pk=delivery.pk).update(
        status=Delivery.Status.DEAD, attempts=3, last_error="HTTP 500"
    )
    return delivery


def test_resend_from_a_dead_deliverys_page(
    admin_page,  # noqa: F811
    live_server,
    dead_delivery,
    artifacts,
) -> None:
    admin_page.goto(
        live_server.url + reverse("admin:delivery_delivery_change", args=[dead_delivery.pk])
    )
    assert admin_page.locator("h1").inner_text() == f"Delivery {dead_delivery.pk}"
    assert admin_page.locator('input[name="_save"]').count() == 0
    assert admin_page.locator(".deletelink").count() == 0

    admin_page.get_by_role("button", name="Resend").click()
    admin_page.wait_for_load_state()

    message = admin_page.locator(".messagelist .success")
    assert f"Delivery {dead_delivery.pk} resent" in message.inner_text()
    admin_page.screenshot(path=str(artifacts / "admin-delivery.png"), full_page=True)
    assert Delivery.objects.get(pk=dead_delivery.pk).status == Delivery.Status.PENDING
    assert AuditEntry.objects.get().action == AuditEntry.Action.DELIVERY_RESENT

"""A tenant admin manages an endpoint in real headless Chromium: edits it, reveals and
rotates its signing secret, sends a test event that a real engine delivers, and sees the
result. Saves tenant-endpoints.png (1400 px wide) in test-artifacts/."""

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from delivery.models import Attempt, Delivery
from tenants.models import Endpoint, Membership
from tests.factories import make_endpoint, make_tenant, make_user
from tests.http_receivers import Recorder
from webhooks.models import Event

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def _history(endpoint, count: int, failing_every: int) -> None:
    """Some attempts over the last day, so the health columns have numbers."""
    now = timezone.now()
    for i in range(count):
        event = Event.objects.create(
            tenant=endpoint.tenant, event_type="order.created", payload=b"{}"
        )
        delivery = Delivery.objects.create(
            event=event, endpoint=endpoint, tenant=endpoint.tenant, status="delivered"
        )
        Attempt.objects.create(
            delivery=delivery,
            endpoint=endpoint,
            number=1,
            started_at=now - timedelta(minutes=7 * i + 1),
            duration_ms=80 + (i * 37) % 400,
            status_code=500 if i % failing_every == 0 else 200,
            outcome="retry" if i % failing_every == 0 else "delivered",
        )


def test_a_tenant_admin_edits_rotates_and_tests_an_endpoint(
    chromium, live_server, browser_settings, settings, engine, artifacts
) -> None:
    settings.ALLOW_PRIVATE_DESTINATIONS = True  # the receiver listens on 127.0.0.1
    base = live_server.url
    with Recorder() as receiver:
        shop = make_tenant("corner-shop.example", name="Corner Shop")
        main = make_endpoint(shop, receiver.url + "orders", description="Order sync")
        backup = make_endpoint(shop, receiver.url + "backup", event_types="refund.created")
        legacy = make_endpoint(shop, "http://127.0.0.1:9/legacy", description="Old ERP")
        Endpoint.objects.filter(pk=legacy.pk).update(
            enabled=False,
            disabled_at=timezone.now() - timedelta(hours=3),
            disabled_reason="Disabled by corner-admin: replaced by the new ERP",
        )
        _history(main, 180, failing_every=9)
        _history(backup, 40, failing_every=4)
        admin = make_user("corner-admin", tenant=shop)
        Membership.objects.filter(user=admin).update(role=Membership.ADMIN)

        context = chromium.new_context(viewport={"width": 1400, "height": 900})
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(f"{base}/t/{shop.key}/")
        page.fill("#id_username", "corner-admin")
        page.fill("#id_password", "pw-corner-admin")
        page.click("button[type=submit]")
        page.click("#endpoints-link")
        assert page.url == f"{base}/t/{shop.key}/endpoints/"
        assert "replaced by the new ERP" in page.inner_text("#endpoint-table")

        # Edit: description and event filter.
        page.click(f"a[href='/t/{shop.key}/endpoints/{main.pk}/']")
        page.fill("#id_description", "Order sync (v2)")
        page.fill("#id_event_types", "order.created\norder.paid")
        page.click("#endpoint-form button[type=submit]")
        assert "Saved: description, event types." in page.inner_text("#messages")
        main.refresh_from_db()
        assert main.event_types == "order.created, order.paid"

        # Reveal, then rotate: each shows the secret once.
        page.click("#reveal")
        revealed = page.inner_text("#secret-values code.secret").strip()
        assert re.fullmatch(r"whsec_\S+", revealed)
        page.go_back()
        page.fill("#id_overlap_hours", "24")
        page.click("#rotate")
        assert "keeps signing beside it for 24 hours" in page.inner_text("#secret-panel")
        rotated = page.inner_text("#secret-values code.secret").strip()
        assert rotated.startswith("whsec_") and rotated != revealed
        assert main.secrets.count() == 2
        page.click("text=Back to the endpoint")
        assert page.locator("#secrets tbody tr").count() == 2

        # A test event: delivered to this endpoint alone, signed, result one click away.
        page.click("#send-test")
        assert "queued for this endpoint" in page.inner_text("#messages")
        engine()
        [request] = receiver.wait_for(1)
        assert request.path == "/orders"
        assert len(request.headers["webhook-signature"].split()) == 2  # old and new secret
        page.click("text=See its result")
        page.wait_for_function(
            "() => { const s = document.querySelector('#delivery-status');"
            " if (s && s.textContent.trim() === 'Delivered') return true;"
            " location.reload(); return false; }",
            timeout=15_000,
            polling=1_000,
        )
        assert "HTTP 200" in page.inner_text("#attempts")
        page.screenshot(path=str(artifacts / "tenant-endpoint-delivery.png"), full_page=True)

        page.goto(f"{base}/t/{shop.key}/endpoints/")
        page.screenshot(path=str(artifacts / "tenant-endpoints.png"), full_page=True)
        page.goto(f"{base}/t/{shop.key}/endpoints/{main.pk}/")
        page.screenshot(path=str(artifacts / "tenant-endpoint.png"), full_page=True)
        page.goto(f"{base}/t/{shop.key}/audit/")
        audit = page.inner_text("#audit")
        for action in (
            "Endpoint changed",
            "Signing secret revealed",
            "Signing secret rotated",
            "Test event sent",
        ):
            assert action in audit
        assert revealed not in page.content() and rotated not in page.content()
        context.close()
    assert errors == []

"""A tenant admin replays a window in real headless Chromium: fills in the form, reads
the preview, confirms, and watches the progress move as the sweep feeds chunks."""

from datetime import timedelta

import pytest
from django.utils import timezone

from delivery.models import Delivery, ReplayJob
from delivery.scheduler import get_scheduler
from delivery.upkeep import maintenance
from tenants.models import Membership
from tests.delivery.test_replay_window import finished_deliveries
from tests.factories import make_endpoint, make_tenant, make_user

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
FMT = "%Y-%m-%dT%H:%M:%S"
DEAD, CHUNK = 30, 10


def test_a_tenant_admin_previews_confirms_and_follows_a_replay(
    chromium, live_server, browser_settings, settings, artifacts
) -> None:
    settings.REPLAY_CHUNK_SIZE = CHUNK
    tenant = make_tenant("replay-shop.example", name="Replay Shop")
    endpoint = make_endpoint(tenant, "https://receiver.replay-shop.example/webhooks/orders")
    make_endpoint(tenant, "https://receiver.replay-shop.example/webhooks/refunds")
    finished_deliveries(tenant, endpoint, DEAD, kind="orders/create")
    finished_deliveries(tenant, endpoint, 12, Delivery.Status.DELIVERED, kind="orders/create")
    owner = make_user("replay-owner", tenant=tenant)
    Membership.objects.filter(user=owner).update(role=Membership.ADMIN)
    now = timezone.localtime()

    context = chromium.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    base, path = live_server.url, f"/t/{tenant.key}/replays/"
    page.goto(f"{base}/accounts/login/?next={path}")
    page.fill("#id_username", "replay-owner")
    page.fill("#id_password", "pw-replay-owner")
    page.click("button[type=submit]")
    page.wait_for_url(base + path)
    assert page.inner_text("h1") == "Replays"
    assert "No replays yet." in page.inner_text("#replay-jobs")

    page.select_option("#id_endpoint", str(endpoint.pk))
    page.uncheck("#id_statuses_1")  # dead only, not delivered
    page.fill("#id_event_type", "orders/create")
    page.fill("#id_start", (now - timedelta(hours=1)).strftime(FMT))
    page.fill("#id_end", (now + timedelta(minutes=5)).strftime(FMT))
    page.click("button[name=preview]")
    page.wait_for_load_state("networkidle")
    preview = page.inner_text("#replay-preview")
    assert f"{DEAD} deliveries will be sent again through Replay Shop's lane." in preview

    page.click("button[name=confirm]")
    page.wait_for_url(base + path)
    job = ReplayJob.objects.get()
    row = page.locator(f"#replay-{job.pk}")
    assert "Running" in row.inner_text() and f"0 / {DEAD}" in row.inner_text()

    # The worker's sweep feeds the first chunk; the page's refresh shows it, no reload.
    get_scheduler().start_epoch()
    maintenance.sweep()
    page.wait_for_function(
        f"() => document.querySelector('#replay-{job.pk} .replay-progress')"
        f".textContent.includes('{CHUNK} / {DEAD}')",
        timeout=15_000,
    )
    # Times are the browser's local rendering, to the second.
    started = page.inner_text(f"#replay-{job.pk} time")
    assert started.count(":") == 2
    page.evaluate("() => window.scrollTo(0, 0)")
    page.screenshot(path=str(artifacts / "tenant-replay.png"), full_page=True)
    assert errors == []
    context.close()

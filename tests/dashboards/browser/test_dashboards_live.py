"""End to end in real headless Chromium, while a real worker delivers a flood.

A worker subprocess (`manage.py rqworker`) delivers two tenants' floods and a quiet
tenant's few events to a slow local receiver; the pages are served by a live server.
The browser signs in, watches the numbers change without a reload, and saves
screenshots under test-artifacts/.
"""

import re
import signal
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from django.contrib.auth.models import User

from delivery.models import Delivery
from ingest.publish import publish
from tenants import share
from tenants.models import Tenant
from tests.delivery_helpers import start_worker, wait_until
from tests.factories import make_endpoint, make_tenant, make_user
from tests.http_receivers import Recorder, Reply

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

# Four slots at 80 ms each deliver 50/s, shared by turns: the busy shop's backlog lasts
# about 56 s, twice the time the test takes to reach the overview on this machine, so both
# floods are still backlogged whenever it looks (with 500 the busy shop had drained there
# on a slow run). The test then waits for everything: about 58 s of delivery in all.
FLOOD_A, FLOOD_B, QUIET = 1500, 1400, 5
SAMPLE_SECONDS = 2


@dataclass
class Flood:
    loud: Tenant
    other: Tenant
    quiet: Tenant
    receiver: Recorder


def _number(text: str) -> int:
    digits = re.sub(r"[^0-9]", "", text)
    return int(digits) if digits else 0


@pytest.fixture
def flood(browser_settings, settings) -> Iterator[Flood]:
    settings.HISTORY_SAMPLE_SECONDS = SAMPLE_SECONDS
    with Recorder(Reply(200, delay=0.08)) as receiver:
        loud = make_tenant("loud-shop.example", name="Loud Shop")
        other = make_tenant("busy-shop.example", name="Busy Shop")
        quiet = make_tenant("quiet-shop.example", name="Quiet Shop")
        for tenant in (loud, other, quiet):
            # A generous cap: the worker's slots, shared by turns, are what paces them.
            make_endpoint(tenant, receiver.url + tenant.key, max_in_flight=16)
        for i in range(FLOOD_A):
            publish(loud, "orders/create", {"order": i})
        for i in range(FLOOD_B):
            publish(other, "products/update", {"product": i})
        worker = start_worker(
            DELIVERY_CONCURRENCY="4",
            MAINTENANCE_INTERVAL_SECONDS="1",
            HISTORY_SAMPLE_SECONDS=str(SAMPLE_SECONDS),
        )
        try:
            receiver.wait_for(20, timeout=60)
            for i in range(QUIET):
                publish(quiet, "orders/create", {"order": i})
            yield Flood(loud, other, quiet, receiver)
        finally:
            worker.send_signal(signal.SIGTERM)
            try:
                worker.wait(30)
            except Exception:
                worker.kill()
                worker.wait(10)


def _sign_in(page, base: str, path: str, username: str, password: str) -> None:
    page.goto(base + path)
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("button[type=submit], input[type=submit]")
    page.wait_for_load_state("networkidle")


def test_tenant_dashboard_and_admin_overview_update_live_during_a_flood(
    chromium, live_server, flood, artifacts
) -> None:
    base = live_server.url
    make_user("loud-owner", tenant=flood.loud)
    User.objects.create_superuser("ops", "ops@example.com", "pw-ops")

    # --- the loud tenant's own dashboard ------------------------------------------------
    context = chromium.new_context(viewport={"width": 1280, "height": 1000})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    _sign_in(page, base, f"/t/{flood.loud.key}/", "loud-owner", "pw-loud-owner")
    assert page.url == f"{base}/t/{flood.loud.key}/"
    assert page.inner_text("h1") == "Loud Shop"

    waiting = page.locator("[data-field='backlog.waiting_text']")
    first = _number(waiting.inner_text())
    assert first > 0
    # The page polls status.json: the number falls while the worker delivers, no reload.
    page.wait_for_function(
        f"() => Number(document.querySelector(\"[data-field='backlog.waiting_text']\")"
        f".textContent.replace(/[^0-9]/g, '')) < {first}",
        timeout=30_000,
    )
    assert "Live · updated" in page.inner_text("#updated")
    # Pacing in words, with the tenant's numbers, once a lap takes a while.
    page.wait_for_function(
        "() => document.querySelector('#status-banner').className.includes('status-paced')",
        timeout=40_000,
    )
    explanation = page.inner_text("[data-field='status.explanation']")
    assert "We deliver every tenant's events in turn" in explanation
    assert "Nothing is lost." in explanation
    assert "50%" in page.inner_text("[data-field='share_of_turns.text']")
    # The charts fill in as the worker's sweep samples history.
    page.wait_for_function(
        "() => document.querySelectorAll('#chart-backlog-age path.line').length > 0 && "
        "document.querySelectorAll('#chart-delivered path.line').length > 0",
        timeout=40_000,
    )
    page.wait_for_timeout(3_500)  # a few more samples, for a chart with some shape
    page.evaluate("() => window.scrollTo(0, 0)")
    page.screenshot(path=str(artifacts / "tenant-dashboard.png"), full_page=True)
    body = page.content()
    for stranger in (flood.other.key, flood.other.name, flood.quiet.key, flood.quiet.name):
        assert stranger not in body
    assert errors == []

    # --- a share link, no account -------------------------------------------------------
    token = share.make_token(flood.loud, days=1)
    anonymous = chromium.new_context(viewport={"width": 1280, "height": 1000})
    shared = anonymous.new_page()
    shared.goto(f"{base}/t/{flood.loud.key}/s/{token}/")
    assert "Shared read-only view" in shared.inner_text("header")
    before = shared.inner_text("[data-field='backlog.waiting_text']")
    shared.wait_for_function(
        "(before) => document.querySelector(\"[data-field='backlog.waiting_text']\")"
        ".textContent !== before",
        arg=before,
        timeout=30_000,
    )
    shared.screenshot(path=str(artifacts / "tenant-dashboard-shared.png"), full_page=True)
    anonymous.close()

    # --- the operators' overview ------------------------------------------------------------
    admin = chromium.new_context(viewport={"width": 1440, "height": 1100})
    ops = admin.new_page()
    _sign_in(ops, base, "/admin/login/?next=/admin/", "ops", "pw-ops")
    ops.click("text=Operations overview")
    ops.wait_for_url(f"{base}/admin/overview/")
    table = ops.inner_text("#ov-tenants")
    assert flood.loud.key in table and flood.other.key in table
    assert "paced (sharing turns with 1 other backlogged tenant)" in table
    depth = ops.inner_text("#ov-depth")
    ops.wait_for_function(
        "(before) => document.querySelector('#ov-depth').textContent !== before",
        arg=depth,
        timeout=30_000,
    )
    ops.screenshot(path=str(artifacts / "admin-overview.png"), full_page=True)

    # An operator's weight change reaches the scheduler and shows on the next refresh.
    row = ops.locator("#ov-tenants tr", has_text=flood.loud.key)
    row.locator("select[name=weight]").select_option("4")
    row.locator("button", has_text="Set").click()
    ops.wait_for_load_state("networkidle")
    assert "weight set to 4" in ops.inner_text("ul.messagelist")
    admin.close()
    context.close()

    # Everything still gets delivered: the dashboards only watched.
    total = FLOOD_A + FLOOD_B + QUIET
    assert wait_until(
        lambda: Delivery.objects.filter(status=Delivery.Status.DELIVERED).count() == total,
        timeout=120,
    )
    arrivals = flood.receiver.requests
    quiet = [r.arrived_at for r in arrivals if flood.quiet.key in r.path]
    assert len(quiet) == QUIET
    # Fair turns: the quiet tenant went out long before the floods were done.
    assert max(quiet) < max(r.arrived_at for r in arrivals) - 5

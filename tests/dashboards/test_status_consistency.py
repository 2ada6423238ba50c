"""One status everywhere: for scripted scheduler states, the tenant's own page, the
operators' overview, `manage.py lanes` and /metrics name the same status, and a status
judged over the window does not flip with one instantaneous count."""

import json
import re
import time
from io import StringIO

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.urls import reverse

from dashboards import status
from delivery.models import Delivery
from delivery.scheduler import Scheduler, install_scheduler, reset_scheduler
from ingest.publish import publish
from tests.factories import make_endpoint, make_tenant

pytestmark = pytest.mark.django_db(transaction=True)
AGE = 120.0  # seconds the scheduler's clock runs ahead: every queued head is this old


@pytest.fixture
def later(redis_conn):
    """A scheduler whose clock runs AGE seconds ahead, so queued work looks AGE s old."""
    scheduler = Scheduler(redis_conn, clock=lambda: time.time() + AGE)
    install_scheduler(scheduler)
    yield scheduler
    reset_scheduler()


@pytest.fixture
def operator(client):
    client.force_login(User.objects.create_superuser("ops", password="pw-ops"))
    return client


def every_surface(client, tenant) -> dict[str, str]:
    """The status code each surface names for `tenant` right now."""
    page = client.get(reverse("tenants:status", args=[tenant.key]))
    assert page.status_code == 200
    overview = client.get(reverse("admin-overview")).content.decode()
    row = re.search(
        rf'<tr class="ov-row-(\w+)">\s*<td class="ov-tenant"><a [^>]*><strong>{re.escape(tenant.key)}<',
        overview,
    )
    out = StringIO()
    call_command("lanes", "--json", stdout=out)
    lanes = {row["tenant_key"]: row["status"] for row in json.loads(out.getvalue())["tenants"]}
    metrics = client.get("/metrics").content.decode()
    series = re.search(
        rf'^webhook_tenant_status\{{status="(\w+)",tenant="{re.escape(tenant.key)}"\}} 1\.0$',
        metrics,
        re.MULTILINE,
    )
    return {
        "tenant page": page.json()["status"]["code"],
        "overview": row.group(1) if row else "(not listed)",
        "lanes": lanes.get(tenant.key, "(not listed)"),
        "metrics": series.group(1) if series else "(not exported)",
    }


def agreed(client, tenant, *, backlogged: bool = True) -> str:
    """The one status every surface names. `lanes` and /metrics list the schedule's
    backlogged tenants only: a tenant with nothing queued is on the page and the overview."""
    seen = every_surface(client, tenant)
    if not backlogged:
        assert seen.pop("lanes") == "(not listed)" and seen.pop("metrics") == "(not exported)"
    assert len(set(seen.values())) == 1, seen
    return next(iter(seen.values()))


def test_at_cap_paced_and_paused_are_named_alike_everywhere(operator, later) -> None:
    capped = make_tenant("capped.example")
    busy = make_tenant("busy.example")
    resting = make_tenant("resting.example", is_active=False)
    one_slot = make_endpoint(capped, "http://127.0.0.1:9/capped", max_in_flight=1)
    make_endpoint(busy, "http://127.0.0.1:9/busy", max_in_flight=50)
    make_endpoint(resting, "http://127.0.0.1:9/resting", max_in_flight=50)
    for i in range(4):
        publish(capped, "orders/create", {"i": i})
        publish(busy, "orders/create", {"i": i})
    publish(resting, "orders/create", {})
    # A worker takes what it may: one for the capped endpoint (its cap), all of busy's.
    leases = later.pick("w", 10).leases
    assert sum(lease.endpoint_id == one_slot.pk for lease in leases) == 1
    busy_leases = [lease for lease in leases if lease.endpoint_id != one_slot.pk]
    later.ack(busy_leases[:-1])  # busy keeps one in flight and has nothing queued
    publish(busy, "orders/create", {"late": True})  # queued again, 120 s old, sharing turns

    assert agreed(operator, capped) == "at_cap"
    assert agreed(operator, busy) == "paced"
    assert agreed(operator, resting) == "paused"


def test_a_steady_status_outlasts_a_free_slot_then_yields_to_the_window(operator, later) -> None:
    tenant = make_tenant("steady.example")
    endpoint = make_endpoint(tenant, "http://127.0.0.1:9/steady", max_in_flight=1)
    for i in range(5):
        publish(tenant, "orders/create", {"i": i})
    [lease] = later.pick("w", 10).leases
    for _ in range(3):
        assert agreed(operator, tenant) == "at_cap"
    # The slot frees for an instant, as it does between two requests: work is still queued
    # and the endpoint was full for most of the window, so every surface still says so.
    later.ack([lease])
    assert agreed(operator, tenant) == "at_cap"
    explanation = operator.get(reverse("tenants:status", args=[tenant.key])).json()["status"]
    assert endpoint.url in explanation["explanation"]
    # Readings that find it free outnumber the full ones: the window lets go.
    for _ in range(12):
        status.read([tenant], status.take_snapshot())
    assert agreed(operator, tenant) == "on_pace"


def test_dead_letters_and_waiting_retries_are_counted_not_called_lost(operator, later) -> None:
    tenant = make_tenant("unlucky.example")
    make_endpoint(tenant, "http://127.0.0.1:9/unlucky", max_in_flight=5, consecutive_failures=2)
    for i in range(4):
        publish(tenant, "orders/create", {"i": i})
    ids = list(Delivery.objects.order_by("id").values_list("id", flat=True))
    Delivery.objects.filter(id__in=ids[:3]).update(status=Delivery.Status.DEAD)
    Delivery.objects.filter(id__in=ids[3:]).update(status=Delivery.Status.RETRY_SCHEDULED)
    later.clear()  # nothing queued now: three dead, one retry due later

    data = operator.get(reverse("tenants:status", args=[tenant.key])).json()
    assert data["backlog"]["dead"] == 3
    assert data["backlog"]["delayed"] == 1
    assert data["backlog"]["age_text"] == "none queued; 1 retry due later"
    assert "Nothing is lost" not in data["status"]["explanation"]
    assert "3 events ran out of retries" in data["status"]["explanation"]
    assert agreed(operator, tenant, backlogged=False) == "failing"

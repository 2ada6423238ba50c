"""Every figure a surface shows agrees with the database and the schedule.

For each state the dashboards explain, a test builds it with the real scheduler and
database, then reads the tenant's status JSON, its dashboard page, the operators'
overview, `manage.py lanes --json` and /metrics, and checks each count against the rows
(by status) and the scheduler's snapshot: every open delivery is counted exactly once,
and no two surfaces disagree. Runs on SQLite and PostgreSQL alike."""

import json
import re
import time
from datetime import timedelta
from io import StringIO

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.urls import reverse
from django.utils import timezone

from dashboards.messages import STATUS_WORDS
from delivery.models import Attempt, Delivery
from delivery.replays import window as replay_window
from delivery.replays.window import Window
from delivery.scheduler import Scheduler, install_scheduler, reset_scheduler
from delivery.upkeep.maintenance import rebuild_schedule
from ingest.publish import publish
from tenants.models import Endpoint
from tests.api.helpers import Api
from tests.factories import make_endpoint, make_tenant
from webhooks.models import ApiToken, Event

pytestmark = pytest.mark.django_db(transaction=True)
OVERVIEW_COLUMNS = ["fresh", "retry", "delayed", "held", "in_flight"]


@pytest.fixture
def later(redis_conn):
    """The scheduler, its clock two minutes ahead: queued work looks two minutes old."""
    scheduler = Scheduler(redis_conn, clock=lambda: time.time() + 120)
    install_scheduler(scheduler)
    yield scheduler
    reset_scheduler()


@pytest.fixture
def operator(client):
    client.force_login(User.objects.create_superuser("ops", password="pw-ops"))
    return client


def _number(text: str) -> int:
    digits = re.sub(r"[^\d]", "", text)
    return int(digits) if digits else 0


def _rows(tenant) -> dict[str, int]:
    counts = {status: 0 for status in Delivery.Status.values}
    for status in Delivery.objects.filter(tenant=tenant).values_list("status", flat=True):
        counts[status] += 1
    return counts


def _overview_cells(page: str, key: str) -> dict[str, int] | None:
    rows = re.findall(r'<tr class="ov-row-\w+">.*?</tr>', page, re.S)
    found = next((row for row in rows if f"<strong>{key}</strong>" in row), None)
    if found is None:
        return None
    cells = [
        re.sub(r"<[^>]+>", "", cell).strip()
        for cell in re.findall(r"<td[^>]*>(.*?)</td>", found, re.S)
    ]
    # tenant, status, oldest, clears, then the counts in OVERVIEW_COLUMNS' order
    return {name: _number(cells[4 + i]) for i, name in enumerate(OVERVIEW_COLUMNS)}


def _dashboard_detail(page: str) -> dict[str, int]:
    text = re.sub(r"<[^>]+>", "", re.search(r'id="waiting-detail">(.*?)</p>', page, re.S).group(1))
    figures = {"new": 0, "retrying": 0, "due later": 0, "in flight": 0, "held": 0, "dead letter": 0}
    for number, label in re.findall(
        r"([\d,]+) (new|retrying|due later|in flight|held|dead letter)", text
    ):
        figures[label] = _number(number)
    return figures


def _endpoint_rows(page: str) -> dict[int, dict]:
    """Per endpoint on the endpoints page: the last hour's and day's "delivered of
    attempts", and failures in a row."""
    found = {}
    for pk, row in re.findall(r'<tr data-endpoint="(\d+)">(.*?)</tr>', page, re.S):
        cells = [re.sub(r"<[^>]+>", " ", c) for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
        windows = [
            re.search(r"([\d,]+) of (?:the latest )?([\d,]+)|no attempts", cells[i]) for i in (2, 4)
        ]
        found[int(pk)] = {
            "hour": (_number(windows[0].group(1)), _number(windows[0].group(2)))
            if windows[0].group(1)
            else (0, 0),
            "day": (_number(windows[1].group(1)), _number(windows[1].group(2)))
            if windows[1].group(1)
            else (0, 0),
            "failures_in_a_row": _number(cells[-1]),
        }
    return found


def figures(client, scheduler, tenant) -> dict:
    """What each surface says of `tenant`, beside the rows and the snapshot."""
    snapshot = scheduler.snapshot(top_n=100)
    row = next((r for r in snapshot.tenants if r.tenant_id == tenant.pk), None)
    status = client.get(reverse("tenants:status", args=[tenant.key])).json()
    dashboard = client.get(reverse("tenants:dashboard", args=[tenant.key])).content.decode()
    overview = client.get(reverse("admin-overview")).content.decode()
    out = StringIO()
    call_command("lanes", "--json", stdout=out)
    lanes = next(
        (r for r in json.loads(out.getvalue())["tenants"] if r["tenant_key"] == tenant.key), None
    )
    metrics = client.get("/metrics").content.decode()
    endpoints = client.get(reverse("tenants:endpoints", args=[tenant.key])).content.decode()
    event = Event.objects.filter(tenant=tenant).order_by("id").first()
    message = (
        client.get(reverse("tenants:message", args=[tenant.key, event.pk])).content.decode()
        if event
        else ""
    )
    api = Api(ApiToken.issue("facts", access=ApiToken.Access.READ)[1])
    api_tenant = api.get(f"/api/v1/tenants/{tenant.key}").json()
    api_stats = {
        endpoint.pk: api.get(f"/api/v1/tenants/{tenant.key}/endpoints/{endpoint.pk}/stats").json()
        for endpoint in Endpoint.objects.filter(tenant=tenant)
    }
    api_message = (
        api.get(f"/api/v1/tenants/{tenant.key}/messages/{event.pk}").json() if event else None
    )
    return {
        "api": api_tenant,
        "api_message": api_message,
        "api_stats": api_stats,
        "endpoints": _endpoint_rows(endpoints),
        "event": event,
        "message": message,
        "rows": _rows(tenant),
        "snapshot": snapshot,
        "row": row,
        "status": status,
        "dashboard": _dashboard_detail(dashboard),
        "overview": _overview_cells(overview, tenant.key),
        "lanes": lanes,
        "metrics": metrics,
    }


def assert_agree(seen: dict) -> None:
    rows, row, backlog = seen["rows"], seen["row"], seen["status"]["backlog"]
    queued = {
        "fresh": row.fresh if row else 0,
        "retry": row.retry if row else 0,
        "delayed": row.delayed if row else None,
        "in_flight": row.in_flight if row else 0,
    }
    # The tenant's page: the schedule's counts, and the rows' for what is not queued.
    for name in ("fresh", "retry", "in_flight") if row is not None else ("fresh", "retry"):
        assert backlog[name] == queued[name], (name, backlog, queued)
    if row is not None:
        assert backlog["delayed"] == row.delayed
    assert backlog["held"] == rows[Delivery.Status.HELD]
    assert backlog["dead"] == rows[Delivery.Status.DEAD]
    # Every open row is in the schedule exactly once (held rows wait outside it).
    if row is not None:
        open_rows = rows[Delivery.Status.PENDING] + rows[Delivery.Status.RETRY_SCHEDULED]
        assert row.fresh + row.retry + row.delayed + row.in_flight == open_rows, (row, rows)
    else:  # nothing queued: what is open is in flight, or a retry due later
        assert rows[Delivery.Status.PENDING] == backlog["in_flight"]
        assert backlog["delayed"] == rows[Delivery.Status.RETRY_SCHEDULED]
    # The page's words say the JSON's numbers.
    shown = seen["dashboard"]
    assert (shown["new"], shown["retrying"], shown["due later"], shown["in flight"]) == (
        backlog["fresh"],
        backlog["retry"],
        backlog["delayed"],
        backlog["in_flight"],
    )
    assert (shown["held"], shown["dead letter"]) == (backlog["held"], backlog["dead"])
    # The management API says what the tenant's page says.
    told = seen["api"]["status"]
    assert told["code"] == seen["status"]["status"]["code"]
    assert told["queued"] == backlog["fresh"] + backlog["retry"]
    assert (told["in_flight"], told["retries_due_later"]) == (
        backlog["in_flight"],
        backlog["delayed"],
    )
    assert (told["held"], told["dead"]) == (backlog["held"], backlog["dead"])
    # The overview lists the tenant with the same counts.
    if seen["overview"] is not None:
        assert seen["overview"] == {name: backlog[name] for name in OVERVIEW_COLUMNS}
    # `lanes` and /metrics read the same snapshot.
    if row is not None:
        lanes = seen["lanes"]
        assert (lanes["fresh"], lanes["retry"], lanes["delayed"], lanes["in_flight"]) == (
            row.fresh,
            row.retry,
            row.delayed,
            row.in_flight,
        )
        assert lanes["status"] == seen["status"]["status"]["code"]
    snapshot, metrics = seen["snapshot"], seen["metrics"]
    for lane, depth in (
        ("fresh", snapshot.fresh_depth),
        ("retry", snapshot.retry_depth),
        ("delayed", snapshot.delayed_depth),
    ):
        assert f'webhook_lane_depth{{lane="{lane}"}} {float(depth)}' in metrics, lane
    assert f"webhook_in_flight {float(snapshot.in_flight)}" in metrics
    # The endpoints page: each endpoint's attempts of the last hour and day, as stored.
    since = timezone.now() - timedelta(hours=1)
    for endpoint in Endpoint.objects.filter(tenant=seen["event"].tenant if seen["event"] else None):
        attempts = Attempt.objects.filter(endpoint=endpoint, started_at__gte=since)
        delivered = attempts.filter(outcome=Attempt.Outcome.DELIVERED).count()
        shown = seen["endpoints"][endpoint.pk]
        assert shown["hour"] == shown["day"] == (delivered, attempts.count()), shown
        assert shown["failures_in_a_row"] == endpoint.consecutive_failures
        hour = seen["api_stats"][endpoint.pk]["hour"]
        assert (hour["delivered"], hour["attempts"]) == (delivered, attempts.count())
    # The event's page: each delivery's status and every attempt made.
    if seen["event"] is not None:
        facts = re.sub(r"\s+", " ", seen["message"])
        for delivery in Delivery.objects.filter(event=seen["event"]):
            made = Attempt.objects.filter(delivery=delivery).count()
            assert f'<dd class="mono">{delivery.pk}</dd> <dt>Attempts</dt><dd>{made}' in facts
            assert delivery.get_status_display() in facts
            told = next(d for d in seen["api_message"]["deliveries"] if d["id"] == delivery.pk)
            assert told["status"] == STATUS_WORDS[delivery.status]
            assert len(told["attempt_log"]) == made


def test_a_paced_flood(operator, later) -> None:
    loud, quiet = make_tenant("loud.example"), make_tenant("quiet.example")
    make_endpoint(loud, "http://127.0.0.1:9/loud", max_in_flight=50)
    make_endpoint(quiet, "http://127.0.0.1:9/quiet", max_in_flight=50)
    for i in range(40):
        publish(loud, "orders/create", {"i": i})
    for i in range(3):
        publish(quiet, "orders/create", {"i": i})
    # In flight: the turns give both tenants their share, and both still have work queued
    # (a tenant with only work in flight has no row in the snapshot).
    assert len(later.pick("w", 4).leases) == 4

    for tenant in (loud, quiet):
        assert_agree(figures(operator, later, tenant))


def test_a_hung_endpoint_at_its_cap(operator, later) -> None:
    tenant = make_tenant("hung.example")
    make_endpoint(tenant, "http://127.0.0.1:9/hung", max_in_flight=2)
    for i in range(7):
        publish(tenant, "orders/create", {"i": i})
    assert len(later.pick("w", 10).leases) == 2

    seen = figures(operator, later, tenant)

    assert_agree(seen)
    assert seen["status"]["backlog"]["in_flight"] == 2


def test_a_failing_endpoint_with_retries_due_later(operator, later) -> None:
    tenant = make_tenant("failing.example")
    make_endpoint(tenant, "http://127.0.0.1:9/failing", max_in_flight=5, consecutive_failures=3)
    for i in range(6):
        publish(tenant, "orders/create", {"i": i})
    leases = later.pick("w", 3).leases
    for lease in leases:
        later.retry_later(lease, due_at=time.time() + 600)
    Delivery.objects.filter(pk__in=[lease.delivery_id for lease in leases]).update(
        status=Delivery.Status.RETRY_SCHEDULED, lane=Delivery.Lane.RETRY, attempts=1
    )
    for lease in leases:
        Attempt.objects.create(
            delivery_id=lease.delivery_id,
            endpoint_id=lease.endpoint_id,
            number=1,
            status_code=503,
            outcome=Attempt.Outcome.RETRY,
        )

    seen = figures(operator, later, tenant)

    assert_agree(seen)
    assert seen["status"]["backlog"]["delayed"] == 3
    [shown] = seen["endpoints"].values()
    assert shown == {"hour": (0, 3), "day": (0, 3), "failures_in_a_row": 3}
    assert "<dt>Attempts</dt><dd>1" in seen["message"]  # the first event was tried once


def test_a_disabled_endpoint_holding_work_and_dead_letters(operator, later) -> None:
    tenant = make_tenant("held.example")
    endpoint = make_endpoint(tenant, "http://127.0.0.1:9/held")
    for i in range(9):
        publish(tenant, "orders/create", {"i": i})
    ids = list(Delivery.objects.filter(tenant=tenant).order_by("id").values_list("id", flat=True))
    Delivery.objects.filter(id__in=ids[:4]).update(status=Delivery.Status.DEAD)
    Delivery.objects.filter(id__in=ids[4:]).update(status=Delivery.Status.HELD)
    endpoint.enabled = False
    endpoint.save()
    rebuild_schedule()  # as the sweeper leaves it: nothing of theirs queued

    seen = figures(operator, later, tenant)

    assert_agree(seen)
    assert (seen["status"]["backlog"]["held"], seen["status"]["backlog"]["dead"]) == (5, 4)


def test_a_replay_in_progress(operator, later) -> None:
    tenant = make_tenant("replaying.example")
    make_endpoint(tenant, "http://127.0.0.1:9/replaying", max_in_flight=50)
    for i in range(8):
        publish(tenant, "orders/create", {"i": i})
    Delivery.objects.filter(tenant=tenant).update(status=Delivery.Status.DEAD)
    later.clear()
    now = timezone.now()
    job = replay_window.start(
        tenant,
        Window(start=now - timedelta(hours=1), end=now, statuses=("dead",)),
        user=None,
        via="admin",
    )
    replay_window.feed_replays()  # the sweep's step: the first chunk into the lane

    seen = figures(operator, later, tenant)

    assert_agree(seen)
    job.refresh_from_db()
    assert job.fed == seen["status"]["backlog"]["fresh"] + seen["status"]["backlog"]["in_flight"]
    assert seen["status"]["backlog"]["dead"] == 8 - job.fed


def test_a_tenant_whose_only_work_is_in_flight(operator, later) -> None:
    tenant = make_tenant("busy.example")
    make_endpoint(tenant, "http://127.0.0.1:9/busy", max_in_flight=5)
    for i in range(3):
        publish(tenant, "orders/create", {"i": i})
    assert len(later.pick("w", 10).leases) == 3

    seen = figures(operator, later, tenant)

    assert_agree(seen)
    assert seen["row"] is None  # nothing queued: the snapshot has no row for it
    assert seen["status"]["backlog"]["in_flight"] == 3 == seen["rows"][Delivery.Status.PENDING]
    assert seen["dashboard"]["in flight"] == 3


def test_an_idle_tenant(operator, later) -> None:
    tenant = make_tenant("idle.example")
    make_endpoint(tenant, "http://127.0.0.1:9/idle")

    seen = figures(operator, later, tenant)

    assert_agree(seen)
    assert seen["overview"] is None  # nothing waiting: not a line of the overview
    assert seen["status"]["status"]["code"] == "on_pace"

"""A tenant's status.json after a known scenario, its charts, and the history sampler."""

import time
from datetime import timedelta

import pytest
import redis
from django.urls import reverse
from django.utils import timezone

from dashboards import charts, history
from delivery.models import Attempt, Delivery, TenantSample
from delivery.scheduler import Scheduler, get_scheduler, install_scheduler, reset_scheduler
from delivery.upkeep import maintenance, sampling
from ingest.publish import publish
from tests.factories import make_endpoint, make_tenant, make_user
from webhooks.models import Event

pytestmark = pytest.mark.django_db(transaction=True)
AGE = 120.0  # seconds the scheduler's clock is moved ahead: every head is this old


@pytest.fixture
def later(redis_conn):
    """A scheduler whose clock runs AGE seconds ahead, so queued work looks AGE s old."""
    install_scheduler(Scheduler(redis_conn, clock=lambda: time.time() + AGE))
    yield
    reset_scheduler()


def status_of(client, tenant) -> dict:
    client.force_login(make_user(f"member-{tenant.pk}", tenant=tenant))
    response = client.get(reverse("tenants:status", args=[tenant.key]))
    assert response.status_code == 200
    return response.json()


def deliver(tenant, count: int, seconds_ago: float = 10) -> None:
    """Mark `count` of the tenant's pending deliveries delivered a moment ago, as a worker
    would have, then rebuild the schedule from the rows that are still open."""
    ids = list(
        Delivery.objects.filter(tenant=tenant, status=Delivery.Status.PENDING)
        .order_by("id")
        .values_list("id", flat=True)[:count]
    )
    Delivery.objects.filter(id__in=ids).update(
        status=Delivery.Status.DELIVERED,
        delivered_at=timezone.now() - timedelta(seconds=seconds_ago),
    )
    maintenance.rebuild_schedule()


def test_paced_tenant_status_after_a_known_scenario(client, later) -> None:
    loud = make_tenant("loud.example", name="Loud")
    quiet = make_tenant("quiet.example", name="Quiet")
    resting = make_tenant("resting.example", name="Resting", is_active=False)
    for tenant in (loud, quiet, resting):
        make_endpoint(tenant, f"http://127.0.0.1:9/{tenant.key}", max_in_flight=100)
    for i in range(70):
        publish(loud, "orders/create", {"i": i})
    for i in range(5):
        publish(quiet, "orders/create", {"i": i})
    publish(resting, "orders/create", {})
    # 30 went out 20 seconds ago: 30 per minute, so 40 left take 80 seconds.
    deliver(loud, 30, seconds_ago=20)
    Event.objects.update(received_at=timezone.now() - timedelta(seconds=10))
    assert sampling.sample(force=True) >= 2

    data = status_of(client, loud)
    assert data["tenant"] == {"key": "loud.example", "name": "Loud", "weight": 1}
    assert data["live"] is True
    assert data["status"]["code"] == "paced"
    assert data["status"]["label"] == "paced (sharing turns with 1 other backlogged tenant)"
    backlog = data["backlog"]
    assert (backlog["fresh"], backlog["retry"], backlog["delayed"], backlog["held"]) == (
        40,
        0,
        0,
        0,
    )
    assert backlog["waiting"] == 40
    assert backlog["age_seconds"] == pytest.approx(AGE, abs=5)
    assert data["delivered_per_minute"] == 30
    assert data["rate_text"] == "30 per minute"
    # loud and quiet share turns at weight 1; the paused tenant takes none.
    assert data["share_of_turns"]["fraction"] == 0.5
    assert data["share_of_turns"]["text"] == "50%"
    assert data["share_of_turns"]["other_backlogged_tenants"] == 1
    assert data["drain"]["seconds"] == 80
    assert data["received_last_10_minutes"] == 70
    explanation = data["status"]["explanation"]
    assert explanation.startswith("You sent 70 events in the last 10 minutes.")
    assert "about 30 per minute" in explanation and "Nothing is lost." in explanation
    assert [e["state"] for e in data["endpoints"]] == ["healthy"]
    assert data["failures"] == []

    assert status_of(client, resting)["status"]["code"] == "paused"
    quiet_status = status_of(client, quiet)
    assert quiet_status["backlog"]["fresh"] == 5
    assert quiet_status["share_of_turns"]["fraction"] == 0.5


def test_failing_endpoint_shows_the_failure_and_the_next_retry(client) -> None:
    tenant = make_tenant("flaky.example")
    endpoint = make_endpoint(tenant, "http://127.0.0.1:9/flaky")
    accepted = publish(tenant, "orders/paid", {"n": 1})
    delivery = Delivery.objects.get(event=accepted.event)
    scheduler = get_scheduler()
    [lease] = scheduler.pick("test", 1).leases
    due = timezone.now() + timedelta(minutes=5)
    scheduler.retry_later(lease, due_at=due.timestamp())
    Attempt.objects.create(
        delivery=delivery,
        number=1,
        status_code=503,
        outcome=Attempt.Outcome.RETRY,
        response_excerpt="upstream is down for maintenance",
    )
    Delivery.objects.filter(pk=delivery.pk).update(
        status=Delivery.Status.RETRY_SCHEDULED,
        lane=Delivery.Lane.RETRY,
        attempts=1,
        next_attempt_at=due,
    )
    endpoint.consecutive_failures = 1
    endpoint.failing_since = timezone.now()
    endpoint.save()

    data = status_of(client, tenant)
    assert data["status"]["code"] == "failing"
    assert "(last: HTTP 503)" in data["status"]["explanation"]
    assert data["backlog"]["delayed"] == 1
    [failure] = data["failures"]
    assert failure["status_code"] == 503
    assert failure["response_excerpt"] == "upstream is down for maintenance"
    assert failure["next_retry_at"] == due.isoformat()
    assert failure["event_type"] == "orders/paid"
    [shown] = data["endpoints"]
    assert (shown["state"], shown["consecutive_failures"]) == ("failing", 1)
    assert shown["next_retry_at"] == due.isoformat()


def test_disabled_endpoint_holds_work_and_says_so(client) -> None:
    tenant = make_tenant("gone.example")
    endpoint = make_endpoint(tenant, "http://127.0.0.1:9/gone")
    for i in range(3):
        publish(tenant, "x", {"i": i})
    Delivery.objects.update(status=Delivery.Status.HELD)
    get_scheduler().clear()
    endpoint.enabled = False
    endpoint.disabled_reason = "Disabled: HTTP 410 Gone"
    endpoint.save()

    data = status_of(client, tenant)
    assert data["status"]["code"] == "disabled"
    assert data["backlog"]["held"] == 3
    assert "3 events for it are held" in data["status"]["explanation"]
    assert data["endpoints"][0]["state"] == "disabled"


def test_a_tenant_held_back_by_its_own_rate_is_told_so(client) -> None:
    tenant = make_tenant("metered.example", rate_limit_per_second=1)
    make_endpoint(tenant, "http://127.0.0.1:9/metered", max_in_flight=50)
    for i in range(20):
        publish(tenant, "orders/create", {"i": i})
    scheduler = get_scheduler()
    assert len(scheduler.pick("w", 5).leases) == 1  # a token a second: the rest wait for it

    data = status_of(client, tenant)

    assert data["status"]["code"] == "rate_limited"
    assert data["status"]["headline"] == "Your delivery rate limit paces your events"
    assert "at most 1 per second for you" in data["status"]["explanation"]
    assert data["endpoints"][0]["rate_limit_per_second"] is None  # the tenant's rate, not its


def test_an_endpoint_waiting_out_a_retry_after_is_explained(client) -> None:
    tenant = make_tenant("busy.example")
    endpoint = make_endpoint(tenant, "http://127.0.0.1:9/busy")
    for i in range(4):
        publish(tenant, "orders/create", {"i": i})
    scheduler = get_scheduler()
    scheduler.pause_endpoint(endpoint.pk, time.time() + 120)
    assert scheduler.pick("w", 5).leases == []  # its lane parks behind the pause

    data = status_of(client, tenant)

    assert data["status"]["code"] == "endpoint_wait"
    assert "answered with Retry-After" in data["status"]["explanation"]
    assert "4 events wait" in data["status"]["explanation"]
    [shown] = data["endpoints"]
    assert shown["state"] == "endpoint_wait"
    assert shown["state_text"].startswith("asked us to wait (Retry-After) until ")


def test_shared_destinations_show_without_their_url(client) -> None:
    tenant = make_tenant("gateway-shop.example")
    shared = make_endpoint(None, "http://127.0.0.1:9/platform-secret-path", description="Our app")
    event = Event.objects.create(tenant=tenant, event_type="x", payload=b"{}")
    Delivery.objects.create(event=event, endpoint=shared, tenant=tenant)
    data = status_of(client, tenant)
    [shown] = data["endpoints"]
    assert (shown["label"], shown["shared"]) == ("Our app", True)
    assert "platform-secret-path" not in str(data)


def test_a_live_dashboard_survives_a_redis_outage(client, settings) -> None:
    tenant = make_tenant("calm.example")
    install_scheduler(Scheduler(redis.Redis.from_url("redis://127.0.0.1:1/0")))
    try:
        data = status_of(client, tenant)
        page = client.get(reverse("tenants:dashboard", args=[tenant.key]))
    finally:
        reset_scheduler()
    assert data["live"] is False
    assert "unavailable" in data["status"]["explanation"]
    assert page.status_code == 200


def test_dashboard_page_renders_the_numbers_and_two_svg_charts(client, later) -> None:
    tenant = make_tenant("charted.example", name="Charted")
    make_endpoint(tenant)
    for i in range(4):
        publish(tenant, "x", {"i": i})
    sampling.sample(force=True)
    client.force_login(make_user("alice", tenant=tenant))
    page = client.get(reverse("tenants:dashboard", args=[tenant.key])).content.decode()
    assert page.count("<svg") == 2 and 'class="line"' in page
    assert 'data-status-url="/t/charted.example/status.json"' in page
    assert "tenants/dashboard.js" in page and "http://" not in page.split("<body>")[0]
    chart = client.get(reverse("tenants:chart", args=[tenant.key, "backlog-age"]))
    assert chart["Content-Type"] == "image/svg+xml"
    assert chart.content.startswith(b"<svg") and b'class="line"' in chart.content
    assert client.get(reverse("tenants:chart", args=[tenant.key, "nope"])).status_code == 404


# --- the history sampler ----------------------------------------------------------------


def test_sample_records_backlogged_and_delivering_tenants_only(later) -> None:
    busy, idle, done = (make_tenant(k) for k in ("busy.example", "idle.example", "done.example"))
    for tenant in (busy, idle, done):
        make_endpoint(tenant)
    for i in range(6):
        publish(busy, "x", {"i": i})
    publish(done, "x", {})
    Event.objects.update(received_at=timezone.now() - timedelta(seconds=5))
    deliver(done, 1, seconds_ago=5)

    assert sampling.sample(force=True) == 3
    rows = {row.tenant_id: row for row in TenantSample.objects.all()}
    assert set(rows) == {busy.pk, done.pk, None}  # None: the fallback lane, always sampled
    assert rows[busy.pk].queued == 6
    assert rows[busy.pk].backlog_age_seconds == pytest.approx(AGE, abs=5)
    assert rows[busy.pk].received == 6
    assert (rows[done.pk].delivered, rows[done.pk].received, rows[done.pk].queued) == (1, 1, 0)


def test_sampling_is_gated_to_one_per_interval(later) -> None:
    tenant = make_tenant()
    make_endpoint(tenant)
    publish(tenant, "x", {})
    assert sampling.sample() == 2  # the tenant and the fallback lane
    assert sampling.sample() == 0  # too soon: another worker's sweep, say
    assert TenantSample.objects.count() == 2


def test_old_samples_are_pruned(later, settings) -> None:
    settings.HISTORY_RETENTION_HOURS = 1
    tenant = make_tenant()
    make_endpoint(tenant)
    TenantSample.objects.create(
        tenant=tenant, at=timezone.now() - timedelta(hours=2), interval_seconds=30
    )
    publish(tenant, "x", {})
    sampling.sample(force=True)
    assert TenantSample.objects.count() == 2
    assert not TenantSample.objects.filter(at__lt=timezone.now() - timedelta(minutes=1)).exists()


def test_the_maintenance_sweep_takes_the_samples(later) -> None:
    tenant = make_tenant()
    make_endpoint(tenant)
    publish(tenant, "x", {})
    get_scheduler().start_epoch()
    maintenance.sweep()
    assert TenantSample.objects.filter(tenant=tenant).count() == 1


def test_series_draw_idle_as_zero_and_break_where_nothing_was_sampled(settings) -> None:
    settings.HISTORY_SAMPLE_SECONDS = 30
    tenant = make_tenant()
    now = timezone.now().replace(microsecond=0)
    # The sampler ran every 30 s from 10 min ago to 6 min ago, stopped, and ran again
    # for the last minute; the tenant was busy at the first two samples and the last.
    instants = [now - timedelta(seconds=s) for s in (600, 570, 540, 510, 480, 450, 420, 390, 360)]
    instants += [now - timedelta(seconds=s) for s in (60, 30, 0)]
    for at in instants:
        TenantSample.objects.create(tenant=None, at=at, interval_seconds=30)
    for at, age in ((instants[0], 40.0), (instants[1], 70.0), (instants[-1], 20.0)):
        TenantSample.objects.create(
            tenant=tenant, at=at, interval_seconds=30, backlog_age_seconds=age, delivered=15
        )
    series = history.tenant_series(tenant.pk, now - timedelta(hours=1))
    values = [p.value for p in series.age]
    assert values == [40.0, 70.0, *[0.0] * 7, None, 0.0, 0.0, 20.0]
    assert series.rate[0].value == 30.0  # 15 in 30 s
    chart = charts.build_chart("t", series.age, since=now - timedelta(hours=1), until=now, fmt=str)
    assert chart.line.count("M") == 2  # two runs of samples, no line across the gap


def test_chart_spans_at_least_ten_minutes_and_at_most_the_hour() -> None:
    now = timezone.now()
    recent = [history.Point(now - timedelta(seconds=s), 5.0) for s in (60, 30, 0)]
    chart = charts.build_chart(
        "t", recent, since=now - timedelta(hours=1), until=now, fmt=str, duration_axis=True
    )
    assert not chart.empty
    assert len(chart.x_ticks) in (5, 6)  # every 2 minutes over 10 minutes
    assert all(chart.left <= tick.pos <= chart.right for tick in chart.x_ticks)
    xs = [float(pair.lstrip("ML").split(",")[0]) for pair in chart.line.split()]
    assert xs[-1] == pytest.approx(chart.right, abs=1)
    assert xs[0] > chart.left + chart.plot_width * 0.8  # the last minute of ten
    empty = charts.build_chart("t", [], since=now - timedelta(hours=1), until=now, fmt=str)
    assert empty.empty and empty.line == "" and len(empty.x_ticks) == 6

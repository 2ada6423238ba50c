"""What a tenant's dashboard says agrees with the rows: a time that has passed is never
shown as due, failures listed are failures, and "going out" is said only while
deliveries go out."""

from datetime import timedelta

import pytest
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone

from dashboards.endpoint_health import WindowHealth
from delivery.models import Attempt, Delivery
from delivery.scheduler import get_scheduler
from delivery.upkeep import maintenance
from ingest.publish import publish, publish_to_endpoint
from tests.factories import make_endpoint, make_tenant, make_user

pytestmark = pytest.mark.django_db(transaction=True)


def status_of(client, tenant) -> dict:
    if "_auth_user_id" not in client.session:
        client.force_login(make_user(f"member-{tenant.pk}", tenant=tenant))
    response = client.get(reverse("tenants:status", args=[tenant.key]))
    assert response.status_code == 200
    return response.json()


def failed_once(tenant, endpoint, due_at, status_code: int = 500) -> Delivery:
    """One of the tenant's deliveries, tried once and failed, its retry due at `due_at`."""
    accepted = publish(tenant, "orders/paid", {"due": due_at.isoformat()})
    delivery = Delivery.objects.get(event=accepted.event, endpoint=endpoint)
    Attempt.objects.create(
        delivery=delivery, number=1, status_code=status_code, outcome=Attempt.Outcome.RETRY
    )
    Delivery.objects.filter(pk=delivery.pk).update(
        status=Delivery.Status.RETRY_SCHEDULED,
        lane=Delivery.Lane.RETRY,
        attempts=1,
        next_attempt_at=due_at,
    )
    return delivery


def failing(endpoint) -> None:
    """The endpoint failing, and the schedule as the sweeper rebuilds it from the rows."""
    endpoint.consecutive_failures = 2
    endpoint.failing_since = timezone.now() - timedelta(minutes=10)
    endpoint.save()
    maintenance.rebuild_schedule()


def test_a_retry_whose_time_has_passed_is_due_now_never_due_at_a_past_time(client) -> None:
    tenant = make_tenant("delta.example")
    endpoint = make_endpoint(tenant, "http://127.0.0.1:9/delta")
    now = timezone.now()
    overdue = failed_once(tenant, endpoint, now - timedelta(minutes=9))
    upcoming = now + timedelta(minutes=2)
    failed_once(tenant, endpoint, upcoming)
    failing(endpoint)

    data = status_of(client, tenant)

    explanation = data["status"]["explanation"]
    assert "1 retry is due now" in explanation
    assert "is due at" not in explanation
    [shown] = data["endpoints"]
    assert shown["retries_due"] == 1
    assert shown["next_retry_at"] == upcoming.isoformat()
    by_id = {f["delivery_id"]: f for f in data["failures"]}
    assert by_id[overdue.pk]["retry_due_now"] is True
    assert not any(f["retry_due_now"] for f in data["failures"] if f["delivery_id"] != overdue.pk)
    page = client.get(reverse("tenants:dashboard", args=[tenant.key])).content.decode()
    assert "due now" in page


def test_only_a_future_retry_is_named_as_the_next(client) -> None:
    tenant = make_tenant("later.example")
    endpoint = make_endpoint(tenant, "http://127.0.0.1:9/later")
    due = timezone.now() + timedelta(minutes=5)
    failed_once(tenant, endpoint, due)
    failing(endpoint)

    data = status_of(client, tenant)

    assert "The next retry is due at" in data["status"]["explanation"]
    assert "due now" not in data["status"]["explanation"]
    assert data["endpoints"][0]["retries_due"] == 0


def test_recent_failures_list_failed_attempts_not_held_deliveries(client) -> None:
    tenant = make_tenant("charlie.example")
    endpoint = make_endpoint(tenant, "http://127.0.0.1:9/charlie")
    failed = failed_once(tenant, endpoint, timezone.now() + timedelta(minutes=5), 500)
    Delivery.objects.filter(pk=failed.pk).update(status=Delivery.Status.DEAD, next_attempt_at=None)
    for i in range(12):  # newer than the dead letter, never attempted
        publish(tenant, "orders/paid", {"held": i})
    Delivery.objects.exclude(pk=failed.pk).update(status=Delivery.Status.HELD)
    endpoint.enabled = False
    endpoint.save()
    get_scheduler().clear()

    data = status_of(client, tenant)

    assert [f["delivery_id"] for f in data["failures"]] == [failed.pk]
    assert data["failures"][0]["status_code"] == 500
    assert data["endpoints"][0]["held"] == 12


def test_going_out_is_said_only_while_deliveries_go_out(client) -> None:
    tenant = make_tenant("stuck.example")
    endpoint = make_endpoint(tenant, "http://127.0.0.1:9/stuck")
    failed_once(tenant, endpoint, timezone.now() + timedelta(minutes=5))
    failing(endpoint)

    quiet = status_of(client, tenant)["status"]["explanation"]

    assert "keep going out" not in quiet
    assert "Nothing was delivered in the last minute." in quiet

    accepted = publish(tenant, "orders/paid", {"ok": True})
    Delivery.objects.filter(event=accepted.event).update(
        status=Delivery.Status.DELIVERED, delivered_at=timezone.now() - timedelta(seconds=5)
    )

    assert "keep going out" in status_of(client, tenant)["status"]["explanation"]


def test_a_pace_is_never_at_about_no_deliveries(client) -> None:
    tenant = make_tenant("fresh.example")
    make_endpoint(tenant, "http://127.0.0.1:9/fresh")
    publish(tenant, "orders/paid", {"n": 1})

    explanation = status_of(client, tenant)["status"]["explanation"]

    assert "at about no" not in explanation
    assert "none went out in the last minute" in explanation


def test_counts_are_grouped_by_thousands_on_the_page(client) -> None:
    tenant = make_tenant("big.example")
    endpoint = make_endpoint(tenant, "http://127.0.0.1:9/big")
    for i in range(1_200):
        publish_to_endpoint(endpoint, "orders/paid", {"i": i})

    data = status_of(client, tenant)
    page = client.get(reverse("tenants:dashboard", args=[tenant.key])).content.decode()
    cells = render_to_string(
        "dashboards/_health_cells.html",
        {"w": {"delivered": 20000, "attempts": 20000, "capped": True}, "max_read": 20000},
    )

    assert data["backlog"]["fresh"] == 1_200
    assert "1,200 new" in page
    assert "20,000 of the latest 20,000" in cells


def test_with_nothing_delivered_the_drain_time_is_unknown_and_says_why(client) -> None:
    tenant = make_tenant("nodrain.example")
    make_endpoint(tenant, "http://127.0.0.1:9/nodrain")
    publish(tenant, "orders/paid", {"n": 1})

    drain = status_of(client, tenant)["drain"]
    page = client.get(reverse("tenants:dashboard", args=[tenant.key])).content.decode()

    assert drain["text"] == "unknown" and drain["seconds"] is None
    assert drain["detail"] == "nothing went out lately to estimate from"
    assert "nothing went out lately to estimate from" in page
    assert "estimating" not in page


def test_a_success_rate_just_under_one_never_reads_100_percent() -> None:
    assert WindowHealth(10_000, 9_999, None, None).success_text == "99.9 %"
    assert WindowHealth(10_000, 10_000, None, None).success_text == "100 %"
    assert WindowHealth(3, 1, None, None).success_text == "33.3 %"

"""Every list and page of the management API reads the history tables through an index
on PostgreSQL (tests/pg_plans.py): no list scans a table that grows with traffic, on the
first page or deep behind a cursor. bench/history.py times the same pages at 10 million
rows (docs/BENCHMARKS.md)."""

from datetime import timedelta
from urllib.parse import urlencode

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from dashboards import messages
from delivery.models import Attempt, Delivery
from ingest.publish import publish
from tests.api.helpers import Api, operator_token
from tests.factories import make_endpoint, make_tenant
from tests.pg_plans import assert_no_scan_of_history
from webhooks.models import Event

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's query planner"),
]


@pytest.fixture
def shop():
    acme = make_tenant("acme")
    hook = make_endpoint(acme, "http://127.0.0.1:9/a")
    base = timezone.now() - timedelta(hours=5)
    events = []
    for index, kind in enumerate(["order.created", "order.paid"] * 4):
        event = publish(acme, kind, {"n": index}).event
        Event.objects.filter(pk=event.pk).update(received_at=base + timedelta(minutes=index))
        events.append(event)
    for number, delivery in enumerate(Delivery.objects.all(), start=1):
        Attempt.objects.create(
            delivery=delivery, endpoint=hook, number=1, outcome="retry", duration_ms=number
        )
    Delivery.objects.filter(pk=Delivery.objects.first().pk).update(status="dead")
    return acme, hook, events


def _pages(api: Api, path: str, **query: str) -> list[str]:
    """The list's first page and the one behind its cursor (limit 3)."""
    first = api.get(f"{path}?{urlencode({**query, 'limit': 3})}")
    assert first.status_code == 200, first.content
    cursor = first.json()["next_cursor"]
    assert cursor, "a second page must exist for its plan to be read"
    return [f"{path}?{urlencode({**query, 'limit': 3, 'cursor': cursor})}"]


def test_every_list_and_page_is_served_by_an_index(shop) -> None:
    _, hook, events = shop
    api = Api(operator_token())
    base = "/api/v1/tenants/acme"
    delivery = Delivery.objects.filter(event=events[2]).get()
    urls = [
        f"{base}/messages",
        f"{base}/messages?event_type=order.paid",
        f"{base}/messages?status=dead",
        f"{base}/messages?status=delivered",
        f"{base}/messages?endpoint={hook.pk}",
        f"{base}/messages?id={events[3].pk}",
        f"{base}/messages/{events[2].pk}",
        f"{base}/endpoints/{hook.pk}/attempts",
        f"{base}/endpoints/{hook.pk}/attempts?outcome=retry",
        f"{base}/deliveries/{delivery.pk}",
        *_pages(api, f"{base}/messages"),
        *_pages(api, f"{base}/messages", event_type="order.paid"),
        *_pages(api, f"{base}/endpoints/{hook.pk}/attempts"),
    ]
    for url in urls:
        with CaptureQueriesContext(connection) as captured:
            answer = api.get(url)
        assert answer.status_code == 200, (url, answer.content)
        assert_no_scan_of_history(captured.captured_queries, url)


@pytest.mark.parametrize("status", ["", "delivered"])
def test_a_delivery_filter_probes_each_event_whatever_the_planner_thinks_of_joins(
    shop, status
) -> None:
    """The plan that walks the newest events and probes each one's deliveries by index is
    kept even where the planner would rather join (it did, misjudging how many deliveries
    match, and hashed every partition of deliveries at 10 million rows)."""
    acme, hook, _ = shop
    filters = {"endpoint": hook, "status": status}
    events = messages.filtered_events(acme, filters).order_by("-received_at", "-pk")[:51]
    sql, params = events.query.sql_with_params()
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_nestloop = off")  # what a misjudged count does
        cursor.execute(f"EXPLAIN {sql}", params)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "SubPlan" in plan, plan
    assert "Semi Join" not in plan, plan

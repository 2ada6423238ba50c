"""The admin's lists of events, deliveries and attempts stay fast on big tables: ids are
searched by index, nothing is counted in full on PostgreSQL, and every list, filter and
search the admin offers there is served by an index (checked with PostgreSQL's planner).
bench/history.py times the same pages over millions of rows."""

import re
from urllib.parse import quote

import pytest
from django.contrib.admin.views.main import ChangeList
from django.db import connection
from django.test.utils import CaptureQueriesContext

from core import admin_paging
from core.admin_cells import clip
from core.admin_paging import EstimatedCountPaginator, planner_estimate
from delivery.models import Attempt, Delivery
from ingest.publish import publish
from tests.factories import make_endpoint, make_tenant
from tests.pg_plans import assert_no_scan_of_history

pytestmark = pytest.mark.django_db


@pytest.fixture
def history():
    tenant = make_tenant("big.example")
    make_endpoint(tenant, "http://127.0.0.1:9/a")
    other = make_tenant("other.example")
    make_endpoint(other, "http://127.0.0.1:9/b")
    for n in range(3):
        publish(tenant, "order.created", {"n": n})
        publish(other, "order.created", {"n": n})
    for delivery in Delivery.objects.all():
        Attempt.objects.create(
            delivery=delivery, endpoint=delivery.endpoint, number=1, outcome="retry"
        )
    return Delivery.objects.filter(tenant=tenant).select_related("event").first()


def _listed(client, url: str) -> list:
    response = client.get(url)
    assert response.status_code == 200
    return list(response.context["cl"].result_list)


def test_an_id_is_found_in_each_list_by_its_own_index(staff_client, history) -> None:
    delivery, event = history, history.event
    lower = delivery.pk.lower()  # pasted in any case
    assert [d.pk for d in _listed(staff_client, f"/admin/delivery/delivery/?q={lower}")] == [
        delivery.pk
    ]
    assert [d.pk for d in _listed(staff_client, f"/admin/delivery/delivery/?q={event.pk}")] == [
        delivery.pk
    ]
    for term in (delivery.pk, event.pk.lower()):
        found = _listed(staff_client, f"/admin/delivery/attempt/?q={term}")
        assert [a.delivery_id for a in found] == [delivery.pk]
    assert [e.pk for e in _listed(staff_client, f"/admin/webhooks/event/?q={event.pk}")] == [
        event.pk
    ]
    # Other words still search the other fields.
    found = _listed(staff_client, "/admin/delivery/delivery/?q=big.example")
    assert {d.tenant.key for d in found} == {"big.example"} and len(found) == 3


def test_attempts_filter_by_outcome(staff_client, history) -> None:
    Attempt.objects.filter(pk=Attempt.objects.order_by("pk")[0].pk).update(outcome="failed")
    found = _listed(staff_client, "/admin/delivery/attempt/?outcome__exact=failed")
    assert [a.outcome for a in found] == ["failed"]
    assert len(_listed(staff_client, "/admin/delivery/attempt/?outcome__exact=retry")) == 5


def test_lists_are_newest_first(staff_client, history) -> None:
    deliveries = _listed(staff_client, "/admin/delivery/delivery/")
    assert [d.pk for d in deliveries] == sorted((d.pk for d in deliveries), reverse=True)
    attempts = _listed(staff_client, "/admin/delivery/attempt/")
    assert [a.pk for a in attempts] == sorted((a.pk for a in attempts), reverse=True)


def test_the_count_is_the_planners_estimate_on_postgresql(history, monkeypatch) -> None:
    queryset = Delivery.objects.order_by("-id")
    assert EstimatedCountPaginator(queryset, 100).count == 6  # small: counted exactly
    assert EstimatedCountPaginator(queryset.none(), 100).count == 0
    monkeypatch.setattr(admin_paging, "EXACT_BELOW", 0)
    counted = EstimatedCountPaginator(queryset, 100).count
    if connection.vendor == "postgresql":
        assert counted == planner_estimate(queryset)
    else:
        assert counted == 6


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's query planner")
def test_every_list_filter_and_search_is_served_by_an_index(staff_client, history) -> None:
    """With sequential scans priced out (tiny tables would always be scanned), a list
    query that still scans a history table has no index to use."""
    delivery, tenant_key = history, history.tenant.key
    pages = [
        "/admin/webhooks/event/",
        f"/admin/webhooks/event/?tenant_key={tenant_key}",
        f"/admin/webhooks/event/?q={delivery.event_id}",
        "/admin/webhooks/event/?received_at__gte=2026-01-01+00:00:00%2B00:00",
        "/admin/delivery/delivery/",
        "/admin/delivery/delivery/?status__exact=dead",
        f"/admin/delivery/delivery/?tenant_key={tenant_key}&status__exact=pending",
        f"/admin/delivery/delivery/?endpoint_id={delivery.endpoint_id}&status__exact=held",
        f"/admin/delivery/delivery/?q={delivery.pk}",
        "/admin/delivery/attempt/",
        f"/admin/delivery/attempt/?q={delivery.event_id}",
        "/admin/delivery/attempt/?outcome__exact=retry",
        f"/admin/delivery/delivery/{delivery.pk}/change/",
    ]
    for url in pages:
        with CaptureQueriesContext(connection) as captured:
            assert staff_client.get(url).status_code == 200
        assert_no_scan_of_history(captured.captured_queries, url)


def test_a_count_that_is_an_estimate_says_about(staff_client, history, monkeypatch) -> None:
    """The page footer names the planner's estimate as one; an exact count is shown as is."""
    response = staff_client.get("/admin/delivery/delivery/")
    footer = response.content.decode().split('<p class="paginator">')[1].split("</p>")[0]
    assert "about" not in footer and "6 deliveries" in footer
    monkeypatch.setattr(admin_paging, "EXACT_BELOW", 0)
    response = staff_client.get("/admin/delivery/delivery/")
    footer = response.content.decode().split('<p class="paginator">')[1].split("</p>")[0]
    if connection.vendor == "postgresql":
        cl = response.context["cl"]
        assert cl.paginator.is_estimate
        assert f"about {cl.result_count:,}</span> deliveries" in footer  # grouped, as every count
    else:  # SQLite counts exactly
        assert "about" not in footer and "6 deliveries" in footer


def test_an_id_pasted_as_the_list_shows_it_is_found(staff_client, history) -> None:
    delivery, event = history, history.event

    def shown(value: str) -> str:
        """The cell's visible text, as a person copies it from the list."""
        return re.sub(r"<[^>]+>", "", clip(value, 11, keep_end=True))

    assert shown(delivery.pk).startswith("…")
    found = _listed(staff_client, f"/admin/delivery/delivery/?q={quote(shown(delivery.pk))}")
    assert [d.pk for d in found] == [delivery.pk]
    found = _listed(staff_client, f"/admin/delivery/attempt/?q={quote(shown(delivery.pk))}")
    assert [a.delivery_id for a in found] == [delivery.pk]
    found = _listed(staff_client, f"/admin/webhooks/event/?q={quote(shown(event.pk))}")
    assert [e.pk for e in found] == [event.pk]


def test_result_counts_are_grouped_by_thousands(staff_client, history, monkeypatch) -> None:
    real = ChangeList.get_results

    def many(self, request):
        real(self, request)
        self.result_count = 81_377

    monkeypatch.setattr(ChangeList, "get_results", many)

    page = staff_client.get("/admin/delivery/delivery/?q=big.example").content.decode()

    assert "81,377 results" in page and "81377" not in page

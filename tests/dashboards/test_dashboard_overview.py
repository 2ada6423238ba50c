"""The operations overview in the admin: who sees it, what it shows, and its actions."""

import re
import time
from datetime import timedelta

import pytest
import redis
from django.contrib.auth.models import Permission, User
from django.urls import reverse
from django.utils import timezone

from delivery.models import Delivery
from delivery.pipeline import enqueueing
from delivery.scheduler import (
    EndpointAnswers,
    Scheduler,
    get_scheduler,
    install_scheduler,
    reset_scheduler,
)
from delivery.upkeep.maintenance import rebuild_schedule
from ingest.publish import publish
from tenants.models import AuditEntry, Endpoint, Tenant
from tests.factories import make_endpoint, make_tenant, make_user
from tests.scheduler_helpers import fill_a_new_adaptive_limit
from webhooks.models import Event

pytestmark = pytest.mark.django_db(transaction=True)
OVERVIEW = "/admin/overview/"


@pytest.fixture
def staff_client(client):
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    return client


@pytest.fixture
def later(redis_conn):
    install_scheduler(Scheduler(redis_conn, clock=lambda: time.time() + 300))
    yield
    reset_scheduler()


@pytest.fixture
def scene(later):
    """Two paced tenants, one paused, one whose endpoint is disabled, and the fallback lane."""
    loud = make_tenant("loud.example", name="Loud Shop")
    other = make_tenant("other.example")
    resting = make_tenant("resting.example", is_active=False)
    broken = make_tenant("broken.example")
    for tenant in (loud, other, resting, broken):
        make_endpoint(tenant, f"http://127.0.0.1:9/{tenant.key}", max_in_flight=50)
    for i in range(12):
        publish(loud, "x", {"i": i})
    for i in range(3):
        publish(other, "x", {"i": i})
        publish(resting, "x", {"i": i})
        publish(broken, "x", {"i": i})
    # broken's endpoint is disabled: its deliveries are held, out of the schedule.
    Endpoint.objects.filter(tenant=broken).update(enabled=False, disabled_reason="HTTP 410")
    Delivery.objects.filter(tenant=broken).update(status=Delivery.Status.HELD)
    rebuild_schedule()
    Delivery.objects.filter(tenant=other).update(
        status=Delivery.Status.DEAD
    )  # still queued in Redis
    return {"loud": loud, "other": other, "resting": resting, "broken": broken}


def test_overview_is_staff_only_and_linked_from_the_admin_index(client, staff_client) -> None:
    index = staff_client.get(reverse("admin:index")).content.decode()
    assert f'href="{OVERVIEW}"' in index
    client.logout()
    response = client.get(OVERVIEW)
    assert response.status_code == 302 and "/admin/login/" in response["Location"]
    client.force_login(make_user("member", tenant=make_tenant()))
    assert client.get(OVERVIEW).status_code == 302  # not staff: the admin's login page
    clerk = make_user("clerk", staff=True)
    client.force_login(clerk)
    assert client.get(OVERVIEW).status_code == 403  # staff without view_tenant
    clerk.user_permissions.add(Permission.objects.get(codename="view_tenant"))
    assert client.get(OVERVIEW).status_code == 200


def test_overview_lists_every_backlogged_tenant_with_its_status(staff_client, scene) -> None:
    page = staff_client.get(OVERVIEW).content.decode()
    for key in ("loud.example", "other.example", "resting.example", "broken.example"):
        assert key in page
    assert "paced (sharing turns with 1 other backlogged tenant)" in page
    assert "tenant paused" in page
    assert "endpoint disabled (held)" in page
    assert "5 min" in page  # the age of loud's oldest, on a clock 300 s ahead
    assert 'href="/t/loud.example/"' in page
    # By key, so the list's tenant box shows whose rows they are: its events and attempts.
    assert page.count("?tenant_key=loud.example") >= 2


def test_overview_sorts_by_age_and_filters_by_status(staff_client, scene) -> None:
    paused_only = staff_client.get(OVERVIEW + "?status=paused").content.decode()
    table = paused_only[paused_only.index('id="ov-tenants"') :]
    assert "resting.example" in table and "loud.example" not in table
    assert "tenant paused (1)" in paused_only
    # In the table: the oldest-backlog card names loud above it.
    oldest_first = staff_client.get(OVERVIEW + "?sort=age").content.decode()
    oldest_first = oldest_first[oldest_first.index('id="ov-tenants"') :]
    newest_first = staff_client.get(OVERVIEW + "?sort=-age").content.decode()
    newest_first = newest_first[newest_first.index('id="ov-tenants"') :]
    assert oldest_first.index("loud.example") < oldest_first.index("broken.example")
    assert newest_first.index("broken.example") < newest_first.index("loud.example")


def test_overview_shows_the_fallback_lane_and_troubled_endpoints(staff_client, scene) -> None:
    shared = make_endpoint(None, "http://127.0.0.1:9/shared")
    event = Event.objects.create(tenant=None, event_type="x", payload=b"{}")
    delivery = Delivery.objects.create(event=event, endpoint=shared, tenant=None)
    enqueueing.enqueue_now(
        [Delivery.objects.select_related("tenant", "endpoint").get(pk=delivery.pk)]
    )
    page = staff_client.get(OVERVIEW).content.decode()
    assert "(fallback lane)" in page
    assert 'id="ov-fallback">1<' in page
    endpoints = page[page.index('id="ov-endpoints"') :]
    assert "http://127.0.0.1:9/broken.example" in endpoints and "disabled (held)" in endpoints


def test_overview_says_why_an_adaptive_limit_holds_an_endpoint(staff_client) -> None:
    tenant = make_tenant("fragile.example")
    endpoint = make_endpoint(tenant, "http://127.0.0.1:9/fragile", max_in_flight=50)
    scheduler = get_scheduler()
    fill_a_new_adaptive_limit(scheduler, tenant.pk, endpoint.pk)
    endpoints = staff_client.get(OVERVIEW).content.decode()
    endpoints = endpoints[endpoints.index('id="ov-endpoints"') :]
    assert "at its adaptive limit" in endpoints
    assert "It has not backed off" in endpoints
    scheduler.answered([], [EndpointAnswers(endpoint.pk, overloaded=1)])
    endpoints = staff_client.get(OVERVIEW).content.decode()
    endpoints = endpoints[endpoints.index('id="ov-endpoints"') :]
    assert "4 / 2" in re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", endpoints))
    assert "It last backed off from 4 at " in endpoints
    assert "answered 429 or 503, timed out or refused the connection" in endpoints


def test_the_links_it_gives_answer(staff_client, scene) -> None:
    for url in (
        reverse("admin:webhooks_event_changelist") + "?tenant_key=loud.example",
        reverse("admin:delivery_attempt_changelist") + "?tenant_key=loud.example",
        reverse("admin:delivery_attempt_changelist") + "?delivery__tenant__isnull=True",
        reverse("admin:delivery_delivery_changelist")
        + "?tenant_key=loud.example&status__exact=dead",
        reverse("tenants:dashboard", args=["loud.example"]),
    ):
        assert staff_client.get(url).status_code == 200, url


def act(client, **data) -> None:
    response = client.post(reverse("admin-overview-act"), {**data, "next": OVERVIEW + "?sort=age"})
    assert response.status_code == 302
    assert response["Location"] == OVERVIEW + "?sort=age"


def test_pause_resume_and_weight_reach_the_scheduler(staff_client, scene) -> None:
    loud = scene["loud"]
    act(staff_client, action="pause", tenant=loud.pk)
    assert not Tenant.objects.get(pk=loud.pk).is_active
    rows = {r.tenant_id: r for r in get_scheduler().snapshot(top_n=10).tenants}
    assert rows[loud.pk].paused
    act(staff_client, action="resume", tenant=loud.pk)
    act(staff_client, action="weight", tenant=loud.pk, weight=4)
    rows = {r.tenant_id: r for r in get_scheduler().snapshot(top_n=10).tenants}
    assert (rows[loud.pk].paused, rows[loud.pk].weight) == (False, 4)
    act(staff_client, action="weight", tenant=loud.pk, weight=3)  # not a tier: refused
    assert Tenant.objects.get(pk=loud.pk).weight == 4
    # The tenant's admins can trace each act on their portal's audit trail.
    trail = AuditEntry.objects.filter(tenant=loud).order_by("at", "id")
    assert [(e.action, e.via, e.actor_name) for e in trail] == [
        ("tenant.paused", "admin", "root"),
        ("tenant.resumed", "admin", "root"),
        ("tenant.weight_changed", "admin", "root"),
    ]
    assert (trail.last().detail["old"], trail.last().detail["new"]) == (
        {"weight": 1},
        {"weight": 4},
    )


def test_reenable_and_replay(staff_client, scene) -> None:
    endpoint = Endpoint.objects.get(tenant=scene["broken"])
    act(staff_client, action="reenable", endpoint=endpoint.pk)
    assert Endpoint.objects.get(pk=endpoint.pk).enabled
    assert not Delivery.objects.filter(status=Delivery.Status.HELD).exists()
    act(staff_client, action="replay", tenant=scene["other"].pk)
    assert set(Delivery.objects.filter(tenant=scene["other"]).values_list("status", flat=True)) == {
        Delivery.Status.PENDING
    }
    enabled = AuditEntry.objects.get(action="endpoint.enabled")
    assert (enabled.tenant, enabled.target) == (scene["broken"], f"endpoint {endpoint.pk}")
    assert enabled.detail["old"]["enabled"] is False
    replayed = AuditEntry.objects.get(action="dead_letters.replayed")
    assert replayed.tenant == scene["other"]
    assert replayed.detail == {"count": Delivery.objects.filter(tenant=scene["other"]).count()}
    act(staff_client, action="reenable", endpoint=endpoint.pk)  # already enabled: no entry
    assert AuditEntry.objects.filter(action="endpoint.enabled").count() == 1


def test_actions_need_their_permissions_and_a_post(client, scene) -> None:
    viewer = make_user("viewer", staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_tenant"))
    client.force_login(viewer)
    url = reverse("admin-overview-act")
    assert client.get(url).status_code == 405
    assert client.post(url, {"action": "pause", "tenant": scene["loud"].pk}).status_code == 403
    assert client.post(url, {"action": "reenable", "endpoint": 1}).status_code == 403
    assert Tenant.objects.get(pk=scene["loud"].pk).is_active


def test_malformed_posts_are_bad_requests(staff_client, scene) -> None:
    url = reverse("admin-overview-act")
    assert staff_client.post(url, {"action": "pause", "tenant": "x"}).status_code == 400
    assert staff_client.post(url, {"action": "reenable", "endpoint": ""}).status_code == 400
    weight = {"action": "weight", "tenant": scene["loud"].pk, "weight": "heavy"}
    assert staff_client.post(url, weight).status_code == 400


def test_next_must_stay_on_this_site(staff_client, scene) -> None:
    response = staff_client.post(
        reverse("admin-overview-act"),
        {"action": "resume", "tenant": scene["loud"].pk, "next": "https://evil.example/"},
    )
    assert response["Location"] == OVERVIEW


def test_overview_says_so_when_redis_is_away(staff_client) -> None:
    install_scheduler(Scheduler(redis.Redis.from_url("redis://127.0.0.1:1/0")))
    try:
        page = staff_client.get(OVERVIEW)
    finally:
        reset_scheduler()
    assert page.status_code == 200
    assert "did not answer" in page.content.decode()


def test_delivered_per_minute_counts_the_last_minute(staff_client, scene) -> None:
    ids = list(Delivery.objects.filter(tenant=scene["loud"]).values_list("id", flat=True)[:5])
    Delivery.objects.filter(id__in=ids).update(
        status=Delivery.Status.DELIVERED, delivered_at=timezone.now() - timedelta(seconds=20)
    )
    page = staff_client.get(OVERVIEW).content.decode()
    assert 'id="ov-delivered">5<' in page


def test_the_waiting_card_counts_the_lines_listed_and_the_oldest_says_whose(
    staff_client, scene
) -> None:
    page = staff_client.get(OVERVIEW).content.decode()
    table = page[
        page.index('id="ov-tenants"') : page.index("</table>", page.index('id="ov-tenants"'))
    ]
    listed = table.count('<tr class="ov-row-')
    card = re.search(r'id="ov-backlogged">([\d,]+)<', page).group(1)

    assert listed == 4  # three queued, and broken's held work
    assert int(card.replace(",", "")) == listed
    assert re.search(r'id="ov-oldest-whose">([^<]+)<', page).group(1) == "loud.example"


def test_each_backlog_says_when_it_clears(staff_client, scene) -> None:
    loud = scene["loud"]
    for delivery in Delivery.objects.filter(tenant=loud)[:6]:
        Delivery.objects.filter(pk=delivery.pk).update(
            status=Delivery.Status.DELIVERED, delivered_at=timezone.now() - timedelta(seconds=20)
        )
    publish(loud, "x", {"more": True})

    page = staff_client.get(OVERVIEW).content.decode()
    row = page[page.index("<strong>loud.example</strong>") :]
    row = row[: row.index("</tr>")]

    assert "<th" not in row
    assert re.search(r"within a minute|around \d\d:\d\d", row)

"""A tenant's replays page: admins preview, confirm and cancel; viewers read; nobody
else gets in, nor through a share link; bad windows get form errors."""

import re
from datetime import timedelta

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from delivery.models import Delivery, ReplayJob
from delivery.scheduler import get_scheduler
from delivery.upkeep import maintenance
from tenants import share
from tenants.models import AuditEntry, Membership
from tests.delivery.test_replay_window import finished_deliveries
from tests.factories import make_endpoint, make_tenant, make_user

pytestmark = pytest.mark.django_db(transaction=True)
FMT = "%Y-%m-%dT%H:%M:%S"


def member(username: str, tenant, role: str) -> Client:
    user = make_user(username, tenant=tenant, role=role)
    client = Client()
    client.force_login(user)
    return client


def window(**extra) -> dict:
    now = timezone.localtime()
    return {
        "statuses": ["dead"],
        "start": (now - timedelta(hours=1)).strftime(FMT),
        "end": (now + timedelta(minutes=1)).strftime(FMT),
        **extra,
    }


class Shops:
    def __init__(self) -> None:
        self.mine = make_tenant("mine.example", name="Mine Shop")
        self.endpoint = make_endpoint(self.mine, "http://127.0.0.1:9/mine-hook")
        self.other = make_tenant("other.example", name="Other Shop")
        self.other_endpoint = make_endpoint(self.other, "http://127.0.0.1:9/other-hook")
        finished_deliveries(self.mine, self.endpoint, 6)
        finished_deliveries(self.mine, self.endpoint, 3, Delivery.Status.DELIVERED)
        finished_deliveries(self.other, self.other_endpoint, 4)
        self.url = reverse("tenants:replays", kwargs={"key": self.mine.key})
        self.other_url = reverse("tenants:replays", kwargs={"key": self.other.key})


@pytest.fixture
def shops() -> Shops:
    return Shops()


def test_an_admin_previews_confirms_and_cancels(shops) -> None:
    client = member("boss", shops.mine, Membership.ADMIN)
    page = client.get(shops.url)
    assert page.status_code == 200
    assert 'name="csrfmiddlewaretoken"' in page.content.decode()
    # Under no-referrer, browsers post forms with `Origin: null`, which CSRF refuses.
    assert page["Referrer-Policy"] == "same-origin"
    assert "other-hook" not in page.content.decode()  # only this tenant's endpoints
    # An empty form starts at the last hour, to the second, in the server's time zone.
    assert page.context["form"]["start"].value() == page.context["form"]["end"].value() - timedelta(
        hours=1
    )

    preview = client.post(shops.url, window(endpoint=shops.endpoint.pk))
    text = preview.content.decode()
    assert preview.status_code == 200
    assert "6 deliveries will be sent again through Mine Shop's lane." in text
    assert not ReplayJob.objects.exists()

    confirmed = client.post(shops.url, {**window(endpoint=shops.endpoint.pk), "confirm": "1"})
    assert confirmed.status_code == 302 and confirmed["Location"] == shops.url
    job = ReplayJob.objects.get()
    assert (job.tenant, job.matched, job.created_by_name) == (shops.mine, 6, "boss")
    started = AuditEntry.objects.get(action=AuditEntry.Action.REPLAY_STARTED)
    assert (started.via, started.tenant, started.detail["matched"]) == ("portal", shops.mine, 6)

    get_scheduler().start_epoch()
    maintenance.sweep()
    listing = client.get(shops.url).content.decode()
    assert "6 / 6" in listing and "Running" in listing
    assert (
        reverse("tenants:replay-cancel", kwargs={"key": shops.mine.key, "job_id": job.pk})
        in listing
    )

    cancel = reverse("tenants:replay-cancel", kwargs={"key": shops.mine.key, "job_id": job.pk})
    assert client.get(cancel).status_code == 405
    assert client.post(cancel).status_code == 302
    job.refresh_from_db()
    assert job.state == "cancelled"
    assert AuditEntry.objects.filter(
        action=AuditEntry.Action.REPLAY_CANCELLED, via="portal"
    ).exists()


def test_the_jobs_part_refreshes_progress(shops) -> None:
    client = member("boss", shops.mine, Membership.ADMIN)
    client.post(shops.url, {**window(), "confirm": "1"})
    part = client.get(shops.url + "?part=jobs").content.decode()
    assert part.lstrip().startswith("<tr") and "0 / 6" in part and "<html" not in part


@pytest.mark.parametrize(
    "change, error",
    [
        ({"start": "not a date"}, "Enter a valid date/time."),
        ({"end": "2001-01-01T00:00:00"}, "must be after"),
        ({"statuses": []}, "This field is required."),
        ({"statuses": ["held"]}, "Select a valid choice"),
        ({"endpoint": "abc"}, "Select a valid choice"),
    ],
)
def test_bad_windows_are_form_errors_not_500s(shops, change, error) -> None:
    client = member("boss", shops.mine, Membership.ADMIN)
    response = client.post(shops.url, {**window(), **change, "confirm": "1"})
    assert response.status_code == 400
    assert error in response.content.decode()
    assert not ReplayJob.objects.exists()


def test_another_tenants_endpoint_id_is_an_invalid_choice(shops) -> None:
    client = member("boss", shops.mine, Membership.ADMIN)
    response = client.post(shops.url, {**window(endpoint=shops.other_endpoint.pk), "confirm": "1"})
    assert response.status_code == 400
    assert "Select a valid choice" in response.content.decode()
    assert not ReplayJob.objects.exists()
    assert Delivery.objects.filter(tenant=shops.other, status="dead").count() == 4


def test_viewers_read_but_change_nothing(shops) -> None:
    job = ReplayJob.objects.create(tenant=shops.mine, filters=window_json(), created_by_name="x")
    viewer = member("watcher", shops.mine, Membership.VIEWER)
    page = viewer.get(shops.url).content.decode()
    assert "only the tenant's admins can start or cancel" in page
    assert 'name="confirm"' not in page and 'name="preview"' not in page and ">Cancel<" not in page
    assert viewer.post(shops.url, window()).status_code == 403
    assert viewer.post(shops.url, {**window(), "confirm": "1"}).status_code == 403
    cancel = reverse("tenants:replay-cancel", kwargs={"key": shops.mine.key, "job_id": job.pk})
    assert viewer.post(cancel).status_code == 403
    job.refresh_from_db()
    assert job.state == "running" and ReplayJob.objects.count() == 1


def window_json() -> dict:
    now = timezone.now()
    return {
        "endpoint": None,
        "statuses": ["dead"],
        "event_type": "",
        "from": (now - timedelta(hours=1)).isoformat(),
        "to": now.isoformat(),
    }


def test_members_of_another_tenant_get_404_everywhere(shops) -> None:
    theirs = ReplayJob.objects.create(
        tenant=shops.other, filters=window_json(), created_by_name="o"
    )
    mine = ReplayJob.objects.create(tenant=shops.mine, filters=window_json(), created_by_name="m")
    client = member("boss", shops.mine, Membership.ADMIN)
    assert client.get(shops.other_url).status_code == 404
    assert client.post(shops.other_url, {**window(), "confirm": "1"}).status_code == 404
    # Their job through my tenant's URL: not found, and left running.
    cancel_theirs = reverse(
        "tenants:replay-cancel", kwargs={"key": shops.mine.key, "job_id": theirs.pk}
    )
    assert client.post(cancel_theirs).status_code == 404
    theirs.refresh_from_db()
    assert theirs.state == "running"
    page = client.get(shops.url).content.decode()
    assert f'id="replay-{mine.pk}"' in page and f'id="replay-{theirs.pk}"' not in page
    outsider = member("stranger", shops.other, Membership.ADMIN)
    assert outsider.get(shops.url).status_code == 404


def test_anonymous_users_go_to_login_and_share_links_do_not_open_it(client, shops) -> None:
    response = client.get(shops.url)
    assert response.status_code == 302 and "login" in response["Location"]
    token = share.make_token(shops.mine, days=1)
    assert client.get(f"/t/{shops.mine.key}/s/{token}/replays/").status_code == 404
    assert client.post(shops.url, {**window(), "confirm": "1"}).status_code == 302
    assert not ReplayJob.objects.exists()


def test_posts_need_a_csrf_token(shops) -> None:
    user = make_user("boss", tenant=shops.mine)
    Membership.objects.filter(user=user).update(role=Membership.ADMIN)
    job = ReplayJob.objects.create(tenant=shops.mine, filters=window_json(), created_by_name="m")
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    assert client.post(shops.url, {**window(), "confirm": "1"}).status_code == 403
    cancel = reverse("tenants:replay-cancel", kwargs={"key": shops.mine.key, "job_id": job.pk})
    assert client.post(cancel).status_code == 403
    assert ReplayJob.objects.count() == 1 and ReplayJob.objects.get().state == "running"


def test_the_dashboard_links_members_to_replays_but_not_share_links(client, shops) -> None:
    boss = member("boss", shops.mine, Membership.VIEWER)
    dashboard = boss.get(reverse("tenants:dashboard", kwargs={"key": shops.mine.key}))
    assert shops.url in dashboard.content.decode()
    token = share.make_token(shops.mine, days=1)
    shared = client.get(reverse("tenants:shared", args=[shops.mine.key, token]))
    assert shared.status_code == 200 and shops.url not in shared.content.decode()


def test_the_form_offers_dead_letters_only_until_delivered_is_ticked(shops) -> None:
    client = member("boss", shops.mine, Membership.ADMIN)

    page = client.get(shops.url).content.decode()
    boxes = {
        value: "checked" in box
        for box, value in re.findall(r'(<input[^>]*name="statuses" value="(\w+)"[^>]*>)', page)
    }

    assert boxes == {"dead": True, "delivered": False}

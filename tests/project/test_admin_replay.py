"""Window replays in the admin: form, preview, confirm, the job's page, cancel, audit."""

from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from delivery.models import Delivery, ReplayJob
from tenants.models import AuditEntry
from tests.delivery.test_replay_window import finished_deliveries
from tests.factories import make_endpoint, make_tenant, make_user

pytestmark = pytest.mark.django_db(transaction=True)
WINDOW = reverse("admin:delivery_replayjob_window")
FMT = "%Y-%m-%dT%H:%M:%S"


def window(tenant, **extra) -> dict:
    now = timezone.localtime()
    return {
        "tenant": tenant.key,
        "statuses": ["dead", "delivered"],
        "start": (now - timedelta(hours=1)).strftime(FMT),
        "end": (now + timedelta(minutes=1)).strftime(FMT),
        **extra,
    }


@pytest.fixture
def shop():
    tenant = make_tenant("admin-replay.example", name="Admin Replay Shop")
    endpoint = make_endpoint(tenant)
    finished_deliveries(tenant, endpoint, 7)
    finished_deliveries(tenant, endpoint, 2, Delivery.Status.PENDING)
    return tenant, endpoint


def test_preview_counts_and_confirm_starts_an_audited_job(staff_client, shop) -> None:
    tenant, endpoint = shop
    response = staff_client.post(WINDOW, window(tenant, endpoint=endpoint.pk))
    assert response.status_code == 200
    text = response.content.decode()
    assert "<strong>7</strong> deliveries will be sent again through" in text
    assert "Admin Replay Shop</strong>'s lane" in text
    assert 'name="csrfmiddlewaretoken"' in text and 'name="confirm"' in text
    assert not ReplayJob.objects.exists()  # a preview starts nothing

    response = staff_client.post(WINDOW, {**window(tenant, endpoint=endpoint.pk), "confirm": "1"})
    job = ReplayJob.objects.get()
    assert response.status_code == 302
    assert response["Location"] == reverse("admin:delivery_replayjob_change", args=[job.pk])
    assert (job.tenant, job.matched, job.state, job.filters["endpoint"]) == (
        tenant,
        7,
        "running",
        endpoint.pk,
    )
    entry = AuditEntry.objects.get(action=AuditEntry.Action.REPLAY_STARTED)
    assert (entry.via, entry.tenant, entry.detail["matched"]) == ("admin", tenant, 7)
    assert entry.detail["filters"]["statuses"] == ["dead", "delivered"]

    page = staff_client.get(response["Location"]).content.decode()
    assert "0 / 7" in page and "Cancel this replay" in page
    assert '<meta http-equiv="refresh" content="10">' in page  # progress without a reload
    assert timezone.localtime(job.created_at).strftime("%H:%M:%S") in page  # to the second

    cancel = reverse("admin:delivery_replayjob_cancel", args=[job.pk])
    assert staff_client.get(cancel).status_code == 405
    assert staff_client.post(cancel).status_code == 302
    job.refresh_from_db()
    assert job.state == "cancelled"
    assert AuditEntry.objects.filter(action=AuditEntry.Action.REPLAY_CANCELLED).count() == 1
    finished = staff_client.get(response["Location"]).content.decode()
    assert "Cancel this replay" not in finished and 'http-equiv="refresh"' not in finished


@pytest.mark.parametrize(
    "change, error",
    [
        ({"tenant": "nobody.example"}, "No tenant has this key."),
        ({"start": "yesterday-ish"}, "Enter a valid date/time."),
        ({"end": "2000-01-01T00:00:00"}, "must be after"),
        ({"statuses": ["pending"]}, "Select a valid choice"),
    ],
)
def test_bad_windows_get_a_form_error(staff_client, shop, change, error) -> None:
    tenant, _ = shop
    response = staff_client.post(WINDOW, {**window(tenant), **change, "confirm": "1"})
    assert response.status_code == 400
    assert error in response.content.decode()
    assert not ReplayJob.objects.exists()


def test_another_tenants_endpoint_is_refused(staff_client, shop) -> None:
    tenant, _ = shop
    foreign = make_endpoint(make_tenant("elsewhere.example"))
    response = staff_client.post(WINDOW, window(tenant, endpoint=foreign.pk))
    assert response.status_code == 400
    assert "This tenant has no endpoint with this id." in response.content.decode()


def test_the_deliveries_action_fills_in_the_form(staff_client, shop) -> None:
    tenant, endpoint = shop
    ids = list(Delivery.objects.filter(status="dead").values_list("id", flat=True))
    response = staff_client.post(
        reverse("admin:delivery_delivery_changelist"),
        {"action": "replay_window_action", "_selected_action": ids},
    )
    assert response.status_code == 302 and response["Location"].startswith(WINDOW)
    form = staff_client.get(response["Location"]).content.decode()
    assert f'value="{tenant.key}"' in form and f'value="{endpoint.pk}"' in form


def test_replaying_needs_the_change_delivery_permission(shop) -> None:
    tenant, _ = shop
    user = make_user("viewer-op", staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_delivery"))
    client = Client()
    client.force_login(user)
    assert client.get(WINDOW).status_code == 403
    listing = client.get(reverse("admin:delivery_delivery_changelist")).content.decode()
    assert "replay_window_action" not in listing
    assert client.post(WINDOW, {**window(tenant), "confirm": "1"}).status_code == 403
    assert not ReplayJob.objects.exists()


def test_confirm_needs_a_csrf_token(shop) -> None:
    tenant, _ = shop
    client = Client(enforce_csrf_checks=True)
    client.force_login(User.objects.create_superuser("root", password="pw"))
    assert client.post(WINDOW, {**window(tenant), "confirm": "1"}).status_code == 403
    assert not ReplayJob.objects.exists()

"""The operators' delivery page (read-only, with Resend and Retry now), the tenant and
endpoint boxes on the deliveries list, and the bounded payload search on events."""

from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from delivery.models import Attempt, Delivery
from delivery.replays.resend import resend
from delivery.scheduler import get_scheduler
from ingest.publish import publish
from tenants.models import AuditEntry
from tests.factories import make_endpoint, make_tenant, make_user
from webhooks import admin_payload
from webhooks.models import Event

pytestmark = pytest.mark.django_db(transaction=True)


def page_url(delivery: Delivery) -> str:
    return reverse("admin:delivery_delivery_change", args=[delivery.pk])


def published(key: str = "acme") -> Delivery:
    tenant = make_tenant(key)
    make_endpoint(tenant, f"http://127.0.0.1:9/{key}")
    publish(tenant, "order.created", {"shop": key})
    return Delivery.objects.get(tenant=tenant)


def finished(status: str, key: str = "acme") -> Delivery:
    """A delivery that went out once and ended `status`; the schedule holds nothing."""
    delivery = published(key)
    scheduler = get_scheduler()
    [lease] = scheduler.pick("w", 1).leases
    scheduler.ack([lease])
    Delivery.objects.filter(pk=delivery.pk).update(
        status=status, attempts=3, delivered_at=timezone.now()
    )
    return Delivery.objects.get(pk=delivery.pk)


def waiting_for_retry(key: str = "acme") -> Delivery:
    """A failed attempt, the retry an hour away: as sending.py leaves it."""
    delivery = published(key)
    scheduler = get_scheduler()
    [lease] = scheduler.pick("w", 1).leases
    due = timezone.now() + timedelta(hours=1)
    assert scheduler.retry_later(lease, due.timestamp())
    Delivery.objects.filter(pk=delivery.pk).update(
        status=Delivery.Status.RETRY_SCHEDULED,
        lane=Delivery.Lane.RETRY,
        attempts=1,
        next_attempt_at=due,
    )
    return Delivery.objects.get(pk=delivery.pk)


def picked_ids() -> list[str]:
    return [lease.delivery_id for lease in get_scheduler().pick("w2", 5).leases]


def operator(*perms: str) -> Client:
    user = make_user("op", staff=True)
    for codename in perms:
        user.user_permissions.add(Permission.objects.get(codename=codename))
    client = Client()
    client.force_login(user)
    return client


# The page ----------------------------------------------------------------------------


def test_the_page_is_read_only_titled_and_links_event_endpoint_and_tenant(staff_client) -> None:
    delivery = finished(Delivery.Status.DEAD)

    html = staff_client.get(page_url(delivery)).content.decode()

    assert f"<h1>Delivery {delivery.pk}</h1>" in html
    assert "Change delivery" not in html
    assert 'name="_save"' not in html and 'name="_continue"' not in html
    assert "deletelink" not in html
    for name, pk in [
        ("webhooks_event", delivery.event_id),
        ("tenants_endpoint", delivery.endpoint_id),
        ("tenants_tenant", delivery.tenant_id),
    ]:
        assert reverse(f"admin:{name}_change", args=[pk]) in html
    assert ">Resend</button>" in html and "Retry now" not in html


def test_a_post_to_the_page_changes_nothing(staff_client) -> None:
    delivery = finished(Delivery.Status.DEAD)
    before = Delivery.objects.filter(pk=delivery.pk).values().get()

    response = staff_client.post(page_url(delivery), {"status": "delivered", "_save": "Save"})

    assert response.status_code == 403
    assert Delivery.objects.filter(pk=delivery.pk).values().get() == before
    delete = reverse("admin:delivery_delivery_delete", args=[delivery.pk])
    assert staff_client.post(delete, {"post": "yes"}).status_code == 403
    assert Delivery.objects.filter(pk=delivery.pk).exists()


def test_the_list_action_still_replays_dead_letters(staff_client) -> None:
    delivery = finished(Delivery.Status.DEAD)
    response = staff_client.post(
        reverse("admin:delivery_delivery_changelist"),
        {"action": "replay_dead_letters", "_selected_action": [delivery.pk]},
    )
    assert response.status_code == 302
    assert picked_ids() == [delivery.pk]


# Resend ------------------------------------------------------------------------------


@pytest.mark.parametrize("status", [Delivery.Status.DEAD, Delivery.Status.DELIVERED])
def test_resend_queues_it_again_audits_and_says_so(staff_client, status) -> None:
    delivery = finished(status)
    url = reverse("admin:delivery_delivery_resend", args=[delivery.pk])

    response = staff_client.post(url, follow=True)

    assert response.redirect_chain == [(page_url(delivery), 302)]
    assert f"Delivery {delivery.pk} resent" in response.content.decode()
    assert picked_ids() == [delivery.pk]
    entry = AuditEntry.objects.get()
    assert (entry.action, entry.via, entry.target, entry.tenant_id, entry.actor_name) == (
        AuditEntry.Action.DELIVERY_RESENT,
        AuditEntry.Via.ADMIN,
        f"delivery {delivery.pk}",
        delivery.tenant_id,
        "root",
    )


def test_resend_of_an_open_delivery_is_refused_with_a_message(staff_client) -> None:
    delivery = waiting_for_retry()
    url = reverse("admin:delivery_delivery_resend", args=[delivery.pk])

    html = staff_client.post(url, follow=True).content.decode()

    assert "was not resent" in html
    assert not AuditEntry.objects.exists()
    assert Delivery.objects.get(pk=delivery.pk).status == Delivery.Status.RETRY_SCHEDULED


# Retry now ---------------------------------------------------------------------------


def test_retry_now_sends_a_waiting_retry_at_once(staff_client) -> None:
    delivery = waiting_for_retry()
    assert picked_ids() == []  # its retry is an hour away
    assert "Retry now</button>" in staff_client.get(page_url(delivery)).content.decode()

    response = staff_client.post(
        reverse("admin:delivery_delivery_retry_now", args=[delivery.pk]), follow=True
    )

    assert response.redirect_chain == [(page_url(delivery), 302)]
    assert "queued in its tenant&#x27;s retry lane" in response.content.decode()
    assert picked_ids() == [delivery.pk]
    row = Delivery.objects.get(pk=delivery.pk)
    assert row.next_attempt_at <= timezone.now()
    entry = AuditEntry.objects.get()
    assert (entry.action, entry.target) == (
        AuditEntry.Action.DELIVERY_RETRIED,
        f"delivery {delivery.pk}",
    )


def test_retry_now_twice_sends_once_and_says_why(staff_client) -> None:
    delivery = waiting_for_retry()
    url = reverse("admin:delivery_delivery_retry_now", args=[delivery.pk])
    staff_client.post(url)

    html = staff_client.post(url, follow=True).content.decode()

    assert "no longer waiting for its retry time" in html
    assert picked_ids() == [delivery.pk]  # entered its lane once
    assert picked_ids() == []
    assert AuditEntry.objects.count() == 1


def test_retry_now_of_a_finished_delivery_changes_nothing(staff_client) -> None:
    delivery = finished(Delivery.Status.DELIVERED)
    html = staff_client.post(
        reverse("admin:delivery_delivery_retry_now", args=[delivery.pk]), follow=True
    ).content.decode()
    assert "not waiting for a retry (it is delivered)" in html
    assert picked_ids() == [] and not AuditEntry.objects.exists()


def test_retry_now_of_a_delivery_not_yet_in_the_schedule_says_so(staff_client) -> None:
    delivery = waiting_for_retry()
    Delivery.objects.filter(pk=delivery.pk).update(needs_schedule=True)
    html = staff_client.post(
        reverse("admin:delivery_delivery_retry_now", args=[delivery.pk]), follow=True
    ).content.decode()
    assert "is not in the schedule yet" in html
    assert Delivery.objects.get(pk=delivery.pk).next_attempt_at == delivery.next_attempt_at
    assert not AuditEntry.objects.exists()


def test_a_button_for_an_unknown_delivery_is_a_404(staff_client) -> None:
    url = reverse("admin:delivery_delivery_resend", args=["01NOSUCHDELIVERY0000000000"])
    assert staff_client.post(url).status_code == 404


@pytest.mark.parametrize("action", ["resend", "retry_now"])
def test_the_buttons_need_the_change_permission(action) -> None:
    delivery = waiting_for_retry() if action == "retry_now" else finished(Delivery.Status.DEAD)
    client = operator("view_delivery")
    assert client.get(page_url(delivery)).status_code == 200
    assert "delivery-actions" not in client.get(page_url(delivery)).content.decode()

    response = client.post(reverse(f"admin:delivery_delivery_{action}", args=[delivery.pk]))

    assert response.status_code == 403
    assert picked_ids() == [] and not AuditEntry.objects.exists()


@pytest.mark.parametrize("action", ["resend", "retry_now"])
def test_the_buttons_need_a_csrf_token_and_a_post(action) -> None:
    delivery = waiting_for_retry() if action == "retry_now" else finished(Delivery.Status.DEAD)
    client = Client(enforce_csrf_checks=True)
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    url = reverse(f"admin:delivery_delivery_{action}", args=[delivery.pk])

    assert client.post(url).status_code == 403
    assert client.get(url).status_code == 405
    assert picked_ids() == [] and not AuditEntry.objects.exists()


# Tenant and endpoint boxes -------------------------------------------------------------


def listed_ids(response) -> set[str]:
    assert response.status_code == 200
    return {str(row.pk) for row in response.context["cl"].result_list}


@pytest.fixture
def two_shops() -> tuple[Delivery, Delivery, Delivery]:
    """acme with two endpoints (a delivery each) and other with one."""
    acme, other = make_tenant("acme"), make_tenant("other")
    make_endpoint(acme, "http://127.0.0.1:9/a")
    make_endpoint(acme, "http://127.0.0.1:9/b")
    make_endpoint(other, "http://127.0.0.1:9/o")
    publish(acme, "x", {})
    publish(other, "x", {})
    first, second = Delivery.objects.filter(tenant=acme).order_by("endpoint_id")
    return first, second, Delivery.objects.get(tenant=other)


def test_the_tenant_box_narrows_to_one_tenant(staff_client, two_shops) -> None:
    first, second, _other = two_shops
    listed = staff_client.get(reverse("admin:delivery_delivery_changelist"), {"tenant_key": "acme"})
    assert listed_ids(listed) == {first.pk, second.pk}
    html = listed.content.decode()
    assert 'name="tenant_key" value="acme"' in html
    assert "<option" not in html.split('id="changelist-filter"')[1]  # no select of tenants


def test_the_endpoint_box_narrows_and_keeps_other_filters(staff_client, two_shops) -> None:
    first, second, _other = two_shops
    url = reverse("admin:delivery_delivery_changelist")
    assert listed_ids(staff_client.get(url, {"endpoint_id": second.endpoint_id})) == {second.pk}
    both = staff_client.get(url, {"endpoint_id": first.endpoint_id, "tenant_key": "other"})
    assert listed_ids(both) == set()
    # The tenant box keeps the endpoint as a hidden input when it is submitted.
    assert f'name="endpoint_id" value="{first.endpoint_id}"' in both.content.decode()


def test_the_boxes_work_with_the_admins_counts_shown(staff_client, two_shops) -> None:
    first, second, _other = two_shops
    listed = staff_client.get(
        reverse("admin:delivery_delivery_changelist"), {"tenant_key": "acme", "_facets": "1"}
    )
    assert listed_ids(listed) == {first.pk, second.pk}


def test_a_bad_endpoint_id_is_a_clear_message(staff_client, two_shops) -> None:
    response = staff_client.get(
        reverse("admin:delivery_delivery_changelist"), {"endpoint_id": "abc"}
    )
    assert listed_ids(response) == set()
    assert "is not an endpoint id" in response.content.decode()


# Payload search ------------------------------------------------------------------------


@pytest.fixture
def payloads() -> dict[str, Event]:
    acme, other = make_tenant("acme"), make_tenant("other")
    return {
        "acme-hit": publish(acme, "x", {"order_id": "A-1234"}).event,
        "acme-miss": publish(acme, "x", {"order_id": "A-9"}).event,
        "other-hit": publish(other, "x", {"order_id": "A-1234"}).event,
    }


def test_payload_search_finds_the_tenants_matching_events(staff_client, payloads) -> None:
    listed = staff_client.get(
        reverse("admin:webhooks_event_changelist"), {"payload": "A-1234", "tenant_key": "acme"}
    )
    assert listed_ids(listed) == {payloads["acme-hit"].pk}


def test_payload_search_in_a_time_range(staff_client, payloads) -> None:
    # As the "received" filter's "Today" link writes it.
    midnight = timezone.localtime().replace(hour=0, minute=0, second=0, microsecond=0)
    listed = staff_client.get(
        reverse("admin:webhooks_event_changelist"),
        {
            "payload": '"A-1234"',
            "received_at__gte": str(midnight),
            "received_at__lt": str(midnight + timedelta(days=1)),
        },
    )
    assert listed_ids(listed) == {payloads["acme-hit"].pk, payloads["other-hit"].pk}


def test_an_unbounded_payload_search_is_refused_with_a_message(staff_client, payloads) -> None:
    response = staff_client.get(reverse("admin:webhooks_event_changelist"), {"payload": "A-1234"})
    assert listed_ids(response) == set()
    assert "Payload search needs a tenant or a time range" in response.content.decode()


def test_payload_search_reads_only_the_newest_events(staff_client, payloads, monkeypatch) -> None:
    monkeypatch.setattr(admin_payload, "SCAN_LIMIT", 2)
    older = payloads["acme-hit"]
    Event.objects.filter(pk=older.pk).update(received_at=timezone.now() - timedelta(hours=1))
    publish(Event.objects.get(pk=older.pk).tenant, "x", {"n": 3})

    response = staff_client.get(
        reverse("admin:webhooks_event_changelist"), {"payload": "A-1234", "tenant_key": "acme"}
    )

    assert listed_ids(response) == set()  # the match is the third newest: not read
    assert "read only the newest 2 events" in response.content.decode()


def test_a_sent_again_delivery_names_its_attempt_counter_beside_every_attempt(
    staff_client,
) -> None:
    delivery = finished(Delivery.Status.DEAD)
    for number in range(1, 7):
        Attempt.objects.create(
            delivery=delivery, number=number, status_code=500, outcome=Attempt.Outcome.RETRY
        )
    resend([delivery])

    page = staff_client.get(page_url(delivery)).content.decode()

    assert "Attempts since last sent" in page
    assert page.count("attempt_set-") >= 6  # every attempt's inline row is listed

"""Operators' actions in the admin: pause/resume, re-enable, replay dead letters, secret checks."""

import pytest
from django.urls import reverse

from delivery.models import Delivery
from delivery.scheduler import get_scheduler
from ingest.publish import publish
from tenants.models import AuditEntry, EndpointSecret
from tests.factories import make_endpoint, make_tenant

pytestmark = pytest.mark.django_db(transaction=True)


def run_action(client, model: str, action: str, pks: list) -> None:
    url = reverse(f"admin:{model.replace('.', '_')}_changelist")
    response = client.post(url, {"action": action, "_selected_action": [str(pk) for pk in pks]})
    assert response.status_code == 302, response.content[:500]


def test_pause_and_resume_reach_the_scheduler(staff_client) -> None:
    tenant = make_tenant("acme")
    make_endpoint(tenant)
    publish(tenant, "x", {})
    run_action(staff_client, "tenants.tenant", "pause", [tenant.pk])
    tenant.refresh_from_db()
    assert not tenant.is_active
    scheduler = get_scheduler()
    assert scheduler.pick("w", 5).leases == []  # paused: its work waits
    run_action(staff_client, "tenants.tenant", "resume", [tenant.pk])
    assert len(scheduler.pick("w", 5).leases) == 1
    assert list(AuditEntry.objects.order_by("id").values_list("action", "tenant")) == [
        ("tenant.paused", tenant.pk),
        ("tenant.resumed", tenant.pk),
    ]


def test_replay_puts_dead_letters_back_in_the_lane(staff_client) -> None:
    tenant = make_tenant("acme")
    make_endpoint(tenant)
    publish(tenant, "x", {})
    scheduler = get_scheduler()
    [lease] = scheduler.pick("w", 1).leases
    scheduler.ack([lease])
    Delivery.objects.update(status=Delivery.Status.DEAD, attempts=8)
    run_action(staff_client, "delivery.delivery", "replay_dead_letters", [lease.delivery_id])
    delivery = Delivery.objects.get()
    assert (delivery.status, delivery.attempts, delivery.lane) == (
        Delivery.Status.PENDING,
        0,
        Delivery.Lane.FRESH,
    )
    assert [one.delivery_id for one in scheduler.pick("w", 1).leases] == [delivery.id]
    entry = AuditEntry.objects.get()
    assert (entry.action, entry.tenant, entry.detail) == (
        "dead_letters.replayed",
        tenant,
        {"count": 1},
    )


def test_reenable_action_releases_held_deliveries(staff_client) -> None:
    tenant = make_tenant("acme")
    endpoint = make_endpoint(tenant, enabled=False, disabled_reason="HTTP 410")
    publish(tenant, "x", {})
    assert Delivery.objects.get().status == Delivery.Status.HELD
    run_action(staff_client, "tenants.endpoint", "reenable_endpoints", [endpoint.pk])
    endpoint.refresh_from_db()
    assert endpoint.enabled and endpoint.disabled_reason == ""
    assert Delivery.objects.get().status == Delivery.Status.PENDING
    assert get_scheduler().snapshot().fresh_depth == 1


def test_endpoint_secret_must_be_a_standard_webhooks_secret(staff_client) -> None:
    from django.core.exceptions import ValidationError

    secret = EndpointSecret(endpoint=make_endpoint(None), secret="whsec_not base64!")
    with pytest.raises(ValidationError, match="Standard Webhooks"):
        secret.full_clean()


def test_rates_are_editable_and_reach_the_scheduler(staff_client) -> None:
    tenant = make_tenant("acme")
    endpoint = make_endpoint(tenant, "https://example.com/hook")
    url = reverse("admin:tenants_endpoint_change", args=[endpoint.pk])
    page = staff_client.get(url).content.decode()
    assert "rate_limit_per_second" in page
    endpoint.rate_limit_per_second = 5
    endpoint.save()
    publish(tenant, "x", {})
    scheduler = get_scheduler()
    assert len(scheduler.pick("w", 1).leases) == 1  # in flight: listed among the busiest endpoints
    [row] = scheduler.snapshot().endpoints
    assert (row.endpoint_id, row.rate_per_second) == (endpoint.pk, 5.0)

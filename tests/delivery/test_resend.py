"""Resending finished deliveries: back through the tenant's lane with the same webhook-id."""

import pytest
from django.utils import timezone

from delivery.models import Delivery
from delivery.replays.resend import replay, resend
from delivery.scheduler import get_scheduler
from ingest.publish import publish
from tests.factories import make_endpoint, make_tenant

pytestmark = pytest.mark.django_db(transaction=True)


def finished(status: str) -> Delivery:
    tenant = make_tenant(f"shop-{status}")
    make_endpoint(tenant)
    publish(tenant, "x", {})
    scheduler = get_scheduler()
    [lease] = scheduler.pick("w", 1).leases
    scheduler.ack([lease])
    Delivery.objects.filter(id=lease.delivery_id).update(
        status=status, attempts=3, delivered_at=timezone.now(), last_error="HTTP 500"
    )
    return Delivery.objects.get(id=lease.delivery_id)


@pytest.mark.parametrize("status", [Delivery.Status.DELIVERED, Delivery.Status.DEAD])
def test_resend_queues_a_finished_delivery_in_its_tenants_lane(status) -> None:
    delivery = finished(status)
    assert resend([delivery]) == 1
    delivery.refresh_from_db()
    assert (delivery.status, delivery.lane, delivery.attempts) == ("pending", "fresh", 0)
    assert delivery.delivered_at is None and delivery.last_error == ""
    [lease] = get_scheduler().pick("w", 1).leases
    assert lease.delivery_id == delivery.id


@pytest.mark.parametrize("status", [Delivery.Status.HELD, Delivery.Status.RETRY_SCHEDULED])
def test_resend_leaves_held_and_open_deliveries_alone(status) -> None:
    delivery = finished(status)
    assert resend([delivery]) == 0
    delivery.refresh_from_db()
    assert delivery.status == status
    assert get_scheduler().pick("w", 1).leases == []


def test_replay_takes_dead_letters_only() -> None:
    delivered, dead = finished(Delivery.Status.DELIVERED), finished(Delivery.Status.DEAD)
    assert replay([delivered, dead]) == 1
    assert Delivery.objects.get(id=delivered.id).status == Delivery.Status.DELIVERED
    assert Delivery.objects.get(id=dead.id).status == Delivery.Status.PENDING

"""sending.settle: a group's outcomes are recorded, then its leases released, retries in
one call and acks by outcome; one failing call does not keep the others from being made."""

import pytest
import redis
from django.utils import timezone

from delivery.models import Delivery
from delivery.pipeline import sending
from delivery.pipeline.transport import HttpResult
from delivery.scheduler import get_scheduler
from ingest.publish import publish_to_endpoint
from tests.factories import make_endpoint, make_tenant

pytestmark = pytest.mark.django_db(transaction=True)


def answer(status: int) -> HttpResult:
    return HttpResult(status, 5, "", "", "", None)


def finished_group(statuses: list[int]) -> list[sending.Finished]:
    """One delivery per status, each to an endpoint of its own, leased and answered."""
    tenant = make_tenant("acme")
    for _ in statuses:
        publish_to_endpoint(make_endpoint(tenant), "x", {})
    leases = sorted(
        get_scheduler().pick("w", len(statuses)).leases, key=lambda lease: lease.endpoint_id
    )
    assert len(leases) == len(statuses)
    return [
        sending.judged(
            lease,
            Delivery.objects.select_related("endpoint").get(pk=lease.delivery_id),
            answer(status),
            timezone.now(),
            {},
        )
        for lease, status in zip(leases, statuses, strict=True)
    ]


class RetriesDown:
    """The scheduler, but its retry call fails as a shard that went down would."""

    def __init__(self, scheduler) -> None:
        self.scheduler = scheduler
        self.acked: list[str] = []

    def retry_later_many(self, retries):
        raise redis.ConnectionError("shard down")

    def ack(self, leases, *, outcome):
        self.acked += [lease.delivery_id for lease in leases]
        return self.scheduler.ack(leases, outcome=outcome)


def test_a_groups_retries_go_in_one_call_and_its_acks_by_outcome():
    group = finished_group([503, 200, 503])
    scheduler = get_scheduler()

    statuses = sending.settle(group, scheduler)

    assert statuses == ["retry_scheduled", "delivered", "retry_scheduled"]
    snapshot = scheduler.snapshot()
    assert (snapshot.in_flight, snapshot.delayed_depth) == (0, 2)
    assert scheduler.counters() == {"delivered": 1, "retry": 2}


def test_a_failed_retry_call_still_lets_the_groups_acks_through():
    group = finished_group([503, 200])
    scheduler = RetriesDown(get_scheduler())

    with pytest.raises(redis.ConnectionError):
        sending.settle(group, scheduler)

    delivered = group[1].lease.delivery_id
    assert scheduler.acked == [delivered]
    # Recorded first: the rows say what happened; the retry's lease expires and comes back.
    assert Delivery.objects.get(pk=delivered).status == Delivery.Status.DELIVERED
    assert Delivery.objects.get(pk=group[0].lease.delivery_id).status == "retry_scheduled"
    assert get_scheduler().snapshot().in_flight == 1

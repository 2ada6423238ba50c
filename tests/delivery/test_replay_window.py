"""Window replays fed into the tenant's lane a chunk at a time by the maintenance sweep."""

from datetime import timedelta

import pytest
from django.utils import timezone

from core.ids import new_ulid
from delivery.models import Delivery
from delivery.replays import window as replay_window
from delivery.replays.window import Window
from delivery.scheduler import get_scheduler
from delivery.upkeep import maintenance
from ingest.publish import publish
from tests.factories import make_endpoint, make_tenant
from webhooks.models import Event

pytestmark = pytest.mark.django_db(transaction=True)

CHUNK = 200


@pytest.fixture(autouse=True)
def chunk_size(settings) -> None:
    settings.REPLAY_CHUNK_SIZE = CHUNK
    get_scheduler().start_epoch()  # a sweep without an epoch would rebuild instead


def finished_deliveries(tenant, endpoint, count, status=Delivery.Status.DEAD, *, at=None, kind="x"):
    """`count` finished deliveries made in bulk (as the worker leaves them: not in Redis)."""
    ms = int((at or timezone.now()).timestamp() * 1000)
    events = Event.objects.bulk_create(
        [Event(tenant=tenant, event_type=kind, payload=b"{}") for _ in range(count)]
    )
    return Delivery.objects.bulk_create(
        [
            Delivery(id=new_ulid(ms), event=e, endpoint=endpoint, tenant=tenant, status=status)
            for e in events
        ]
    )


def last_hour(**fields) -> Window:
    now = timezone.now()
    return Window(start=now - timedelta(hours=1), end=now + timedelta(minutes=1), **fields)


def drain(limit: int = 10_000) -> list[str]:
    """Act as a worker: pick everything queued, mark it delivered, ack; ids in pick order."""
    scheduler, order = get_scheduler(), []
    while len(order) < limit:
        leases = scheduler.pick("w", 50).leases
        if not leases:
            return order
        ids = [lease.delivery_id for lease in leases]
        Delivery.objects.filter(id__in=ids).update(
            status=Delivery.Status.DELIVERED, delivered_at=timezone.now()
        )
        scheduler.ack(leases)
        order += ids
    return order


def queued() -> int:
    return get_scheduler().snapshot().fresh_depth


@pytest.fixture
def shop():
    tenant = make_tenant("replay-shop.example")
    return tenant, make_endpoint(tenant, max_in_flight=1000)


def test_a_big_window_is_fed_a_chunk_at_a_time_between_fresh_events(shop) -> None:
    tenant, endpoint = shop
    window_ids = {d.id for d in finished_deliveries(tenant, endpoint, 1000)}
    job = replay_window.start(tenant, last_hour(), user=None, via="admin")
    assert (job.matched, job.matched_capped, job.state) == (1000, False, "running")

    picked: list[str] = []
    fresh: list[str] = []
    for round_ in range(5):
        maintenance.sweep()
        assert queued() == CHUNK  # one chunk in the lane, never more
        maintenance.sweep()  # the chunk is still open: nothing more is fed
        assert queued() == CHUNK
        # A fresh event arriving now waits behind this one chunk, not the whole window.
        publish(tenant, "fresh", {"n": round_})
        fresh.append(Delivery.objects.filter(event__event_type="fresh").latest("id").id)
        picked += drain()
        assert picked[-1] == fresh[-1]
    job.refresh_from_db()
    assert (job.fed, job.state, job.cursor) == (1000, "running", max(window_ids))
    maintenance.sweep()
    job.refresh_from_db()
    assert job.state == "finished" and job.finished_at is not None
    assert [i for i in picked if i in window_ids] == sorted(window_ids)
    assert set(picked) == window_ids | set(fresh)


def test_cancel_stops_feeding_but_the_open_chunk_goes_out(shop) -> None:
    tenant, endpoint = shop
    finished_deliveries(tenant, endpoint, 500)
    job = replay_window.start(tenant, last_hour(), user=None, via="admin")
    maintenance.sweep()
    assert replay_window.cancel(job, user=None, via="admin")
    assert job.state == "cancelled" and not replay_window.cancel(job, user=None, via="admin")
    assert len(drain()) == CHUNK  # what was in the lane still goes out
    maintenance.sweep()
    assert queued() == 0
    job.refresh_from_db()
    assert job.fed == CHUNK
    assert Delivery.objects.filter(status=Delivery.Status.DEAD).count() == 500 - CHUNK


def test_only_the_tenants_finished_deliveries_in_the_window_are_sent(shop) -> None:
    tenant, endpoint = shop
    other = make_tenant("other-shop.example")
    other_endpoint = make_endpoint(other, max_in_flight=1000)
    second = make_endpoint(tenant, "http://127.0.0.1:9/second", max_in_flight=1000)
    wanted = finished_deliveries(tenant, endpoint, 3, kind="orders/create")
    finished_deliveries(tenant, endpoint, 2, Delivery.Status.DELIVERED, kind="orders/create")
    finished_deliveries(tenant, endpoint, 2, kind="refunds/create")  # another event type
    finished_deliveries(tenant, second, 2, kind="orders/create")  # another endpoint
    yesterday = timezone.now() - timedelta(days=1)
    finished_deliveries(tenant, endpoint, 2, at=yesterday, kind="orders/create")  # before
    finished_deliveries(other, other_endpoint, 4, kind="orders/create")  # another tenant
    open_ones = [
        *finished_deliveries(tenant, endpoint, 1, Delivery.Status.PENDING, kind="orders/create"),
        *finished_deliveries(tenant, endpoint, 1, "retry_scheduled", kind="orders/create"),
        *finished_deliveries(tenant, endpoint, 1, Delivery.Status.HELD, kind="orders/create"),
    ]
    window = last_hour(statuses=("dead",), endpoint_id=endpoint.pk, event_type="orders/create")
    assert replay_window.count_bounded(tenant, window) == (3, False)
    # Even asked for, open and held deliveries never match.
    everything = last_hour(statuses=("dead", "delivered", "pending", "held", "retry_scheduled"))
    assert (
        not replay_window.deliveries_in(tenant, everything)
        .filter(id__in=[d.id for d in open_ones])
        .exists()
    )
    job = replay_window.start(tenant, window, user=None, via="admin")
    maintenance.sweep()
    assert sorted(drain()) == sorted(d.id for d in wanted)
    assert Delivery.objects.filter(tenant=other, status="dead").count() == 4
    assert {d.status for d in Delivery.objects.filter(id__in=[d.id for d in open_ones])} == {
        "pending",
        "retry_scheduled",
        "held",
    }
    maintenance.sweep()
    job.refresh_from_db()
    assert (job.fed, job.state) == (3, "finished")


def test_a_count_past_its_limit_says_more_than(shop, settings) -> None:
    tenant, endpoint = shop
    settings.REPLAY_COUNT_LIMIT = 5
    finished_deliveries(tenant, endpoint, 8)
    job = replay_window.start(tenant, last_hour(), user=None, via="admin")
    assert (job.matched, job.matched_capped, job.matched_text) == (5, True, "more than 5")


def test_deliveries_made_in_the_millisecond_the_replay_starts_are_in_it(shop) -> None:
    tenant, endpoint = shop
    finished_deliveries(tenant, endpoint, 3, at=timezone.now())
    job = replay_window.start(tenant, last_hour(), user=None, via="admin")
    assert job.matched == 3  # the end is exclusive to the millisecond: this one's included


def test_a_tenant_feeds_one_job_at_a_time(shop) -> None:
    tenant, endpoint = shop
    finished_deliveries(tenant, endpoint, 300)
    first = replay_window.start(tenant, last_hour(), user=None, via="admin")
    second = replay_window.start(tenant, last_hour(), user=None, via="admin")
    maintenance.sweep()
    assert queued() == CHUNK
    first.refresh_from_db(), second.refresh_from_db()
    assert (first.fed, second.fed) == (CHUNK, 0)


def test_a_retrying_chunk_delivery_holds_the_next_chunk(shop) -> None:
    tenant, endpoint = shop
    finished_deliveries(tenant, endpoint, 250)
    job = replay_window.start(tenant, last_hour(), user=None, via="admin")
    maintenance.sweep()
    drain()
    job.refresh_from_db()
    Delivery.objects.filter(id=job.last_chunk[0]).update(status="retry_scheduled")
    maintenance.sweep()
    job.refresh_from_db()
    assert job.fed == CHUNK
    Delivery.objects.filter(id=job.last_chunk[0]).update(status="delivered")
    maintenance.sweep()
    job.refresh_from_db()
    assert job.fed == 250

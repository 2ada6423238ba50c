"""A keyed event outside a transaction on partitioned PostgreSQL: the lock, the look-up
across days and the write are ONE statement (webhooks_key_guard, webhooks migration 0007).
A repeat stored days ago is still caught, and so is one a concurrent request commits
while this one waits for the key's lock."""

import threading
from datetime import timedelta

import pytest
from django.db import IntegrityError, connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from core.ids import new_ulid
from ingest import idempotency
from ingest.accept import accept
from tests.factories import event_days_ago, make_endpoint, make_tenant, published_fields
from webhooks.models import Event

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's partitions"),
]


def test_a_new_key_is_checked_and_written_in_one_statement() -> None:
    tenant = make_tenant()
    make_endpoint(tenant)
    assert idempotency.spans_partitions()
    idempotency.own_partition(new_ulid())  # the partitions' bounds, read once per process
    with CaptureQueriesContext(connection) as queries:
        first = accept(**published_fields(tenant, "k-1"))
    assert first.created
    # The tenant's endpoints (accept looks them up), then the one statement: no BEGIN,
    # lock, look-up or COMMIT of their own.
    _endpoints, statement = [q["sql"] for q in queries.captured_queries]
    assert "webhooks_key_guard" in statement and statement.startswith("WITH"), statement
    assert first.event.deliveries.count() == 1


def test_a_key_stored_days_ago_rolls_the_statement_back_and_answers_the_first() -> None:
    tenant = make_tenant()
    make_endpoint(tenant)
    earlier = event_days_ago(tenant, "k-1", days=3)
    again = accept(**published_fields(tenant, "k-1"))
    assert (again.created, again.event.pk) == (False, earlier.pk)
    assert Event.objects.filter(idempotency_key="k-1").count() == 1
    assert not tenant.deliveries.exists()  # the statement's delivery went with its event


def test_a_repeat_committed_while_waiting_for_the_lock_is_seen() -> None:
    """Another request holds the key's lock with its event (yesterday's id: another day's
    partition, so no unique index can catch it) not yet committed. Ours waits for the
    lock, and its look-up, taken after the lock, sees that event once committed."""
    tenant = make_tenant()
    make_endpoint(tenant)
    identity = ("tenant", tenant.pk, "k-race")
    holding, answered = threading.Event(), []

    def other_request() -> None:
        try:
            with transaction.atomic():
                idempotency.lock([identity])
                event_days_ago(tenant, "k-race", days=1)
                holding.set()
                # Ours is now blocked on the lock; commit only once it waits.
                deadline = timezone.now() + timedelta(seconds=20)
                while not _someone_waits_for_a_lock() and timezone.now() < deadline:
                    threading.Event().wait(0.02)
        finally:
            connection.close()

    other = threading.Thread(target=other_request)
    other.start()
    assert holding.wait(20)
    answered.append(accept(**published_fields(tenant, "k-race")))
    other.join(20)
    (ours,) = answered
    assert not ours.created
    assert Event.objects.filter(idempotency_key="k-race").count() == 1


def _someone_waits_for_a_lock() -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted")
        return cursor.fetchone()[0] > 0


def _scans_of(partition: str) -> int:
    """Index and sequential scans of `partition` in this transaction so far."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT coalesce(sum(coalesce(idx_scan, 0) + seq_scan), 0)"
            " FROM pg_stat_xact_user_tables WHERE relname = %s",
            [partition],
        )
        return cursor.fetchone()[0]


def _call_guard(identity: tuple, own_id: str) -> None:
    call, params = idempotency.guard(identity, own_id)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {call}", params)


def test_the_guard_never_reads_its_own_day() -> None:
    """The day's partition has its own unique index on the key; the guard looks at the
    other days only. Reading the day made each event cost a scan of the day so far when
    PostgreSQL's cached plan for a new day probed it by tenant, the key a filter."""
    tenant = make_tenant()
    make_endpoint(tenant)
    for number in range(20):
        accept(**published_fields(tenant, f"today-{number}"))
    earlier = event_days_ago(tenant, "old-key", days=3)
    today = idempotency.own_partition(new_ulid())
    assert today is not None
    with transaction.atomic():
        with connection.cursor() as cursor:
            # The plan a connection keeps after its first calls, taken at once.
            cursor.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        for number in range(8):
            _call_guard(("tenant", tenant.pk, f"new-{number}"), new_ulid())
        assert _scans_of(today.name) == 0
        with pytest.raises(IntegrityError):  # another day is still looked at
            _call_guard(("tenant", tenant.pk, "old-key"), new_ulid())
    assert Event.objects.filter(idempotency_key="old-key").get() == earlier


def test_a_repeat_of_the_same_day_is_caught_by_the_days_own_index() -> None:
    tenant = make_tenant()
    make_endpoint(tenant)
    first = accept(**published_fields(tenant, "k-today"))
    again = accept(**published_fields(tenant, "k-today"))
    assert (again.created, again.event.pk) == (False, first.event.pk)
    assert tenant.deliveries.count() == 1


def test_an_event_without_a_day_partition_is_checked_everywhere() -> None:
    """An id no ranged partition holds goes to the default partition, whose rows are of
    any day: nothing is skipped then, and today's event with the key is found."""
    tenant = make_tenant()
    make_endpoint(tenant)
    accept(**published_fields(tenant, "k-1"))
    far_ahead = timezone.now() + timedelta(days=400)
    own_id = new_ulid(int(far_ahead.timestamp() * 1000))
    assert idempotency.own_partition(own_id) is None
    with pytest.raises(IntegrityError), transaction.atomic():
        _call_guard(("tenant", tenant.pk, "k-1"), own_id)

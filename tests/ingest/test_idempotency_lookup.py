"""ingest.idempotency.stored_ids on PostgreSQL: a published event's key stored on another
day is still a repeat (answered with that event, its tenant loaded), and a batch's
look-up probes the unique index pair by pair, however many events the day holds and
whatever the statistics say (they lag behind a flood; here no ANALYZE has run)."""

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from core import plain_insert, plain_instances
from core.ids import new_ulid
from delivery.upkeep import partitions
from ingest import idempotency
from ingest.accept import accept, accept_many
from tests.factories import event_days_ago, make_endpoint, make_tenant, published_fields
from webhooks.models import Event

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's partitions"),
]


def test_a_published_key_stored_days_ago_is_a_repeat_with_its_tenant(
    django_assert_num_queries,
) -> None:
    tenant = make_tenant()
    make_endpoint(tenant)
    first = event_days_ago(tenant, "k-1", days=3)
    batch = accept_many([published_fields(tenant, "k-1"), published_fields(tenant, "k-2")])
    assert [(one.created, one.event.pk == first.pk) for one in batch] == [
        (False, True),
        (True, False),
    ]
    with django_assert_num_queries(0):
        assert batch[0].event.tenant.key == tenant.key
    assert Event.objects.filter(idempotency_key="k-1").count() == 1


def test_a_batch_look_up_probes_the_key_index_pair_by_pair() -> None:
    tenants = [make_tenant(f"shop-{n}.example") for n in range(3)]
    stored = [
        plain_instances.new(Event, _fields(tenants[n % 3], f"old-{n}"), {"tenant": tenants[n % 3]})
        for n in range(20000)
    ]
    plain_insert.execute([plain_insert.prepare(stored)])
    identities = {("tenant", tenants[n % 3].pk, f"new-{n}") for n in range(500)}
    identities.add(("tenant", tenants[1].pk, "old-1"))
    with CaptureQueriesContext(connection) as queries:
        found = idempotency.stored_ids(identities)
    assert found == {("tenant", tenants[1].pk, "old-1"): stored[1].pk}
    (query,) = queries.captured_queries
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN {query['sql']}")
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "Seq Scan on webhooks_event" not in plan and "Hash" not in plan, plan
    assert "Index Cond: ((tenant_id = k.scope) AND ((idempotency_key)::text = k.key))" in plan, plan
    # The days ahead hold no event yet: left out when planning, not probed.
    in_three_days = timezone.now().date() + timedelta(days=3)
    assert f"webhooks_event_p{in_three_days:%Y%m%d}" in _partitions(), _partitions()
    assert f"webhooks_event_p{in_three_days:%Y%m%d}" not in plan, plan
    assert f"webhooks_event_p{timezone.now().date():%Y%m%d}" in plan, plan


def _partitions() -> list[str]:
    return [one.name for one in partitions.partitions(partitions.EVENT)]


def _fields(tenant, key: str) -> dict:
    return {"event_type": "order.created", "payload": b"{}", "idempotency_key": key}


def test_a_keyed_event_is_written_without_a_savepoint_of_its_own() -> None:
    """Its lock, look-up and write share `_store`'s transaction (here a savepoint: the
    test runs in one); the write adds no SAVEPOINT and RELEASE of its own."""
    tenant = make_tenant()
    make_endpoint(tenant)
    with CaptureQueriesContext(connection) as queries:
        first = accept(**published_fields(tenant, "k-1"))
        again = accept(**published_fields(tenant, "k-1"))
    assert (first.created, again.created, again.event.pk) == (True, False, first.event.pk)
    savepoints = [q["sql"] for q in queries.captured_queries if q["sql"].startswith("SAVEPOINT")]
    assert len(savepoints) == 2, savepoints  # one per accept: _store's own atomic
    assert Event.objects.filter(idempotency_key="k-1").count() == 1


def test_a_look_up_that_skips_its_own_day_leaves_that_partition_out() -> None:
    """A batch's second look, under its keys' locks, skips the partition its rows go to
    (their unique indexes guard it): that day is never planned, other days still are."""
    tenant = make_tenant()
    earlier = event_days_ago(tenant, "old", days=3)
    today = idempotency.own_partition(new_ulid())
    identities = {("tenant", tenant.pk, "old"), ("tenant", tenant.pk, "new")}
    with CaptureQueriesContext(connection) as queries:
        found = idempotency.stored_ids(identities, skip=today)
    assert found == {("tenant", tenant.pk, "old"): earlier.pk}
    (query,) = queries.captured_queries
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN {query['sql']}")
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert today.name not in plan, plan
    with connection.cursor() as cursor:  # the other day's partition is still looked in
        cursor.execute(
            "SELECT tableoid::regclass::text FROM webhooks_event WHERE id = %s", [earlier.pk]
        )
        assert cursor.fetchone()[0] in plan, plan


def test_a_batch_repeating_a_key_stored_today_answers_with_that_event() -> None:
    tenant = make_tenant()
    make_endpoint(tenant)
    (first,) = accept_many([published_fields(tenant, "k-today")])
    again = accept_many([published_fields(tenant, "k-today"), published_fields(tenant, "k-2")])
    assert [(one.created, one.event.pk == first.event.pk) for one in again] == [
        (False, True),
        (True, False),
    ]

"""Time partitions on PostgreSQL (delivery.upkeep.partitions): the layout the migration leaves,
deliveries and attempts in their event's day, idempotency across days, dropping an
expired day with what must stay put back, rows stranded in the default partition.

PostgreSQL's DDL is transactional: every test's detaches, drops and creations are rolled
back with the test's transaction. On SQLite only the first test runs (nothing is
partitioned there, and the batched pruning of test_retention does the work).
"""

import itertools
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.utils import timezone

from core.ids import new_ulid, ulid_time_ms
from delivery.models import Attempt, Delivery
from delivery.upkeep import partitions, retention
from ingest.accept import accept, accept_many
from tests.delivery.test_retention import old_event
from tests.factories import make_endpoint, make_source, make_tenant
from webhooks.models import Event

pytestmark = pytest.mark.django_db
postgresql_only = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="time partitions are PostgreSQL's"
)

S = Delivery.Status


def test_sqlite_has_no_partitions() -> None:
    assert partitions.in_use() is (connection.vendor == "postgresql")


def _where(model, pk) -> str:
    """The partition a row lives in."""
    table = connection.ops.quote_name(model._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT tableoid::regclass::text FROM {table} WHERE id = %s", [pk])  # noqa: S608
        return cursor.fetchone()[0]


@pytest.fixture
def hook():
    return make_endpoint(make_tenant())


@postgresql_only
def test_the_migration_leaves_legacy_days_ahead_and_default_partitions(settings) -> None:
    today = datetime.now(UTC).date()
    layouts = {}
    for table in partitions.TABLES:
        found = partitions.partitions(table)
        names = [p.name for p in found]
        assert names[0] == f"{table.name}_legacy" and found[0].lower is None
        assert names[-1] == f"{table.name}_default" and found[-1].is_default
        assert f"{table.name}_p{today:%Y%m%d}" in names
        ahead = today + timedelta(days=settings.PARTITION_DAYS_AHEAD)
        assert f"{table.name}_p{ahead:%Y%m%d}" in names
        # Contiguous: each range starts where the one before it ends.
        ranged = found[:-1]
        assert all(a.upper == b.lower for a, b in itertools.pairwise(ranged))
        layouts[table] = [(p.lower, p.upper) for p in found]
    assert layouts[partitions.EVENT] == layouts[partitions.DELIVERY] == layouts[partitions.ATTEMPT]


@postgresql_only
def test_every_event_partition_keeps_idempotency_keys_unique() -> None:
    """The same two rules as the model's constraints, on every partition."""
    rules = {(c.fields[0] + "_id", c.fields[1]) for c in Event._meta.constraints if c.fields}
    assert rules == {("source_id", "idempotency_key"), ("tenant_id", "idempotency_key")}
    for partition in partitions.partitions(partitions.EVENT):
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_get_indexdef(indexrelid) FROM pg_index "
                "WHERE indrelid = to_regclass(%s) AND indisunique AND NOT indisprimary",
                [partition.name],
            )
            definitions = [row[0] for row in cursor.fetchall()]
        for columns in rules:
            assert any(f"({', '.join(columns)})" in d for d in definitions), (
                partition.name,
                definitions,
            )


@postgresql_only
def test_deliveries_and_attempts_live_in_their_events_day(hook) -> None:
    accepted = accept(
        source=None,
        tenant=hook.tenant,
        event_type="orders/paid",
        headers={},
        content_type="application/json",
        payload=b"{}",
        idempotency_key=None,
    )
    delivery = Delivery.objects.get(event=accepted.event)
    assert ulid_time_ms(delivery.id) == ulid_time_ms(accepted.event.id)
    day = _where(Event, accepted.event.id).removeprefix("webhooks_event")
    assert _where(Delivery, delivery.id) == "delivery_delivery" + day
    attempt = Attempt.objects.create(delivery=delivery, number=1, outcome="delivered")
    assert _where(Attempt, attempt.id) == "delivery_attempt" + day


@postgresql_only
def test_a_key_stored_on_another_day_is_still_a_repeat(hook) -> None:
    """The first copy is in the legacy partition (made days ago), the retry lands today:
    no unique index spans both, the look-up under the advisory lock catches it."""
    source = make_source()
    made = timezone.now() - timedelta(days=3)
    first = Event.objects.create(
        id=new_ulid(int(made.timestamp() * 1000)),
        source=source,
        tenant=hook.tenant,
        payload=b"{}",
        idempotency_key="wh-1",
        received_at=made,
    )
    fields = {
        "source": source,
        "tenant": hook.tenant,
        "event_type": "orders/paid",
        "headers": {},
        "content_type": "application/json",
        "payload": b"{}",
        "idempotency_key": "wh-1",
    }
    again = accept(**fields)
    assert (again.created, again.event.pk) == (False, first.pk)
    batch = accept_many([fields, {**fields, "idempotency_key": "wh-2"}])
    assert [(a.created, a.event.pk == first.pk) for a in batch] == [(False, True), (True, False)]
    assert Event.objects.filter(idempotency_key="wh-1").count() == 1


@postgresql_only
def test_an_expired_day_is_dropped_and_what_must_stay_is_put_back(hook) -> None:
    """Today's partitions, seen 31 days from now: delivered history goes with its day;
    pending and held work, a dead letter (kept 90 days) and a delivery delivered late
    stay, with their events and attempts, in the default partitions."""
    done = old_event(hook, 0, (S.DELIVERED,), attempts=2)
    lonely = Event.objects.create(id=new_ulid(), tenant=hook.tenant, payload=b"{}")
    waiting = old_event(hook, 0, (S.PENDING, S.DELIVERED), attempts=1)
    held = old_event(hook, 0, (S.HELD,), attempts=0)
    dead = old_event(hook, 0, (S.DEAD,), attempts=3)
    late = old_event(hook, 0, (S.DELIVERED,), attempts=1)
    later = timezone.now() + timedelta(days=31)
    late.deliveries.update(delivered_at=later - timedelta(days=2))

    result = retention.prune(now=later, until_done=True)

    assert result.counts["partition_days"] >= 1
    assert not Event.objects.filter(pk__in=[done.pk, lonely.pk]).exists()
    assert not Delivery.objects.filter(event=done).exists()
    kept = {waiting.pk, held.pk, dead.pk, late.pk}
    assert set(Event.objects.values_list("pk", flat=True)) == kept
    for event in Event.objects.all():
        assert _where(Event, event.pk) == "webhooks_event_default"
    statuses = sorted(Delivery.objects.values_list("status", flat=True))
    assert statuses == sorted([S.PENDING, S.HELD, S.DEAD, S.DELIVERED])
    # The delivered sibling of the pending one went by its own age.
    assert not Delivery.objects.filter(event=waiting, status=S.DELIVERED).exists()
    assert Attempt.objects.filter(delivery__event=dead).count() == 3
    assert Attempt.objects.filter(delivery__event=late).count() == 1
    assert Attempt.objects.filter(delivery__event=done).count() == 0
    today = datetime.now(UTC).date()
    names = [p.name for p in partitions.partitions(partitions.DELIVERY)]
    assert f"delivery_delivery_p{today:%Y%m%d}" not in names


@postgresql_only
def test_a_day_made_late_takes_its_rows_from_the_default_partition(hook, settings) -> None:
    """Rows of a day nobody made a partition for wait in the default one; making the day
    moves them in (PostgreSQL would refuse the partition otherwise)."""
    last = partitions.partitions(partitions.EVENT)[-2]
    beyond = datetime.fromtimestamp(ulid_time_ms(last.upper) / 1000, UTC) + timedelta(hours=30)
    event = old_event(hook, -(beyond - timezone.now()).total_seconds() / 86400, (S.PENDING,))
    delivery = event.deliveries.get()
    attempt = Attempt.objects.create(delivery=delivery, number=1, outcome="retry")
    assert _where(Event, event.pk) == "webhooks_event_default"

    made = partitions.ensure_ahead(today=beyond.date(), days_ahead=0)

    assert made >= 2
    day = f"_p{beyond.date():%Y%m%d}"
    assert _where(Event, event.pk) == "webhooks_event" + day
    assert _where(Delivery, delivery.pk) == "delivery_delivery" + day
    assert _where(Attempt, attempt.pk) == "delivery_attempt" + day
    assert Delivery.objects.get(pk=delivery.pk).status == S.PENDING


@postgresql_only
def test_the_sweep_makes_the_days_ahead(settings, monkeypatch) -> None:
    """The newest day is dropped (as if the sweep had been down a day); the next sweep
    makes it again, once: the upkeep looks at most once a minute."""
    from delivery.upkeep import maintenance

    newest = partitions.partitions(partitions.EVENT)[-2]
    with connection.cursor() as cursor:
        for table in partitions.TABLES:
            name = newest.name.replace(partitions.EVENT.name, table.name)
            cursor.execute(f'DROP TABLE "{name}"')
    monkeypatch.setattr(partitions, "_last_maintained", 0.0)

    assert maintenance.sweep()["partition_days_made"] == 1
    assert "partition_days_made" not in maintenance.sweep()  # not again within the minute
    assert partitions.partitions(partitions.EVENT)[-2] == newest

"""delivery.upkeep.partition_statistics: the sweep analyzes a day's partition that filled since
it was last analyzed, when autovacuum has not (it is off on these machines), so the
planner probes the day through the index that fits the query."""

import pytest
from django.db import connection

from core import plain_insert, plain_instances
from core.ids import new_ulid
from delivery.upkeep import partition_statistics, partitions
from ingest import idempotency
from tests.factories import make_tenant
from tests.waiting import wait_until
from webhooks.models import Event

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's partitions"),
]


def _stats_flushed() -> None:
    """The backend's counts reach pg_stat_user_tables on its next report, not at commit."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")


def _last_analyzed(partition: str):
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT greatest(last_analyze, last_autoanalyze) FROM pg_stat_user_tables"
            " WHERE relid = to_regclass(%s)",
            [partition],
        )
        return cursor.fetchone()[0]


def test_the_sweep_analyzes_a_day_that_filled_and_then_leaves_it(monkeypatch) -> None:
    from delivery.upkeep import maintenance

    tenant = make_tenant()
    today = idempotency.own_partition(new_ulid())
    assert today is not None
    events = [
        plain_instances.new(
            Event,
            {"event_type": "x", "payload": b"{}", "idempotency_key": f"k-{n}"},
            {"tenant": tenant},
        )
        for n in range(600)
    ]
    plain_insert.execute([plain_insert.prepare(events)])
    _stats_flushed()
    parents = [table.name for table in partitions.TABLES]
    assert wait_until(lambda: today.name in partition_statistics.stale_partitions(parents, 50))
    before = _last_analyzed(today.name)

    monkeypatch.setattr(partitions, "_last_maintained", 0.0)
    assert maintenance.sweep()["partitions_analyzed"] >= 1

    assert _last_analyzed(today.name) not in (None, before)
    _stats_flushed()
    assert today.name not in partition_statistics.stale_partitions(parents, 50)
    with connection.cursor() as cursor:
        cursor.execute("SELECT reltuples FROM pg_class WHERE oid = to_regclass(%s)", [today.name])
        assert cursor.fetchone()[0] >= 600  # what the planner now knows of the day


def test_nothing_is_analyzed_when_the_statistics_are_fresh() -> None:
    parents = [table.name for table in partitions.TABLES]
    for name in partition_statistics.stale_partitions(parents, 100):
        with connection.cursor() as cursor:
            cursor.execute(f"ANALYZE {name}")
    _stats_flushed()
    assert wait_until(lambda: not partition_statistics.stale_partitions(parents, 100))
    assert partition_statistics.analyze_stale(parents) == []

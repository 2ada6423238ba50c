"""Recording a group of attempts: only open rows change, and on PostgreSQL the rows are
found by primary key whatever the table statistics say."""

import re
from datetime import UTC, datetime

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from delivery.models import Attempt, Delivery
from delivery.pipeline import records
from delivery.pipeline.loading import load_many
from delivery.pipeline.policy import Action, Decision
from delivery.pipeline.transport import HttpResult
from tests.factories import make_backlog
from tests.pg_plans import in_parent_names

pytestmark = pytest.mark.django_db

OK = HttpResult(200, 5, "", "", "ok", None)
UNAVAILABLE = HttpResult(503, 5, "", "", "busy", None)
STARTED = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


def _sent(delivery: Delivery, result: HttpResult, decision: Decision) -> records.Sent:
    return records.Sent(delivery, result, decision, STARTED, {"webhook-id": delivery.pk})


def test_a_late_outcome_leaves_a_closed_delivery_alone() -> None:
    delivered, dead, pending = make_backlog(3)
    Delivery.objects.filter(pk=dead.pk).update(status=Delivery.Status.DEAD)
    loaded = load_many([delivered.pk, dead.pk, pending.pk])
    records.record_many(
        [_sent(loaded[delivered.pk], OK, Decision(Action.DELIVERED, 0.0, "", False))]
    )

    retry = Decision(Action.RETRY, 30.0, "HTTP 503", True)
    late = [_sent(loaded[pk], UNAVAILABLE, retry) for pk in (delivered.pk, dead.pk, pending.pk)]
    records.record_many(late)  # stale copies: each was loaded while still pending

    rows = {d.pk: d for d in Delivery.objects.all()}
    assert rows[delivered.pk].status == Delivery.Status.DELIVERED
    assert rows[delivered.pk].attempts == 1
    assert rows[dead.pk].status == Delivery.Status.DEAD
    assert rows[pending.pk].status == Delivery.Status.RETRY_SCHEDULED
    assert rows[pending.pk].attempts == 1
    assert Attempt.objects.count() == 4  # every request is on record, late or not


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's planner")
def test_recording_finds_rows_by_primary_key_only_with_stale_statistics() -> None:
    """With "status IN (open)" and no statistics on a fresh backlog, PostgreSQL combined
    the primary key with the status index, reading every open row's index entry for each
    group recorded (half the delivery throughput in bench/delivery.py)."""
    backlog = make_backlog(3000)
    loaded = load_many([d.pk for d in backlog[:8]])
    group = [_sent(d, OK, Decision(Action.DELIVERED, 0.0, "", False)) for d in loaded.values()]
    group[-1] = _sent(
        group[-1].delivery, UNAVAILABLE, Decision(Action.RETRY, 30.0, "HTTP 503", True)
    )
    with CaptureQueriesContext(connection) as captured:
        records.record_many(group)
    updates = [q["sql"] for q in captured.captured_queries if q["sql"].startswith("UPDATE")]
    delivery_updates = [sql for sql in updates if Delivery._meta.db_table in sql.split()[1]]
    assert len(delivery_updates) == 2  # the delivered rows at once, then the retry

    table = connection.ops.quote_name(Delivery._meta.db_table)
    with connection.cursor() as cursor:
        for sql in delivery_updates:
            cursor.execute(f"EXPLAIN {sql}")
            plan = in_parent_names("\n".join(line for (line,) in cursor.fetchall()))
            used = {word for word in plan.split() if word.startswith("delivery_")}
            # A partition's alias in the plan ("delivery_delivery_1") names no index.
            used = {word for word in used if not re.fullmatch(r"delivery_delivery_\d+", word)}
            assert used <= {"delivery_delivery", "delivery_delivery_pkey", table}, plan

"""Event carries no index that its others already serve (webhooks migration 0005): each
one is written by every accepted event. What those two served must still find an index
on PostgreSQL, whose planner decides (the admin's and the message log's own checks are in
tests/project/test_admin_big_tables.py and tests/dashboards/test_message_log.py)."""

import pytest
from django.db import connection
from django.db.models.deletion import ProtectedError
from django.test.utils import CaptureQueriesContext

from tests.factories import make_tenant
from tests.pg_plans import assert_no_scan_of_history
from webhooks.models import Event

pytestmark = pytest.mark.django_db
on_postgresql = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="PostgreSQL's indexes and planner"
)


def _event_indexes() -> dict[str, str]:
    """The event table's own indexes (a partitioned parent's: each partition copies them)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname, pg_get_indexdef(i.indexrelid) FROM pg_index i "
            "JOIN pg_class c ON c.oid = i.indexrelid WHERE i.indrelid = to_regclass(%s)",
            [Event._meta.db_table],
        )
        return dict(cursor.fetchall())


@on_postgresql
def test_no_like_copy_of_the_id_and_no_index_on_tenant_alone() -> None:
    definitions = _event_indexes()
    assert not [d for d in definitions.values() if "varchar_pattern_ops" in d], definitions
    assert not [d for d in definitions.values() if d.endswith("(tenant_id)")], definitions
    # The composites that serve the tenant's look-ups are there.
    assert {"event_tenant_recent_idx", "event_tenant_type_idx"} <= set(definitions)


@on_postgresql
def test_look_ups_by_tenant_and_by_id_still_use_an_index() -> None:
    tenant = make_tenant()
    event = Event.objects.create(tenant=tenant, event_type="order.created", payload=b"{}")
    with CaptureQueriesContext(connection) as queries:
        list(Event.objects.filter(tenant=tenant).order_by().only("pk"))
        list(Event.objects.filter(tenant__isnull=True).order_by().only("pk"))
        list(Event.objects.filter(pk=event.pk))
    assert_no_scan_of_history(queries.captured_queries, "events by tenant or id")


def test_a_tenant_with_events_is_still_protected() -> None:
    # PROTECT's check looks the tenant's events up by tenant_id (no index of its own).
    tenant = make_tenant()
    Event.objects.create(tenant=tenant, event_type="order.created", payload=b"{}")
    with pytest.raises(ProtectedError):
        tenant.delete()

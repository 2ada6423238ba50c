"""The status indexes hold only unfinished deliveries (delivery.models.UNFINISHED): the
queries that filter by status must still be able to use them on PostgreSQL, whose
planner has to prove a query's condition implies the index's."""

import pytest
from django.db import connection

from delivery.models import Delivery
from tests.factories import make_backlog
from tests.pg_plans import in_parent_names

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's planner"),
]


STATUS_INDEXES = (
    "delivery_tenant_status_idx",
    "delivery_endpoint_status_idx",
    "delivery_status_due_idx",
)


@pytest.fixture
def history() -> list[Delivery]:
    """Mostly delivered, ten of every other status, with fresh statistics."""
    backlog = make_backlog(3000)
    Delivery.objects.update(status=Delivery.Status.DELIVERED)
    others = [
        Delivery.Status.HELD,
        Delivery.Status.DEAD,
        Delivery.Status.PENDING,
        Delivery.Status.RETRY_SCHEDULED,
    ]
    for index, status in enumerate(others):
        ids = [d.pk for d in backlog[index * 10 : index * 10 + 10]]
        Delivery.objects.filter(pk__in=ids).update(status=status)
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {connection.ops.quote_name(Delivery._meta.db_table)}")
    return backlog


def test_the_status_indexes_leave_delivered_rows_out() -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexname, indexdef FROM pg_indexes WHERE indexname = ANY(%s)",
            [list(STATUS_INDEXES)],
        )
        definitions = dict(cursor.fetchall())
    assert set(definitions) == set(STATUS_INDEXES)
    for definition in definitions.values():
        assert definition.endswith("WHERE (NOT ((status)::text = 'delivered'::text))"), definition


def test_status_queries_use_the_unfinished_indexes(history) -> None:
    delivery = history[0]
    plans = {  # the admin's and dashboards' kinds of query
        "delivery_tenant_status_idx": Delivery.objects.filter(
            status=Delivery.Status.DEAD, tenant_id__in=[delivery.tenant_id]
        ).only("pk"),
        "delivery_endpoint_status_idx": Delivery.objects.filter(
            endpoint_id=delivery.endpoint_id, status=Delivery.Status.HELD
        ).only("pk"),
        "delivery_status_due_idx": Delivery.objects.filter(status=Delivery.Status.DEAD).only("pk"),
    }
    for index, queryset in plans.items():
        plan = in_parent_names(queryset.order_by().explain())
        assert index in plan, (index, plan)

"""core.plain_select: the instances raw() would give (converted values, extra columns as
attributes), whatever order the columns come in; run on SQLite and PostgreSQL alike."""

from datetime import UTC, datetime

import pytest
from django.db import connection
from django.forms.models import model_to_dict

from core import plain_select
from tenants.models import Endpoint
from tests.factories import make_endpoint, make_tenant

pytestmark = pytest.mark.django_db


def _all_values(instance) -> dict:
    return {
        field.attname: getattr(instance, field.attname)
        for field in type(instance)._meta.concrete_fields
    }


def test_rows_come_back_like_raw_with_extras_in_any_column_order() -> None:
    tenant = make_tenant("acme")
    endpoint = make_endpoint(tenant, "http://127.0.0.1:9/a")
    Endpoint.objects.filter(pk=endpoint.pk).update(
        enabled=False, disabled_at=datetime(2026, 12, 3, 7, 15, 30, 123456, tzinfo=UTC)
    )
    quote = connection.ops.quote_name
    table = quote(Endpoint._meta.db_table)
    columns = ", ".join(quote(field.column) for field in reversed(Endpoint._meta.concrete_fields))
    # Reversed column order, an extra aliased column: mapped by name, not by position.
    sql = f"SELECT 'x' AS extra_note, {columns} FROM {table} WHERE {quote('id')} = %s"  # noqa: S608
    for _ in range(2):  # the second call runs on the cached plan
        (mine,) = plain_select.fetch(Endpoint, sql, [endpoint.pk])
        (theirs,) = Endpoint.objects.raw(sql, [endpoint.pk])
        assert _all_values(mine) == _all_values(theirs)
        assert mine.enabled is False and mine.disabled_at == datetime(
            2026, 12, 3, 7, 15, 30, 123456, tzinfo=UTC
        )
        assert mine.extra_note == "x" and mine._state.adding is False
        assert model_to_dict(mine) == model_to_dict(Endpoint.objects.get(pk=endpoint.pk))


def test_a_query_missing_a_column_of_the_model_is_refused() -> None:
    quote = connection.ops.quote_name
    sql = f"SELECT {quote('id')} FROM {quote(Endpoint._meta.db_table)}"  # noqa: S608
    with pytest.raises(ValueError, match="does not select"):
        plain_select.fetch(Endpoint, sql, [])

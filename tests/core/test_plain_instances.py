"""core.plain_instances.new builds the instance `Model(**fields)` would: the same value
in every field, the same related objects cached, unsaved; and it saves like one."""

from datetime import UTC, datetime

import pytest
from django.db import connection

from core import plain_insert, plain_instances
from core.ids import new_ulid
from delivery.models import Delivery
from tests.factories import make_endpoint, make_source, make_tenant
from webhooks.models import Event, Source

pytestmark = pytest.mark.django_db


def _fields(instance) -> dict:
    return {
        field.attname: getattr(instance, field.attname) for field in type(instance)._meta.fields
    }


def test_an_event_and_a_delivery_are_the_ones_the_constructor_builds(
    django_assert_num_queries,
) -> None:
    tenant = make_tenant("acme")
    source = make_source()
    endpoint = make_endpoint(tenant)
    when = datetime(2026, 12, 4, 23, 0, tzinfo=UTC)
    values = {
        "id": new_ulid(),
        "event_type": "order.created",
        "headers": {"X-Shop": "acme"},
        "payload": b'{"id": 1}',
        "idempotency_key": "k-1",
        "received_at": when,
    }
    event = plain_instances.new(Event, values, {"source": source, "tenant": tenant})
    reference = Event(**values, source=source, tenant=tenant)
    assert _fields(event) == _fields(reference)
    assert event.content_type == "application/json" and event.fallback_reason == ""
    assert event._state.adding and event._state.db is None
    with django_assert_num_queries(0):  # the related objects come from the cache
        assert event.tenant is tenant and event.source is source

    delivery_values = {"id": new_ulid(), "status": Delivery.Status.HELD, "enqueued_at": when}
    related = {"event": event, "endpoint": endpoint, "tenant": None}
    delivery = plain_instances.new(Delivery, delivery_values, related)
    reference_delivery = Delivery(**delivery_values, **related)
    assert _fields(delivery) == _fields(reference_delivery)
    assert (delivery.event_id, delivery.endpoint_id, delivery.tenant_id) == (
        event.id,
        endpoint.pk,
        None,
    )
    with django_assert_num_queries(0):  # the related objects come from the cache
        assert delivery.event is event and delivery.endpoint is endpoint and delivery.tenant is None


def test_callable_defaults_are_called_for_each_instance_and_saved_rows_read_back() -> None:
    tenant = make_tenant("acme")
    first, second = (
        plain_instances.new(Event, {"payload": b"{}"}, {"source": None, "tenant": tenant})
        for _ in range(2)
    )
    assert first.id != second.id and len(first.id) == 26
    assert first.headers == {} and first.headers is not second.headers
    assert first.received_at is not None and first.source_id is None
    plain_insert.execute([plain_insert.prepare([first, second])])
    stored = Event.objects.get(pk=first.pk)
    assert _fields(stored) == {**_fields(first), "payload": stored.payload}
    assert bytes(stored.payload) == b"{}"
    assert not first._state.adding and first._state.db == connection.alias
    assert Source.objects.count() == 0

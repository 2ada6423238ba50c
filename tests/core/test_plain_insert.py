"""core.plain_insert: rows it writes, from instances or from plain values, read back
exactly like rows the ORM wrote (run on SQLite and PostgreSQL alike), and an
auto-increment key is left to the database."""

from datetime import UTC, datetime

import pytest
from django.db import IntegrityError, connection, transaction

from core import plain_insert
from delivery.models import Attempt, Delivery
from tests.factories import make_endpoint, make_tenant
from webhooks.models import Event

pytestmark = pytest.mark.django_db


def test_attempts_read_back_like_orm_rows_and_get_their_ids_from_the_database() -> None:
    tenant = make_tenant("acme")
    endpoint = make_endpoint(tenant)
    event = Event.objects.create(tenant=tenant, event_type="x", payload=b"{}")
    delivery = Delivery.objects.create(event=event, endpoint=endpoint, tenant=tenant)
    values = {
        "delivery": delivery,
        "endpoint": endpoint,
        "number": 3,
        "started_at": datetime(2026, 12, 3, 7, 15, 30, 123456, tzinfo=UTC),
        "duration_ms": 41,
        "status_code": None,
        "outcome": Attempt.Outcome.RETRY,
        "error": "connection failed: Connection refused",
        "response_excerpt": 'café\n{"ok": false}',
        "request_headers": {"webhook-id": event.id, "Note": "é\\x00", "n": [1, None]},
    }
    reference = Attempt.objects.create(**values)

    by_attname = {"delivery_id": delivery.pk, "endpoint_id": endpoint.pk, **values}
    del by_attname["delivery"], by_attname["endpoint"]

    many = plain_insert.COPY_FROM_ROWS  # on PostgreSQL these go by COPY, the last by INSERT
    plain_insert.execute(
        [
            plain_insert.prepare([Attempt(**values) for _ in range(many)]),
            plain_insert.prepare_values(Attempt, [by_attname]),
        ]
    )

    stored = list(Attempt.objects.order_by("pk"))
    assert len(stored) == many + 2
    assert len({attempt.pk for attempt in stored}) == many + 2  # the database numbered them

    def fields(attempt: Attempt) -> dict:
        return {
            f.attname: getattr(attempt, f.attname)
            for f in Attempt._meta.concrete_fields
            if f.name != "id"
        }

    for attempt in stored[1:]:
        assert fields(attempt) == fields(reference)


def test_events_read_back_byte_for_byte_by_insert_or_copy() -> None:
    tenant = make_tenant("acme")
    payloads = [bytes(range(256)) + b"\\N\t\n\r" + str(n).encode() for n in range(7)]
    single = [Event(tenant=tenant, event_type="x", payload=payloads[0])]
    many = [Event(tenant=tenant, event_type="x", payload=p) for p in payloads[1:]]
    assert len(many) >= plain_insert.COPY_FROM_ROWS
    plain_insert.execute([plain_insert.prepare(single), plain_insert.prepare(many)])
    stored = {e.pk: bytes(e.payload) for e in Event.objects.all()}
    assert stored == {e.pk: e.payload for e in single + many}


def test_a_taken_key_is_a_django_integrity_error_by_insert_or_copy() -> None:
    tenant = make_tenant("acme")
    endpoint = make_endpoint(tenant)
    event = Event.objects.create(tenant=tenant, event_type="x", payload=b"{}")
    taken = Delivery.objects.create(event=event, endpoint=endpoint, tenant=tenant)
    for count in (1, plain_insert.COPY_FROM_ROWS):
        copies = [Delivery(id=taken.pk, event=event, endpoint=endpoint) for _ in range(count)]
        with pytest.raises(IntegrityError), transaction.atomic():
            plain_insert.execute([plain_insert.prepare(copies)])
    assert Delivery.objects.count() == 1


def test_nothing_to_insert_executes_nothing(django_assert_num_queries) -> None:
    with django_assert_num_queries(0):
        plain_insert.execute([plain_insert.prepare([]), plain_insert.prepare_values(Attempt, [])])


def test_rows_go_in_as_few_statements_as_the_parameter_limit_allows(
    django_assert_num_queries,
) -> None:
    tenant = make_tenant("acme")
    endpoint = make_endpoint(tenant)
    event = Event.objects.create(tenant=tenant, event_type="x", payload=b"{}")
    delivery = Delivery.objects.create(event=event, endpoint=endpoint, tenant=tenant)
    rows = [
        {
            "delivery_id": delivery.pk,
            "endpoint_id": endpoint.pk,
            "number": number,
            "started_at": datetime(2026, 12, 3, 7, 15, tzinfo=UTC),
            "duration_ms": number,
            "status_code": 200,
            "outcome": Attempt.Outcome.DELIVERED,
            "error": "",
            "response_excerpt": "",
            "request_headers": {},
        }
        for number in range(1, 251)
    ]
    prepared = plain_insert.prepare_values(Attempt, rows)
    columns = len(prepared[2][0])
    per_statement = plain_insert._MAX_PARAMS[connection.vendor] // columns
    statements = -(-len(rows) // per_statement)
    if connection.vendor == "postgresql":
        statements = 0  # one COPY, which Django's query log does not list: no INSERT
    with django_assert_num_queries(statements):
        plain_insert.execute([prepared])
    assert sorted(Attempt.objects.values_list("number", flat=True)) == list(range(1, 251))


def test_rows_stamped_on_saving_share_one_time_given_to_the_instances_too() -> None:
    """auto_now is read once per call: the rows one request writes carry one time, and
    each instance holds what its row holds (as pre_save leaves it)."""
    tenant = make_tenant("acme")
    endpoint = make_endpoint(tenant)
    event = Event.objects.create(tenant=tenant, event_type="x", payload=b"{}")
    before = datetime.now(UTC)
    deliveries = [Delivery(event=event, endpoint=endpoint, tenant=tenant) for _ in range(7)]
    plain_insert.execute([plain_insert.prepare(deliveries)])
    stamps = {delivery.updated_at for delivery in deliveries}
    assert len(stamps) == 1 and stamps.pop() >= before
    stored = {d.pk: d.updated_at for d in Delivery.objects.all()}
    assert stored == {d.pk: d.updated_at for d in deliveries}
    later = [Delivery(event=event, endpoint=endpoint, tenant=tenant)]
    plain_insert.execute([plain_insert.prepare(later)])
    assert later[0].updated_at > deliveries[0].updated_at  # a new call, a new time

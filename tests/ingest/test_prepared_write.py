"""PostgreSQL: an accepted event's one write statement is a prepared statement
(core.prepared_statements), and a pooler that loses it costs no event."""

import logging

import psycopg
import pytest
from django.db import IntegrityError, OperationalError, connection, transaction

from core import prepared_statements
from delivery.models import Delivery
from tests.factories import make_endpoint
from tests.ingest.test_ingest import post_shopify, shop_source  # noqa: F401 (a fixture)
from webhooks.models import Event

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        "connection.vendor != 'postgresql'", reason="prepared statements are PostgreSQL's"
    ),
]


@pytest.fixture(autouse=True)
def preparing_on(settings):
    """Each test starts with preparing on and leaves it so for the next."""
    settings.DB_PREPARED_STATEMENTS = True
    prepared_statements._refused.clear()
    yield
    prepared_statements._refused.clear()


def _prepared_here() -> list[str]:
    """The protocol-level prepared statements of this session, by text."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements WHERE NOT from_sql")
        return [row[0] for row in cursor.fetchall()]


def _accepted(client, body: bytes, deliveries: int = 1) -> Event:
    response = post_shopify(client, body, HTTP_X_SHOPIFY_EVENT_ID=body.decode())
    assert response.status_code == 202, response.content
    event = Event.objects.get(pk=response.json()["id"])
    assert bytes(event.payload) == body
    assert Delivery.objects.filter(event=event).count() == deliveries
    return event


def _warm(client) -> None:
    """Two events: the process's first request reads the configuration's version apart,
    and its statement differs from the later ones'."""
    for number in range(2):
        _accepted(client, b'{"warm": %d}' % number)


def test_the_write_is_prepared_once_and_reused(client, shop_source) -> None:  # noqa: F811
    _warm(client)
    before = _prepared_here()
    assert any('INSERT INTO "webhooks_event"' in text and "$1" in text for text in before)
    for number in range(3):
        _accepted(client, b'{"id": %d}' % number)
    # Three more events, nothing more prepared: the same statement, bound again.
    assert _prepared_here() == before


def test_off_prepares_nothing(client, shop_source, settings) -> None:  # noqa: F811
    settings.DB_PREPARED_STATEMENTS = False
    for number in range(2):
        _accepted(client, b'{"id": %d}' % number)
    assert _prepared_here() == []


def test_a_duplicate_is_still_caught(client, shop_source) -> None:  # noqa: F811
    first = _accepted(client, b'{"id": "same"}')
    again = post_shopify(client, b'{"id": "same"}', HTTP_X_SHOPIFY_EVENT_ID='{"id": "same"}')
    assert again.status_code == 200 and again.json()["id"] == str(first.pk)
    assert Event.objects.count() == 1


def test_a_statement_lost_by_a_pooler_is_run_again_unprepared(
    client,
    shop_source,  # noqa: F811
    caplog,
) -> None:
    """A pooler hands the next request another server connection: the statement psycopg
    prepared is not there. Done here by deallocating it behind psycopg's back."""
    _warm(client)
    assert _prepared_here()
    connection.connection.pgconn.exec_(b"DEALLOCATE ALL")
    with caplog.at_level(logging.WARNING, logger="core.prepared_statements"):
        _accepted(client, b'{"id": 2}')
    assert "26000" in caplog.text and "DB_PREPARED_STATEMENTS=off" in caplog.text
    # Preparing stays off in this process: nothing is prepared again.
    _accepted(client, b'{"id": 3}')
    assert _prepared_here() == []
    assert Event.objects.count() == 4


def test_a_name_taken_on_the_server_is_run_again_unprepared(
    client,
    shop_source,  # noqa: F811
    caplog,
) -> None:
    """A pooler's server connection already holds the name psycopg gives the next new
    statement (another client prepared it there)."""
    _warm(client)
    raw = connection.connection
    taken = f"_pg3_{raw._prepared._prepared_idx}"
    raw.pgconn.exec_(f"PREPARE {taken} AS SELECT 1".encode())
    # A second destination: the event's statement carries two deliveries, a new text.
    shop_source.destinations.add(make_endpoint(None, "http://127.0.0.1:9/other"))
    with caplog.at_level(logging.WARNING, logger="core.prepared_statements"):
        _accepted(client, b'{"id": 2}', deliveries=2)
    assert "42P05" in caplog.text
    assert Event.objects.count() == 3


def test_a_stream_of_duplicates_leaves_no_statement_behind(client, shop_source) -> None:  # noqa: F811
    """psycopg prepares a statement new to the connection, then runs it; a failed first
    run (here a duplicate key) left the statement on the server, one per request until a
    run of that text succeeded: a provider retrying duplicates on a fresh connection."""
    _warm(client)
    body = b'{"warm": 1}'
    connection.close()  # a fresh connection: nothing prepared, nothing known to psycopg
    for _ in range(12):
        again = post_shopify(client, body, HTTP_X_SHOPIFY_EVENT_ID=body.decode())
        assert again.status_code == 200 and again.json()["duplicate"] is True
    # At most the statement of the configuration's first read: none for the duplicates.
    assert len(_prepared_here()) <= 1, _prepared_here()
    assert prepared_statements._refused == []
    _accepted(client, b'{"id": "after"}')  # and preparing still works


def test_other_errors_are_raised_as_django_errors(shop_source) -> None:  # noqa: F811
    event = Event.objects.first() or None
    assert event is None
    sql = 'INSERT INTO "webhooks_source" ("id", "slug") SELECT "id", "slug" FROM "webhooks_source"'
    connection.close()
    for _ in range(5):
        with pytest.raises(IntegrityError):
            prepared_statements.execute(sql, [])
    assert prepared_statements._refused == []
    assert _prepared_here() == []  # each failed first run's statement was deallocated


def test_a_connection_lost_in_a_first_run_raises_django_s_error(shop_source) -> None:  # noqa: F811
    """The clean-up after a failed first run must not turn a lost connection's Django
    error (a 503 for ingest) into a psycopg one."""
    prepared_statements.execute("SELECT %s::int", [1])
    pid = connection.connection.info.backend_pid
    with psycopg.connect(**connection.get_connection_params()) as killer:
        killer.execute("SELECT pg_terminate_backend(%s)", [pid])
    with pytest.raises(OperationalError):
        prepared_statements.execute("SELECT %s::int + 1", [1])  # a new text: parsed first
    connection.close()
    assert prepared_statements._refused == []


def test_inside_a_transaction_django_cursor_runs_it(shop_source) -> None:  # noqa: F811
    with transaction.atomic():
        prepared_statements.execute("SELECT %s::int", [1])
    assert _prepared_here() == []
    prepared_statements.execute("SELECT %s::int", [1])
    assert _prepared_here() == ["SELECT $1::int"]

"""PostgreSQL: the configuration's version is written as a change commits (webhooks
migration 0010), so two transactions changing the configuration cannot deadlock on it,
and a transaction that changed it keeps nothing it reads."""

import threading
import time

import psycopg
import pytest
from django.db import connection, transaction

from ingest import config_cache
from tests.delivery_helpers import database_url_for_subprocesses
from tests.factories import make_endpoint, make_tenant

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _postgresql_only():
    if connection.vendor != "postgresql":
        pytest.skip("row locks and deferred triggers are PostgreSQL's (SQLite: one writer)")


def _version(session: psycopg.Connection) -> int:
    return session.execute(f"SELECT v FROM {config_cache.VERSION_TABLE}").fetchone()[0]  # noqa: S608


def _wait_until(
    observer: psycopg.Connection,
    pid: int,
    *,
    or_until: threading.Event | None = None,
    within: float = 30.0,
) -> None:
    """Until the backend `pid` waits for a lock (or `or_until` is set)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline and not (or_until and or_until.is_set()):
        row = observer.execute(
            "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [pid]
        ).fetchone()
        if row and row[0] == "Lock":
            return
        time.sleep(0.02)


def _set_max_in_flight(session: psycopg.Connection, endpoint_id: int, value: int) -> None:
    session.execute(
        "UPDATE tenants_endpoint SET max_in_flight = %s WHERE id = %s", [value, endpoint_id]
    )


def test_two_transactions_changing_endpoints_do_not_deadlock_on_the_version():
    """A changes endpoint `first`; B changes `second` and commits only once A waits for
    `second` too. With the version written at each statement, A held the version row from
    its first change and B waited for it holding `second`: PostgreSQL failed one of them
    ("deadlock detected"). Now B commits, then A, and the version moves."""
    tenant = make_tenant()
    first, second = make_endpoint(tenant), make_endpoint(tenant)
    url = database_url_for_subprocesses()
    with (
        psycopg.connect(url) as a,
        psycopg.connect(url) as b,
        psycopg.connect(url, autocommit=True) as observer,
        psycopg.connect(url, autocommit=True) as b_observer,
    ):
        before = _version(observer)
        errors: list[BaseException] = []
        b_changed = threading.Event()

        def other_transaction() -> None:
            try:
                _set_max_in_flight(b, second.pk, 3)
                b_changed.set()
                # Commit only once A waits for this row: the order a deadlock needs.
                _wait_until(b_observer, a.info.backend_pid)
                b.commit()
            except BaseException as error:
                errors.append(error)
                b.rollback()

        _set_max_in_flight(a, first.pk, 2)
        other = threading.Thread(target=other_transaction)
        other.start()
        # B's change is made (before the fix: B waits for the version row). Not read from
        # B's state: between psycopg's BEGIN and the UPDATE, B is "idle in transaction" too.
        _wait_until(observer, b.info.backend_pid, or_until=b_changed)
        _set_max_in_flight(a, second.pk, 4)
        a.commit()
        other.join(timeout=60)
        assert not other.is_alive()
        assert errors == []
        maxima = dict(
            observer.execute(
                "SELECT id, max_in_flight FROM tenants_endpoint WHERE id IN (%s, %s)",
                [first.pk, second.pk],
            ).fetchall()
        )
        assert maxima == {first.pk: 2, second.pk: 4}  # B's 3, then A's 4
        assert _version(observer) != before


def test_the_version_moves_at_commit_and_not_on_rollback():
    tenant = make_tenant()
    endpoints = [make_endpoint(tenant) for _ in range(3)]
    before = config_cache.current_version()
    assert before is not None
    with transaction.atomic():
        for endpoint in endpoints:
            endpoint.max_in_flight = 7
            endpoint.save()
        # Not written yet, and none is read here (nothing read in a transaction that
        # changed the configuration is kept: it may never commit).
        assert config_cache.current_version() is None
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT v FROM {config_cache.VERSION_TABLE}")  # noqa: S608
            assert cursor.fetchone()[0] == before
    after = config_cache.current_version()
    assert after not in (None, before)
    with pytest.raises(RuntimeError), transaction.atomic():
        endpoints[0].max_in_flight = 9
        endpoints[0].save()
        raise RuntimeError("rolled back")
    assert config_cache.current_version() == after

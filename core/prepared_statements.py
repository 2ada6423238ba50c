"""Run a hot statement as a PostgreSQL prepared statement: parsed and planned once per
connection, then only bound and executed.

Django binds parameters on the client (psycopg's ClientCursor quotes every value into
the SQL text) and turns psycopg's prepared statements off, so that connection poolers
keep working. For ingest's one write statement per accepted event (a CTE of a few dozen
parameters) that means PostgreSQL parses, analyses and plans the same text on every
request, a real share of the server CPU an event costs, and the client quotes every value
into it in Python (the figures: docs/INGEST.md). Here that statement alone goes through a
server-binding cursor, prepared on its first run on each connection; every other query
stays Django's.

`DB_PREPARED_STATEMENTS=off` turns this off. A pooler that cannot carry prepared
statements (PgBouncer in transaction mode before 1.21, or without
`max_prepared_statements`) answers "prepared statement does not exist" or "already
exists"; that error comes before the statement runs, so the statement is run again
unprepared, a warning names the setting, and this process prepares nothing more.
"""

import contextlib
import logging
from collections.abc import Sequence
from typing import Any

import psycopg
from django.conf import settings
from django.db import DatabaseError
from django.db.backends.utils import CursorDebugWrapper, CursorWrapper

from core.database import this_connection

logger = logging.getLogger(__name__)

# SQLSTATEs of a prepared statement the server does not hold, or holds already under
# the name psycopg chose: what a pooler that mixes server connections answers.
_POOLER_LOST_IT = {"26000", "42P05"}
_refused: list[str] = []  # the error that turned preparing off in this process


def execute(sql: str, params: Sequence[Any]) -> None:
    """Run `sql` once with `params`: prepared where it can be (PostgreSQL, the setting
    on, outside a transaction), otherwise through Django's cursor as any query."""
    connection = this_connection()
    if not _may_prepare(connection):
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
        return
    cursor = _server_binding_cursor(connection)
    issued = _names_issued(connection.connection)
    try:
        with cursor:
            cursor.execute(sql, params)
    except DatabaseError as exc:
        state = getattr(exc.__cause__, "sqlstate", None)
        if state not in _POOLER_LOST_IT:
            _drop_orphans(connection.connection, issued)
            raise
        # Nothing ran: a Bind to a missing statement, or a Parse under a taken name,
        # fails before execution, and outside a transaction nothing else is undone.
        _turn_off(
            f"PostgreSQL refused a prepared statement ({state}: {exc}). Behind a pooler"
            " without prepared-statement support set DB_PREPARED_STATEMENTS=off."
        )
        with connection.cursor() as cursor:
            cursor.execute(sql, params)


def _turn_off(reason: str) -> None:
    _refused.append(reason)
    logger.warning("%s Preparing is off in this process.", reason)


def _names_issued(raw: Any) -> int:
    """How many statement names psycopg has given out on this connection (psycopg's own
    count: its names are `_pg3_<n>`)."""
    try:
        return raw._prepared._prepared_idx
    except AttributeError:  # another psycopg: see _drop_orphans
        return -1


def _drop_orphans(raw: Any, issued: int) -> None:
    """Deallocate what a failed first run left on the server.

    psycopg prepares a statement new to the connection and then runs it; when that run
    fails (a duplicate key, the configuration's version check), it forgets the name but
    does not deallocate it. The server keeps the statement, and its memory, until the
    connection closes: one per failed request for as long as no run of that text
    succeeds, as in a provider's stream of retried duplicates on a fresh connection
    (docs/INGEST.md). psycopg offers no public way to see
    its names; if this one keeps them elsewhere, preparing is turned off rather than
    leaking."""
    now = _names_issued(raw)
    if issued < 0 or now < 0:
        _turn_off("psycopg's prepared-statement names cannot be read (not 3.x as tested).")
        return
    if now == issued or raw.closed or raw.broken:
        return  # nothing new was parsed, or the statements went with the connection
    kept = set(raw._prepared._names.values())
    for index in range(issued, now):
        name = f"_pg3_{index}".encode()
        if name not in kept:
            # Best effort, under the caller's error: a name whose Parse failed was never
            # created (the server answers with an error result, not an exception), and a
            # connection lost meanwhile must not turn a Django error into psycopg's.
            with contextlib.suppress(psycopg.Error):
                raw.pgconn.exec_(b'DEALLOCATE "' + name + b'"')


def _may_prepare(connection: Any) -> bool:
    # Inside a transaction a refused statement would abort it, and it could not be run
    # again; those writes (a caller's atomic block) keep Django's cursor.
    return (
        connection.vendor == "postgresql"
        and settings.DB_PREPARED_STATEMENTS
        and not _refused
        and not connection.in_atomic_block
    )


def _server_binding_cursor(connection: Any) -> Any:
    """A psycopg server-binding cursor on Django's connection, in Django's wrapper (so
    errors come out as Django's, and query logging and execute wrappers see it), with
    the checks Django's own connection.cursor() makes first."""
    connection.close_if_health_check_failed()
    connection.ensure_connection()
    connection.validate_thread_sharing()
    raw = connection.connection
    if raw.prepare_threshold is None:
        # Django sets None (never prepare). Its own cursors bind on the client and are
        # never prepared whatever this says, so 0 prepares only this module's statements,
        # each on its first run; psycopg keeps up to 100 per connection (LRU).
        raw.prepare_threshold = 0
    with connection.wrap_database_errors:
        cursor = psycopg.Cursor(raw)
    if connection.queries_logged:
        return _LoggedCursor(cursor, connection)
    return connection.make_cursor(cursor)


class _LoggedCursor(CursorDebugWrapper):
    """Django's query log (DEBUG, CaptureQueriesContext) of a prepared statement: psycopg
    keeps no query text for one, which is where Django's log reads it from, so the
    statement is logged as the SQL a client-side cursor would have sent."""

    def execute(self, sql: str, params: Any = None) -> Any:
        try:
            logged = self.db.ops.compose_sql(sql, params)
        except psycopg.DataError:
            logged = sql
        with self.debug_sql(logged, params):
            return CursorWrapper.execute(self, sql, params)

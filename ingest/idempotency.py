"""Idempotency keys when events are spread over time partitions (PostgreSQL).

A partitioned table's unique index must contain its partition key, so each day's
partition enforces its own keys only, and a provider's retry that arrives the next day
would not collide with the first copy. Where the partitions are in use, `accept` takes a
transaction-level advisory lock on each key it is about to insert and looks across the
partitions for an earlier event under the lock: a concurrent request with the same key
waits for our commit and then finds our row. The per-partition unique indexes remain,
as a second guard. On SQLite (and unpartitioned PostgreSQL) the table's own unique
constraints do it all and nothing here runs.
"""

from django.db import connection

from delivery import partitions

_in_use: set[tuple[str, str]] = set()


def spans_partitions() -> bool:
    """Whether keys must be checked across partitions. Cached once true: tables are never
    un-partitioned, and the catalog query is not for every request."""
    if connection.vendor != "postgresql":
        return False
    database = (connection.alias, connection.settings_dict["NAME"])
    if database in _in_use:
        return True
    if partitions.in_use():
        _in_use.add(database)
        return True
    return False


def identity_text(identity: tuple) -> str:
    kind, scope, key = identity
    return f"{kind}:{scope}:{key}"


def lock(identities: list[tuple]) -> None:
    """Lock these (kind, scope pk, key) identities until the transaction ends, in one
    order (no two batches sharing keys can deadlock)."""
    texts = sorted({identity_text(identity) for identity in identities})
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended(k, 0)) "
            "FROM unnest(%s::text[]) AS k ORDER BY hashtextextended(k, 0)",
            [texts],
        )

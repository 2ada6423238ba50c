"""Idempotency keys when events are spread over time partitions (PostgreSQL).

A partitioned table's unique index must contain its partition key, so each day's
partition enforces its own keys only, and a provider's retry that arrives the next day
would not collide with the first copy. Where the partitions are in use, `accept` takes a
transaction-level advisory lock on each key it is about to insert and looks across the
partitions for an earlier event under the lock: a concurrent request with the same key
waits for our commit and then finds our row. A single event does both inside its one
write statement (`guard`, the function webhooks_key_guard); a batch does them in its
transaction. The per-partition unique indexes remain,
as a second guard. On SQLite (and unpartitioned PostgreSQL) the table's own unique
constraints do it all and the lock is not taken; `stored_ids` serves any PostgreSQL.
"""

import time

from django.db import DEFAULT_DB_ALIAS, connection

from core.database import this_connection, vendor
from core.ids import ulid_floor
from delivery.upkeep import partitions
from webhooks.models import Event

_in_use: set[tuple[str, str]] = set()


def spans_partitions() -> bool:
    """Whether keys must be checked across partitions. Cached once true: tables are never
    un-partitioned, and the catalog query is not for every request."""
    if vendor() != "postgresql":
        return False
    database = (DEFAULT_DB_ALIAS, this_connection().settings_dict["NAME"])
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


# An earlier event under each (scope, key) pair: one probe of the unique index per pair
# (and partition). The ORM's `scope IN (...) AND key IN (...)` lets the planner read every
# row of the batch's tenants, the key a mere filter, whenever the statistics lag behind a
# flood (a day's new partition always starts so), at a cost that grows with the day. A
# plain join of the pairs still lets it hash the whole day when it believes the day nearly
# empty; LATERAL with LIMIT 1 leaves it no plan but a probe per pair, the same cost
# whatever the day holds (docs/INGEST.md has the figures).
_STORED = (
    "SELECT k.scope, k.key, e.id FROM unnest(%s::bigint[], %s::text[]) AS k(scope, key)"
    " CROSS JOIN LATERAL (SELECT e.id FROM {table} e WHERE e.{column} = k.scope"
    " AND e.idempotency_key = k.key AND e.idempotency_key IS NOT NULL AND {condition}"
    " AND e.id < %s LIMIT 1) e"
)
# The days ahead (delivery.upkeep.partitions makes them a week early) hold no event yet: an id
# is its event's time, and no clock here is a day fast. Bounding the id lets PostgreSQL
# leave those partitions out when it plans, and planning over every partition costs a
# single key's look-up far more than planning over the ones in use.
_AHEAD_MS = 86_400_000
_KINDS = (
    ("source", "source_id", "e.source_id IS NOT NULL"),
    ("tenant", "tenant_id", "e.source_id IS NULL"),
)


def stored_ids(
    identities: set[tuple], skip: "partitions.Partition | None" = None
) -> dict[tuple, str]:
    """PostgreSQL: the ids of the events already stored under these (kind, scope pk, key)
    identities (as accept's unique constraints scope them). `skip`: a partition not to
    look in (the one the caller's own rows go to: its unique indexes guard it)."""
    found: dict[tuple, str] = {}
    table = connection.ops.quote_name(Event._meta.db_table)
    bound = ulid_floor(int(time.time() * 1000) + _AHEAD_MS)
    outside, outside_params = _outside(skip)
    with connection.cursor() as cursor:
        for kind, column, condition in _KINDS:
            pairs = [(scope, key) for one_kind, scope, key in identities if one_kind == kind]
            if not pairs:
                continue
            # Identifiers from model metadata and constants; every value is a parameter.
            sql = _STORED.format(table=table, column=column, condition=condition + outside)
            scopes, keys = [scope for scope, _ in pairs], [key for _, key in pairs]
            cursor.execute(sql, [scopes, keys, *outside_params, bound])
            for scope, key, pk in cursor.fetchall():
                found[(kind, scope, key)] = pk
    return found


def _outside(skip: "partitions.Partition | None") -> tuple[str, list[str]]:
    """The condition (and its values) that leaves `skip`'s range of ids out: a range
    PostgreSQL prunes the partition by when it plans."""
    if skip is None:
        return "", []
    if skip.lower is None:
        return " AND e.id >= %s", [skip.upper]
    if skip.upper is None:
        return " AND e.id < %s", [skip.lower]
    return " AND (e.id < %s OR e.id >= %s)", [skip.lower, skip.upper]


# The range partitions' bounds, per database: a partition's range never changes while it
# exists, and days are made a week ahead, so an id outside every known range is looked up
# again at most once a minute (it goes to the default partition meanwhile). Even a range
# whose partition has gone since is safe to skip: the ids of a day's range all go to one
# place, that day's partition or else the default one, so the event's own row still
# lands beside any earlier one of its range, under the same unique index.
_ranges: dict[tuple[str, str], tuple[float, list[partitions.Partition]]] = {}
_RANGES_MAX_AGE_S = 60.0


def own_partition(own_id: str) -> partitions.Partition | None:
    """The ranged partition `own_id` goes to, or None when it goes to the default
    partition (whose rows are of any range)."""
    database = (DEFAULT_DB_ALIAS, this_connection().settings_dict["NAME"])
    read_at, ranges = _ranges.get(database, (-_RANGES_MAX_AGE_S, []))
    for _ in range(2):
        for one in ranges:
            if (one.lower is None or one.lower <= own_id) and (
                one.upper is None or own_id < one.upper
            ):
                return one
        if time.monotonic() - read_at < _RANGES_MAX_AGE_S:
            return None
        read_at = time.monotonic()
        ranges = [p for p in partitions.partitions(partitions.EVENT) if not p.is_default]
        _ranges[database] = (read_at, ranges)
    return None


def guard(identity: tuple, own_id: str) -> tuple[str, list]:
    """The lock and the look-up of `lock` and `stored_ids` for one key, as a call for the
    main query of the event's one write statement (plain_insert.as_one_statement). It
    raises a unique violation when an earlier event holds the key, which rolls the whole
    statement back (webhooks migration 0007 says why this is safe). It skips the event's
    own partition, whose unique index catches a repeat there: a plan made while that day
    was new read all of it through another index (webhooks migration 0009)."""
    kind, scope, key = identity
    bound = ulid_floor(int(time.time() * 1000) + _AHEAD_MS)
    own = own_partition(own_id)
    # Nothing below MINVALUE, nothing from `bound` on; no partition: nothing skipped.
    skip_from, skip_to = (own.lower or "", own.upper or bound) if own else (bound, bound)
    return (
        "webhooks_key_guard(%s, %s, %s, %s, %s, %s, %s, %s)",
        [identity_text(identity), kind == "source", scope, key, own_id, skip_from, skip_to, bound],
    )

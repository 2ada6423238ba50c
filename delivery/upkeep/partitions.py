"""Time partitions for events, deliveries and attempts on PostgreSQL.

Why ranges of the ULID, not of a timestamp column: an event's id starts with its arrival
time (core.ids), so a day is a range of ids, and partitioning by the primary key keeps
the primary key a single column: the models, every foreign key Django follows and every
`pk=` lookup stay as they are, and PostgreSQL can still enforce the key (a partitioned
table's unique index must contain its partition key). A delivery's id carries its
event's time, not its own (ingest.accept makes it so), and an attempt is placed by its
delivery's id: the three tables' partitions of one day then hold exactly that day's
events with everything that hangs off them, and go together.

The layout (docs/RELIABILITY.md, "Time partitions on PostgreSQL"):

* `<table>_legacy`: the rows from before the tables were partitioned (the migration
  attaches the old table as it is, so converting a big table copies nothing);
* `<table>_pYYYYMMDD`: one a day, from the conversion on, made PARTITION_DAYS_AHEAD days
  ahead by the sweep (`maintain`);
* `<table>_default`: rows no other partition takes: what a dropped day had to keep (open
  work, dead letters still kept, deliveries delivered late), and any row whose day was
  not made in time. The batched pruning (delivery.upkeep.retention) settles these one by one.

Pruning a day is then: detach its three partitions, put back what must stay (it lands
in the default partitions), drop them. That costs what stays, not what goes.

Why our own upkeep and not a tool: django-postgres-extra's partitioned models need its
own database backend and create PostgreSQL-only tables from their migrations (our
development default is SQLite, with the same migrations), and its time strategies
partition on a date column; pg_partman is a server extension (an install on every
database server we run against, which `make test` cannot do) whose version in Debian 12
(4.x) partitions by timestamp or integer only, not by a text key. What is left for us is
small: make tomorrow's partitions, drop an expired day. Both are tested against a real
PostgreSQL.
"""

import logging
import re
import time
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.utils import DatabaseError

from core.ids import ulid_floor, ulid_time_ms
from delivery.upkeep.partition_statistics import analyze_stale

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Table:
    name: str
    key: str  # the partition key column
    primary_key: tuple[str, ...]


# Parents before children: the order partitions are made in, and the reverse of the
# order they are detached in.
EVENT = Table("webhooks_event", "id", ("id",))
DELIVERY = Table("delivery_delivery", "id", ("id",))
# A partitioned table's primary key must contain its partition key: (id, delivery_id).
# The id alone stays unique by its sequence; Django only ever looks attempts up by id or
# by delivery.
ATTEMPT = Table("delivery_attempt", "delivery_id", ("id", "delivery_id"))
TABLES = (EVENT, DELIVERY, ATTEMPT)

# Idempotency keys are unique per partition only (PostgreSQL cannot make a unique index
# across partitions without the partition key in it): each event partition gets these,
# and ingest.accept locks and looks across partitions before it inserts a keyed event
# (ingest.idempotency). The same two rules as webhooks.models.Event's constraints; a
# test compares them.
EVENT_UNIQUE_INDEXES = (
    (
        "srcidem",
        "(source_id, idempotency_key)",
        "idempotency_key IS NOT NULL AND source_id IS NOT NULL",
    ),
    (
        "tenidem",
        "(tenant_id, idempotency_key)",
        "idempotency_key IS NOT NULL AND source_id IS NULL",
    ),
)

_BOUND = re.compile(r"FROM \((MINVALUE|'[^']*')\) TO \((MAXVALUE|'[^']*')\)")
# The sweep looks this often at most: listing partitions is a catalog query, cheap, but
# the sweep runs every few seconds and a day changes once a day.
MAINTAIN_EVERY_SECONDS = 60.0
_last_maintained = 0.0


@dataclass(frozen=True)
class Partition:
    name: str
    lower: str | None  # None: MINVALUE
    upper: str | None  # None: MAXVALUE; both None: the default partition

    @property
    def is_default(self) -> bool:
        return self.lower is None and self.upper is None


def in_use() -> bool:
    """Whether this database has the partitioned tables (PostgreSQL after the migration)."""
    if connection.vendor != "postgresql":
        return False
    with connection.cursor() as cursor:
        cursor.execute("SELECT relkind FROM pg_class WHERE oid = to_regclass(%s)", [EVENT.name])
        row = cursor.fetchone()
    return row is not None and row[0] == "p"


def day_floor(day: date) -> str:
    """The smallest ULID of `day` (UTC)."""
    start = datetime(day.year, day.month, day.day, tzinfo=UTC)
    return ulid_floor(int(start.timestamp() * 1000))


def _unquote(bound: str) -> str | None:
    return None if bound in ("MINVALUE", "MAXVALUE") else bound.strip("'")


def partitions(table: Table) -> list[Partition]:
    """`table`'s partitions, the default one last, the others by their lower bound."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i "
            "JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = to_regclass(%s)",
            [table.name],
        )
        rows = cursor.fetchall()
    found = []
    for name, bound in rows:
        match = _BOUND.search(bound)
        if match is None:  # DEFAULT
            found.append(Partition(name, None, None))
        else:
            found.append(Partition(name, _unquote(match[1]), _unquote(match[2])))
    return sorted(found, key=lambda p: (p.is_default, p.lower or ""))


def _columns(table: Table) -> str:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = to_regclass(%s) "
            "AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
            [table.name],
        )
        return ", ".join(connection.ops.quote_name(row[0]) for row in cursor.fetchall())


def _event_unique_indexes(cursor, partition: str) -> None:
    quote = connection.ops.quote_name
    for suffix, columns, where in EVENT_UNIQUE_INDEXES:
        cursor.execute(
            f"CREATE UNIQUE INDEX IF NOT EXISTS {quote(f'{partition}_{suffix}')} "
            f"ON {quote(partition)} {columns} WHERE {where}"
        )


def _create_range(table: Table, name: str, lower: str, upper: str) -> None:
    """One partition of `table` for [lower, upper). Rows of that range that went to the
    default partition meanwhile (the sweep was down past the days made ahead) are moved
    into it: PostgreSQL refuses a new partition while the default one holds its rows."""
    quote = connection.ops.quote_name
    default = f"{table.name}_default"
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT EXISTS (SELECT 1 FROM {quote(default)} "  # noqa: S608 (names are ours)
            f"WHERE {quote(table.key)} >= %s AND {quote(table.key)} < %s)",
            [lower, upper],
        )
        stranded = cursor.fetchone()[0]
        if stranded:
            cursor.execute(f"ALTER TABLE {quote(table.name)} DETACH PARTITION {quote(default)}")
        cursor.execute(
            f"CREATE TABLE {quote(name)} PARTITION OF {quote(table.name)} "
            "FOR VALUES FROM (%s) TO (%s)",
            [lower, upper],
        )
        if table is EVENT:
            _event_unique_indexes(cursor, name)
        if stranded:
            columns = _columns(table)
            cursor.execute(
                f"INSERT INTO {quote(table.name)} ({columns}) SELECT {columns} "  # noqa: S608
                f"FROM {quote(default)} WHERE {quote(table.key)} >= %s AND {quote(table.key)} < %s",
                [lower, upper],
            )
            cursor.execute(
                f"DELETE FROM {quote(default)} "  # noqa: S608
                f"WHERE {quote(table.key)} >= %s AND {quote(table.key)} < %s",
                [lower, upper],
            )
            cursor.execute(
                f"ALTER TABLE {quote(table.name)} ATTACH PARTITION {quote(default)} DEFAULT"
            )


def create_default(table: Table) -> None:
    quote = connection.ops.quote_name
    name = f"{table.name}_default"
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE TABLE {quote(name)} PARTITION OF {quote(table.name)} DEFAULT")
        if table is EVENT:
            _event_unique_indexes(cursor, name)


def ensure_ahead(today: date | None = None, days_ahead: int | None = None) -> int:
    """Make the day partitions up to `days_ahead` days after `today`, contiguous from the
    newest one there is. Returns how many days were made."""
    today = today or datetime.now(UTC).date()
    days_ahead = settings.PARTITION_DAYS_AHEAD if days_ahead is None else days_ahead
    target = day_floor(today + timedelta(days=days_ahead + 1))
    made = 0
    ranged = [p for p in partitions(EVENT) if not p.is_default]
    start = max((p.upper for p in ranged if p.upper), default=day_floor(today))
    while start < target:
        day = _day_of(start)
        upper = day_floor(day + timedelta(days=1))
        with transaction.atomic():
            for table in TABLES:
                _create_range(table, f"{table.name}_p{day:%Y%m%d}", start, upper)
        made += 1
        start = upper
    return made


def create_day(day: date) -> None:
    """The three tables' partitions for the whole of `day` (a range no partition holds
    yet): for loading history into a fresh database (bench/history.py)."""
    with transaction.atomic():
        for table in TABLES:
            _create_range(
                table,
                f"{table.name}_p{day:%Y%m%d}",
                day_floor(day),
                day_floor(day + timedelta(days=1)),
            )


def _day_of(ulid: str) -> date:
    return datetime.fromtimestamp(ulid_time_ms(ulid) / 1000, UTC).date()


@dataclass(frozen=True)
class Dropped:
    partition: str  # the event partition's name
    kept_deliveries: int
    seconds: float


def drop_expired(
    below: str, keep_deliveries_sql: str, params: list, *, lock_timeout_ms: int = 2000
) -> list[Dropped]:
    """Drop each set of day (or legacy) partitions whose range ends at or before `below`,
    after putting back the deliveries `keep_deliveries_sql` selects (a WHERE clause over the
    detached delivery partition) with their events and attempts. One short transaction per
    day; a day whose locks are not had within `lock_timeout_ms` waits for the next run."""
    done = []
    by_bounds = {table: {(p.lower, p.upper): p for p in partitions(table)} for table in TABLES}
    for event_part in partitions(EVENT):
        if event_part.is_default or event_part.upper is None or event_part.upper > below:
            continue
        parts = [by_bounds[t].get((event_part.lower, event_part.upper)) for t in TABLES]
        if any(p is None for p in parts):
            logger.error("partitions of %s differ between tables; not dropping", event_part.name)
            continue
        started = time.monotonic()
        try:
            kept = _drop_day(parts, keep_deliveries_sql, params, lock_timeout_ms)
        except DatabaseError as exc:
            logger.warning("dropping %s postponed: %s", event_part.name, exc)
            continue
        done.append(Dropped(event_part.name, kept, time.monotonic() - started))
    return done


def _drop_day(parts: list[Partition], keep_sql: str, params: list, lock_timeout_ms: int) -> int:
    quote = connection.ops.quote_name
    event_p, delivery_p, attempt_p = (quote(p.name) for p in parts)
    columns = {table: _columns(table) for table in TABLES}
    with transaction.atomic(), connection.cursor() as cursor:
        # DETACH takes the parent's strongest lock; waiting for it queues every reader
        # behind us, so give up soon and try again next sweep rather than stall the
        # recorder.
        cursor.execute(f"SET LOCAL lock_timeout = {int(lock_timeout_ms)}")
        # The foreign keys to tenants and endpoints are checked at commit (Django makes
        # them deferred), and PostgreSQL refuses to drop a table with checks pending:
        # check the rows put back at once instead.
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        for table, part in zip(reversed(TABLES), (attempt_p, delivery_p, event_p), strict=True):
            cursor.execute(f"ALTER TABLE {quote(table.name)} DETACH PARTITION {part}")
        cursor.execute(
            "CREATE TEMPORARY TABLE kept_deliveries ON COMMIT DROP AS "  # noqa: S608
            f"SELECT id, event_id FROM {delivery_p} WHERE {keep_sql}",
            params,
        )
        cursor.execute("SELECT count(*) FROM kept_deliveries")
        kept = cursor.fetchone()[0]
        if kept:
            # Back through the parents: their day's range is gone, so the rows land in
            # the default partitions.
            cursor.execute(
                f"INSERT INTO {quote(EVENT.name)} ({columns[EVENT]}) "  # noqa: S608
                f"SELECT {columns[EVENT]} FROM {event_p} "
                "WHERE id IN (SELECT event_id FROM kept_deliveries)"
            )
            cursor.execute(
                f"INSERT INTO {quote(DELIVERY.name)} ({columns[DELIVERY]}) "  # noqa: S608
                f"SELECT {columns[DELIVERY]} FROM {delivery_p} "
                "WHERE id IN (SELECT id FROM kept_deliveries)"
            )
            cursor.execute(
                f"INSERT INTO {quote(ATTEMPT.name)} ({columns[ATTEMPT]}) "  # noqa: S608
                f"SELECT {columns[ATTEMPT]} FROM {attempt_p} "
                "WHERE delivery_id IN (SELECT id FROM kept_deliveries)"
            )
        cursor.execute(f"DROP TABLE {attempt_p}, {delivery_p}, {event_p}")
        # Now, not at commit: a caller's outer transaction may drop several days.
        cursor.execute("DROP TABLE kept_deliveries")
    return kept


def maintain_quietly() -> dict[str, int]:
    """For the sweep: at most once a MAINTAIN_EVERY_SECONDS, make the days ahead and
    analyze the partitions whose statistics lag (delivery.upkeep.partition_statistics). Never
    fails the sweep (rows of a day not made yet go to the default partition, and are
    moved into their day when it is made). Expired days are dropped by delivery.upkeep.retention."""
    global _last_maintained
    now = time.monotonic()
    if now - _last_maintained < MAINTAIN_EVERY_SECONDS:
        return {}
    _last_maintained = now
    done: dict[str, int] = {}
    try:
        if not in_use():
            return done
        made = ensure_ahead()
        if made:
            done["partition_days_made"] = made
        analyzed = analyze_stale([table.name for table in TABLES])
        if analyzed:
            done["partitions_analyzed"] = len(analyzed)
    except Exception:
        logger.exception("partition upkeep failed")
    return done

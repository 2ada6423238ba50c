"""Turning today's plain events, deliveries and attempts tables into partitioned ones
(PostgreSQL; the migration delivery 0007 runs it).

Nothing is copied: each old table becomes its new parent's `<table>_legacy` partition,
holding every id below the cut-over instant, and days from then on get partitions of
their own (delivery.upkeep.partitions). What it costs on a big table (docs/RELIABILITY.md):
ATTACH reads the old table once to check its rows fit the range, and the attempts table
gets one new unique index, on (id, delivery_id), since a partitioned table's primary key
must contain the partition key. Both happen inside the migration's transaction, under
the tables' locks: plan the migration for a quiet moment on a large installation.

Foreign keys between the three tables are dropped, not recreated: a key into a
partitioned table makes every DETACH of a day scan the referencing table. Django keeps
them as it always did (its deletes cascade in Python, not in the database), and the
three tables' days are detached and dropped together. Keys to tenants, endpoints and
sources stay.
"""

from django.db import connection

from delivery.upkeep.partitions import ATTEMPT, DELIVERY, EVENT, TABLES, Table, create_default

LEGACY = "_legacy"


def _fetch(cursor, sql: str, params: list | None = None) -> list[tuple]:
    cursor.execute(sql, params or [])
    return cursor.fetchall()


def _drop_keys_between_history_tables(cursor) -> None:
    for child, parent in ((ATTEMPT, DELIVERY), (DELIVERY, EVENT)):
        names = _fetch(
            cursor,
            "SELECT conname FROM pg_constraint WHERE contype = 'f' "
            "AND conrelid = to_regclass(%s) AND confrelid = to_regclass(%s)",
            [child.name, parent.name],
        )
        for (name,) in names:
            cursor.execute(f'ALTER TABLE "{child.name}" DROP CONSTRAINT "{name}"')


def _convert(cursor, table: Table, cutover: str) -> None:
    legacy = table.name + LEGACY
    # What the new parent takes over, read before any renaming: its indexes (the unique
    # ones on idempotency keys excepted: partitions keep those each for themselves) and
    # its foreign keys to tables that stay plain.
    indexes = _fetch(
        cursor,
        "SELECT i.indexrelid::regclass::text, pg_get_indexdef(i.indexrelid) FROM pg_index i "
        "WHERE i.indrelid = to_regclass(%s) AND NOT i.indisprimary AND NOT i.indisunique",
        [table.name],
    )
    all_indexes = _fetch(
        cursor,
        "SELECT indexrelid::regclass::text FROM pg_index WHERE indrelid = to_regclass(%s)",
        [table.name],
    )
    keys = _fetch(
        cursor,
        "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint "
        "WHERE contype = 'f' AND conrelid = to_regclass(%s)",
        [table.name],
    )
    primary = _fetch(
        cursor,
        "SELECT conname FROM pg_constraint WHERE contype = 'p' AND conrelid = to_regclass(%s)",
        [table.name],
    )[0][0]

    cursor.execute(f'ALTER TABLE "{table.name}" RENAME TO "{legacy}"')
    for (index,) in all_indexes:
        if index == primary:
            continue
        cursor.execute(f'ALTER INDEX "{index}" RENAME TO "{index[:55]}{LEGACY}"')
    cursor.execute(f'ALTER TABLE "{legacy}" RENAME CONSTRAINT "{primary}" TO "{legacy}_pkey"')

    cursor.execute(
        f'CREATE TABLE "{table.name}" (LIKE "{legacy}" INCLUDING DEFAULTS INCLUDING CONSTRAINTS '
        f'INCLUDING STORAGE) PARTITION BY RANGE ("{table.key}")'
    )
    columns = ", ".join(f'"{column}"' for column in table.primary_key)
    if table is ATTEMPT:
        _sequence_for_attempt_ids(cursor, legacy)
        # The old key (id) is not the parent's: the one index the conversion builds.
        cursor.execute(f'ALTER TABLE "{legacy}" DROP CONSTRAINT "{legacy}_pkey"')
        cursor.execute(
            f'ALTER TABLE "{legacy}" ADD CONSTRAINT "{legacy}_pkey" PRIMARY KEY ({columns})'
        )
    cursor.execute(f'ALTER TABLE "{table.name}" ADD CONSTRAINT "{primary}" PRIMARY KEY ({columns})')
    for _name, definition in indexes:
        cursor.execute(definition)
    for name, definition in keys:
        cursor.execute(f'ALTER TABLE "{table.name}" ADD CONSTRAINT "{name}" {definition}')
    # The parent's indexes match the old table's, so ATTACH adopts them rather than
    # building new ones (all but the attempts' new primary key).
    cursor.execute(
        f'ALTER TABLE "{table.name}" ATTACH PARTITION "{legacy}" '
        "FOR VALUES FROM (MINVALUE) TO (%s)",
        [cutover],
    )
    # The old table's own unique indexes on idempotency keys were renamed with it and
    # still hold there; the new partitions get theirs as they are made.
    create_default(table)


def _sequence_for_attempt_ids(cursor, legacy: str) -> None:
    """PostgreSQL 15 has no identity columns on partitioned tables: the ids come from a
    sequence owned by the column instead, continuing where the old identity stopped."""
    (last,) = _fetch(cursor, f'SELECT max(id) FROM "{legacy}"')[0]  # noqa: S608
    cursor.execute(f'ALTER TABLE "{legacy}" ALTER COLUMN id DROP IDENTITY IF EXISTS')
    cursor.execute(f'CREATE SEQUENCE "{ATTEMPT.name}_id_seq" AS bigint')
    cursor.execute(f'ALTER SEQUENCE "{ATTEMPT.name}_id_seq" OWNED BY "{ATTEMPT.name}".id')
    if last is not None:
        cursor.execute(f"SELECT setval('\"{ATTEMPT.name}_id_seq\"', %s)", [last])
    cursor.execute(
        f'ALTER TABLE "{ATTEMPT.name}" ALTER COLUMN id '
        f"SET DEFAULT nextval('\"{ATTEMPT.name}_id_seq\"')"
    )


def convert(cutover: str) -> None:
    """Partition the three tables in the current transaction; ids below `cutover` stay in
    the legacy partitions. Only for PostgreSQL."""
    with connection.cursor() as cursor:
        _drop_keys_between_history_tables(cursor)
        for table in TABLES:
            _convert(cursor, table, cutover)

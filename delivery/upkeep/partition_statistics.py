"""Keep the day partitions' planner statistics from lagging behind a flood (PostgreSQL).

The planner chooses an index from a table's statistics. A day's partition starts empty
and fills fast; until it is analyzed, PostgreSQL may probe it through an index that does
not fit the query (the `source_id` index instead of the unique one on the key: every
accepted event then reads the whole day so far; docs/INGEST.md). autovacuum analyzes a
table once a tenth of it has changed (its default), but it may be off
(it is on this project's test machines) or behind. So the sweep's partition upkeep
analyzes, by the same rule, the partitions of the events, deliveries and attempts that
autovacuum has not: when autovacuum keeps up, it finds nothing to do.
"""

import logging
from collections.abc import Sequence

from django.db import connection, transaction
from django.db.utils import OperationalError

logger = logging.getLogger(__name__)

# autovacuum's own rule (autovacuum_analyze_threshold + autovacuum_analyze_scale_factor
# at their defaults): analyze once this many rows plus this share of the table changed.
ROWS = 50
SHARE = 0.1
MOST_PER_RUN = 3  # the stalest first; the next run, a minute later, takes the rest
# ANALYZE waits for a VACUUM or ANALYZE already running on the table: not for long.
LOCK_TIMEOUT_MS = 2000

_STALE = """
SELECT c.oid::regclass::text
FROM pg_inherits i
JOIN pg_class c ON c.oid = i.inhrelid
JOIN pg_stat_user_tables s ON s.relid = c.oid
WHERE i.inhparent = ANY (%s::regclass[])
  AND s.n_mod_since_analyze > %s + %s * greatest(c.reltuples, 0)
ORDER BY s.n_mod_since_analyze DESC
LIMIT %s
"""


def stale_partitions(parents: Sequence[str], limit: int = MOST_PER_RUN) -> list[str]:
    """The partitions of the `parents` tables (names as the catalog prints them, quoted
    where needed) whose statistics lag the most."""
    with connection.cursor() as cursor:
        cursor.execute(_STALE, [list(parents), ROWS, SHARE, limit])
        return [name for (name,) in cursor.fetchall()]


def analyze_stale(parents: Sequence[str], limit: int = MOST_PER_RUN) -> list[str]:
    """ANALYZE the stalest partitions of the `parents` tables; returns those analyzed.
    One that is busy (another ANALYZE or a VACUUM holds it) is left for the next run."""
    done = []
    for name in stale_partitions(parents, limit):
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(f"SET LOCAL lock_timeout = {int(LOCK_TIMEOUT_MS)}")
                # A name from the catalog (regclass::text quotes it when needed).
                cursor.execute(f"ANALYZE {name}")
        except OperationalError as exc:
            logger.info("partition %s not analyzed this time: %s", name, exc)
            continue
        done.append(name)
    return done

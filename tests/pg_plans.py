"""Query plans read in the parent tables' terms.

On PostgreSQL the history tables are partitioned (delivery.upkeep.partitions): a plan names each
partition and each partition's own copy of an index. Tests that ask "does this query use
index X" mean the model's index, whichever partitions it is read in.
"""

import re

from django.db import connection


def in_parent_names(plan: str) -> str:
    """`plan` with every partition, and every partition's index, named after its parent."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname, p.relname FROM pg_inherits i "
            "JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_class p ON p.oid = i.inhparent"
        )
        parents = dict(cursor.fetchall())
    if not parents:
        return plan
    # Longest first, so a partition's name is not replaced inside its index's name.
    pattern = re.compile(
        "|".join(re.escape(name) for name in sorted(parents, key=len, reverse=True))
    )
    return pattern.sub(lambda match: parents[match[0]], plan)


HISTORY_TABLES = ("webhooks_event", "delivery_delivery", "delivery_attempt")


def assert_no_scan_of_history(queries: list[dict], what: str) -> None:
    """Every SELECT among `queries` (CaptureQueriesContext's) that reads a history table
    finds an index there: with sequential scans priced out (tiny test tables would always
    be scanned), a plan that still scans one has no index to use."""
    from django.db import transaction

    selects = [
        q["sql"]
        for q in queries
        if q["sql"].startswith("SELECT") and any(t in q["sql"] for t in HISTORY_TABLES)
    ]
    assert selects, what
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        for sql in selects:
            cursor.execute(f"EXPLAIN {sql}")
            plan = in_parent_names("\n".join(row[0] for row in cursor.fetchall()))
            for table in HISTORY_TABLES:
                assert f"Seq Scan on {table}" not in plan, (what, sql, plan)

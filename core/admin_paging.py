"""Paging over tables of millions of rows in the admin without counting them.

Django's admin counts a list's rows for its paginator: a COUNT(*) over every matching
row, which on a long history reads much of a table (bench/history.py). On PostgreSQL the
count here is the planner's own estimate of the rows the list's query returns, unless that
estimate is small, in which case the exact count is cheap and shown. The page links then
say "about" that many (a list that is really shorter just ends early); SQLite, the
development database, is counted exactly.
"""

import json

from django.core.exceptions import EmptyResultSet
from django.core.paginator import Paginator
from django.db import OperationalError, connections, transaction
from django.utils.functional import cached_property

# Below this many estimated rows, the exact count is tried, for at most COUNT_WITHIN_MS:
# a few rows of a filter with an index are counted at once, and a count that would read
# the table (a filter no index serves entirely, such as a tenant's deliveries) gives up
# and the estimate is shown (docs/BENCHMARKS.md).
EXACT_BELOW = 20_000
COUNT_WITHIN_MS = 50


def planner_estimate(queryset) -> int:
    """The rows PostgreSQL's planner expects `queryset` to return (no query is run)."""
    connection = connections[queryset.db]
    try:
        sql, params = queryset.order_by().query.sql_with_params()
    except EmptyResultSet:  # e.g. .none(): a filter that can match nothing
        return 0
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}", params)
        (plan,) = cursor.fetchone()
    if isinstance(plan, str):
        plan = json.loads(plan)
    return int(plan[0]["Plan"]["Plan Rows"])


class EstimatedCountPaginator(Paginator):
    # Whether `count` is the planner's estimate: templates/admin/pagination.html then
    # says "about" that many.
    is_estimate = False

    @cached_property
    def count(self) -> int:
        queryset = self.object_list
        if not hasattr(queryset, "query") or connections[queryset.db].vendor != "postgresql":
            return super().count
        estimate = planner_estimate(queryset)
        if estimate >= EXACT_BELOW:
            self.is_estimate = True
            return estimate
        counted = count_within(queryset, COUNT_WITHIN_MS)
        self.is_estimate = counted is None
        return estimate if counted is None else counted


def count_within(queryset, milliseconds: int) -> int | None:
    """`queryset.count()`, or None if PostgreSQL took longer than `milliseconds` (the
    count is cancelled; the time limit ends with it, in a savepoint of its own)."""
    connection = connections[queryset.db]
    try:
        with transaction.atomic(using=queryset.db), connection.cursor() as cursor:
            cursor.execute("SHOW statement_timeout")
            (previous,) = cursor.fetchone()
            cursor.execute(
                "SELECT set_config('statement_timeout', %s, true)", [f"{milliseconds}ms"]
            )
            counted = queryset.count()
            # SET LOCAL outlives a released savepoint: put the caller's limit back.
            cursor.execute("SELECT set_config('statement_timeout', %s, true)", [previous])
            return counted
    except OperationalError:  # cancelled: statement_timeout
        return None

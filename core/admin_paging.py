"""Paging over tables of millions of rows in the admin without counting them.

Django's admin counts a list's rows for its paginator: a COUNT(*) over every matching
row, seconds on tens of millions of events (bench/history.py). On PostgreSQL the count
here is the planner's own estimate of the rows the list's query returns, unless that
estimate is small, in which case the exact count is cheap and shown. The page links then
say "about" that many (a list that is really shorter just ends early); SQLite, the
development database, is counted exactly.
"""

import json

from django.core.exceptions import EmptyResultSet
from django.core.paginator import Paginator
from django.db import connections
from django.utils.functional import cached_property

# Below this many estimated rows, counting them is cheap: count exactly.
EXACT_BELOW = 20_000


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
    @cached_property
    def count(self) -> int:
        queryset = self.object_list
        if not hasattr(queryset, "query") or connections[queryset.db].vendor != "postgresql":
            return super().count
        estimate = planner_estimate(queryset)
        return super().count if estimate < EXACT_BELOW else estimate

"""The default database without Django's connection proxy, for hot paths.

Every attribute read through `django.db.connection` finds this thread's connection
again, which costs more than `connections[alias]` and far more than an attribute of the
connection in hand, and an accepted event's request reads many of them (the figures:
docs/INGEST.md).
"""

from functools import cache

from django.db import DEFAULT_DB_ALIAS, connections
from django.db.backends.base.base import BaseDatabaseWrapper


def this_connection() -> BaseDatabaseWrapper:
    """The default database's connection of this thread: one look-up, where each read
    through the proxy is another."""
    return connections[DEFAULT_DB_ALIAS]


@cache
def vendor() -> str:
    """The default database's vendor ("postgresql", "sqlite"): one engine per process."""
    return connections[DEFAULT_DB_ALIAS].vendor

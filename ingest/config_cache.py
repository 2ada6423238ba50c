"""Ingest's look-ups kept between requests, each valid for one version of the configuration.

Every signed POST needs the source with its secrets, the tenant of its fairness key and
the destinations: three queries, about half of an accepted event's database work and a
third of its Python (docs/INGEST.md). The configuration behind them changes rarely, but
a change must apply to the very next request: a revoked secret, a disabled source or
endpoint, a new weight. So each request first reads one row, the configuration's version
(webhooks migration 0006: database triggers give it a new random value in the same
transaction as any change to those tables), and uses only what was read under that same
version; anything else is read again. One cheap query instead of three; an unknown
source still costs one query (the version comes with the source's rows).

Why this is exact, not "eventually":
- What is kept is tagged with the version read *before* it was read, so it is at least as
  new as that version. A change commits its new version with it; a request that starts
  after the commit reads the new version and finds nothing tagged with it.
- A rolled-back change leaves the old version, which the kept data still matches; the
  random value it had is never seen outside its transaction.
- Inside a transaction that changed the configuration, the version read is that
  transaction's own, so nothing kept from outside it matches.
- Nothing is kept when the version row cannot be read (another database, a flushed
  table): every look-up then reads the database, as before.

Only what was found is kept (a source, a tenant, destinations), never an absence: an
unknown source or key reads the database every time, so a new tenant (which changes no
version, see the migration) is found at once. Secrets are kept with their expiry and
filtered per request, so a secret still expires on the second.

The instances kept are shared by a process's threads and must not be changed in place
(ingest does not: key_hygiene's suspend/resume set the fields it has just written, which
also changes the version).
"""

import threading
from collections.abc import Callable, Hashable
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import DatabaseError, connection
from django.utils import timezone

from tenants.models import Endpoint, Tenant

VERSION_TABLE = "webhooks_config_version"  # webhooks migration 0006
VENDORS = ("postgresql", "sqlite")  # the databases the migration makes it on
VERSION_SQL = f"SELECT v FROM {VERSION_TABLE} WHERE id = 1"  # noqa: S608
MAX_ENTRIES = 10_000  # per process; past it the oldest go (a tenant per key: keys are many)

_entries: dict[Hashable, tuple[int, Any]] = {}
_lock = threading.Lock()  # only for adding and evicting; reads are plain dict look-ups


def enabled() -> bool:
    """Whether look-ups may be kept: the setting, and a database with the version table."""
    return settings.INGEST_CONFIG_CACHE and connection.vendor in VENDORS


def current_version() -> int | None:
    """The configuration's version now, or None when it cannot be read (nothing kept)."""
    if not enabled():
        return None
    try:
        with connection.cursor() as cursor:
            cursor.execute(VERSION_SQL)
            row = cursor.fetchone()
    except DatabaseError:
        if connection.in_atomic_block:
            raise  # the caller's transaction is broken now: it must hear of it
        return None
    return row[0] if row else None


def _keep(key: Hashable, version: int, value: Any) -> None:
    with _lock:
        _entries.pop(key, None)  # re-inserted last: the oldest entries are first
        _entries[key] = (version, value)
        while len(_entries) > MAX_ENTRIES:
            del _entries[next(iter(_entries))]


def clear() -> None:
    with _lock:
        _entries.clear()


_UNREAD = object()


class Lookups:
    """One request's look-ups. The version is read once, when first needed: by the
    source's own query (`source`), which selects it along with the rows, so that an
    unknown source (the 404) still costs one query; or on its own, to check a kept
    source."""

    def __init__(self, keep: bool = True) -> None:
        self.version: Any = _UNREAD if keep else None

    def _version(self) -> int | None:
        if self.version is _UNREAD:
            self.version = current_version()
        return self.version

    def _get(self, key: Hashable, load: Callable[[], Any]) -> Any:
        if self.version is None:
            return load()
        found = _entries.get(key)
        version = self._version()  # read before the rows: what is kept is at least as new
        if found is not None and found[0] == version:
            return found[1]
        value = load()
        if value and version is not None:  # an absence is never kept (see above)
            _keep(key, version, value)
        return value

    def source(self, slug: str, load: Callable[[], tuple[Any, int | None]]) -> Any:
        """`load` returns the source's rows and the version read in the same statement."""
        if self.version is None:
            return load()[0]
        found = _entries.get(("source", slug))
        if found is not None and found[0] == self._version():
            return found[1]
        value, self.version = load()  # the newer version: later look-ups read after it
        if value and self.version is not None:
            _keep(("source", slug), self.version, value)
        return value

    def tenant(self, key: str, load: Callable[[], Tenant | None]) -> Tenant | None:
        return self._get(("tenant", key), load)

    def endpoints(self, kind: str, pk: int, load: Callable[[], list[Endpoint]]) -> list[Endpoint]:
        return self._get((kind, pk), load)


def lookups() -> Lookups:
    """The look-ups for one request (no query yet)."""
    return Lookups(keep=enabled())


def unexpired(secrets: list[tuple[str, datetime | None]], now: datetime | None = None) -> list[str]:
    """The secrets not yet expired at `now`, in the order given."""
    now = now or timezone.now()
    return [secret for secret, expires_at in secrets if expires_at is None or expires_at > now]

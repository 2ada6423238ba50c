"""Ingest's look-ups kept between requests, each valid for one version of the configuration.

Every signed POST needs the source with its secrets, the tenant of its fairness key and
the destinations: three queries, a large part of an accepted event's database work and
of its Python (docs/INGEST.md). The configuration behind them changes rarely, but
a change must apply to the very next request: a revoked secret, a disabled source or
endpoint, a new weight. So each request first reads one row, the configuration's version
(webhooks migration 0006: database triggers give it a new random value in the same
transaction as any change to those tables), and uses only what was read under that same
version; anything else is read again. One cheap query instead of three; an unknown
source still costs one query (the version comes with the source's rows).

On PostgreSQL not even that: a request assumes the newest version its process has read
(`lookups(assume=True)`) and its one write statement checks it (webhooks_config_check,
migration 0008). If the version moved on, the statement rolls back whole (`Stale`) and
the request starts again with the version read first; a refusal that rests on kept
look-ups does the same before it is sent (`Lookups.refuse`), since no write checks it.

Why this is exact, not "eventually":
- What is kept is tagged with the version read *before* it was read, so it is at least as
  new as that version. A change commits its new version with it; a request that starts
  after the commit reads the new version and finds nothing tagged with it.
- A rolled-back change leaves the old version, which the kept data still matches; the
  random value it had is never seen outside its transaction.
- Inside a transaction that changed the configuration, no version is read on PostgreSQL
  (it writes the new one as the change commits: webhooks migration 0010), so nothing is
  kept or used there; on SQLite the version read is that transaction's own, so nothing
  kept from outside it matches.
- Nothing is kept when the version row cannot be read (another database, a flushed
  table): every look-up then reads the database, as with the setting off.

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

from core.database import vendor
from tenants.models import Endpoint, Tenant

VERSION_TABLE = "webhooks_config_version"  # webhooks migration 0006
VENDORS = ("postgresql", "sqlite")  # the databases the migration makes it on
VERSION_SQL = f"SELECT v FROM {VERSION_TABLE} WHERE id = 1"  # noqa: S608
# PostgreSQL writes a change's new version as it commits (webhooks migration 0010), so a
# transaction that changed the configuration reads no version: nothing read there is kept.
_CHANGED_HERE = {
    "postgresql": " AND current_setting('webhooks.config_touched', true) IS DISTINCT FROM 'on'"
}
MAX_ENTRIES = 10_000  # per process; past it the oldest go (a tenant per key: keys are many)

_entries: dict[Hashable, tuple[int, Any]] = {}
_lock = threading.Lock()  # only for adding and evicting; reads are plain dict look-ups
_newest: int | None = None  # the newest version this process has read
STALE_SQLSTATE = "WHCFG"  # webhooks migration 0008


class Stale(Exception):
    """The configuration changed after the version a request assumed: nothing was
    written; the request must start again with the version read first."""


def enabled() -> bool:
    """Whether look-ups may be kept: the setting, and a database with the version table."""
    return settings.INGEST_CONFIG_CACHE and vendor() in VENDORS


def version_sql() -> str:
    """The query for the configuration's version, for the database in use: no row where
    it cannot be trusted (see _CHANGED_HERE)."""
    return VERSION_SQL + _CHANGED_HERE.get(vendor(), "")


def current_version() -> int | None:
    """The configuration's version now, or None when it cannot be read (nothing kept)."""
    if not enabled():
        return None
    try:
        with connection.cursor() as cursor:
            cursor.execute(version_sql())
            row = cursor.fetchone()
    except DatabaseError:
        if connection.in_atomic_block:
            raise  # the caller's transaction is broken now: it must hear of it
        return None
    return _saw(row[0] if row else None)


def _saw(version: int | None) -> int | None:
    global _newest
    _newest = version
    return version


def is_stale(error: BaseException) -> bool:
    """Whether a database error is webhooks_config_check's: the version moved on."""
    cause = error.__cause__
    return getattr(cause, "sqlstate", None) == STALE_SQLSTATE


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
    source. Or it is assumed (`assume`), and then `assumed` is what the write checks."""

    def __init__(self, keep: bool = True, *, assume: bool = False) -> None:
        self.version: Any = _UNREAD if keep else None
        # assume: take the newest version this process has read instead of reading it;
        # the write must then check it (`assumed`, webhooks_config_check).
        self.assumed: int | None = None
        # Whether an answer came from what was kept under the assumed version: a request
        # that refuses on it must start again (`refuse`), as no write checks it.
        self.used_kept = False
        if keep and assume and _newest is not None:
            self.version = self.assumed = _newest

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
            self.used_kept = self.assumed is not None
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
            self.used_kept = self.assumed is not None
            return found[1]
        value, version = load()
        if value is None:
            return None  # no row, so no version either: the request ends here (404)
        if self.assumed is not None:
            self.assumed = version  # read with the rows: the write checks this one
        self.version = _saw(version)  # the newer version: later look-ups read after it
        if version is not None:
            _keep(("source", slug), version, value)
        return value

    def refuse(self) -> None:
        """Before a refusal (4xx): if it rests on what was kept under an assumed version,
        raise Stale, so that the request starts again with the version read first (a
        secret rotated or a source enabled meanwhile must apply to it)."""
        if self.used_kept:
            raise Stale("a refusal resting on an assumed version")

    def confirm(self) -> None:
        """Before a side effect that rests on kept look-ups (registering a tenant, which
        no rollback of the write undoes): read the version, and raise Stale if it is not
        the one assumed. One query, on that rare path only."""
        if self.used_kept:
            if current_version() != self.assumed:
                raise Stale("the configuration changed before a side effect")
            self.used_kept = False  # confirmed: what was kept is current as of now

    def tenant(self, key: str, load: Callable[[], Tenant | None]) -> Tenant | None:
        return self._get(("tenant", key), load)

    def endpoints(self, kind: str, pk: int, load: Callable[[], list[Endpoint]]) -> list[Endpoint]:
        return self._get((kind, pk), load)


def lookups(*, assume: bool = False) -> Lookups:
    """The look-ups for one request (no query yet). `assume`: the caller's write checks
    the version (PostgreSQL's one write statement), so none is read up front."""
    return Lookups(keep=enabled(), assume=assume and vendor() == "postgresql")


def unexpired(secrets: list[tuple[str, datetime | None]], now: datetime | None = None) -> list[str]:
    """The secrets not yet expired at `now`, in the order given."""
    now = now or timezone.now()
    return [secret for secret, expires_at in secrets if expires_at is None or expires_at > now]

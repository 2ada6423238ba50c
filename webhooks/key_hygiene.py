"""The fairness-key guard: notice when a source's key does not name tenants at all.

A fairness key should name a customer (a shop domain). Keyed on a resource id instead
(an order id), every event names a "new tenant": with auto-registration on, the tenants
table grows without bound and every event gets a lane of its own, so turns stop meaning
anything. Per source and per window (AUTO_REGISTER_WINDOW_SECONDS, an hour by default) we
count:

- distinct keys seen, and distinct keys that named no tenant (HyperLogLogs in Redis:
  about 1% error, a few KB per bucket, one pipelined round trip per key new to this
  process in the current bucket: see `note_key`);
- tenants registered (the database: exact, and it survives a Redis loss).

When a source's registrations in the window reach its limit (Source.auto_register_limit,
else AUTO_REGISTER_LIMIT), auto-registration is suspended for it: its unknown keys go to
the fallback lane (delivered as usual, never dropped), the admin warns, and the metric
`webhook_source_auto_registration_suspended` is 1. It resumes on its own once the source
has been suspended for a whole window and fewer than half its limit of unknown keys
arrived in the last window; an operator can resume it at once (an admin action), e.g.
after fixing the key's location.

Counting keys in Redis is best effort: with Redis away, ingest goes on uncounted.
"""

import logging
import math
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from weakref import WeakKeyDictionary

import redis
from django.conf import settings
from django.db.models import Count
from django.utils import timezone

from core import operational, redis_connection
from core.operational import Announcement
from tenants.models import Tenant
from webhooks.models import Source

logger = logging.getLogger(__name__)

BUCKETS_PER_WINDOW = 12
SEEN = "seen"
UNKNOWN = "unknown"
SUSPENDED_REASON = (
    "auto-registration is suspended for this source: its fairness key looks unbounded "
    "(see the source in the admin)"
)


@dataclass(frozen=True)
class KeyCounts:
    """One source's numbers for the last window."""

    seen: int | None  # distinct keys; None: Redis unavailable
    unknown: int | None  # distinct keys that named no tenant when they arrived
    registered: int  # tenants this source registered
    limit: int


def limit_for(source: Source) -> int:
    return source.auto_register_limit or settings.AUTO_REGISTER_LIMIT


def window_seconds() -> int:
    return settings.AUTO_REGISTER_WINDOW_SECONDS


def window_phrase() -> str:
    """The window in words: "hour", "2 hours", "10 min", "30 s"."""
    seconds = window_seconds()
    if seconds % 3600 == 0:
        hours = seconds // 3600
        return "hour" if hours == 1 else f"{hours} hours"
    if seconds % 60 == 0:
        return f"{seconds // 60} min"
    return f"{seconds} s"


def _bucket_seconds(window: int) -> int:
    return max(1, math.ceil(window / BUCKETS_PER_WINDOW))


def _key(source_id: int, kind: str, bucket: int) -> str:
    return f"{redis_connection.KEY_PREFIX}keys:{source_id}:{kind}:{bucket}"


def _window_keys(source_id: int, kind: str, now: float) -> list[str]:
    """The buckets that cover the last window, the current (partial) one included."""
    window = window_seconds()
    size = _bucket_seconds(window)
    current = int(now // size)
    count = math.ceil(window / size)
    return [_key(source_id, kind, bucket) for bucket in range(current - count + 1, current + 1)]


def _connection() -> redis.Redis:
    return redis_connection.shared()


# After a Redis error, counting pauses this long (per client): with Redis hanging, each
# ingest would otherwise wait out a socket timeout here before the one its enqueue waits.
PAUSE_AFTER_ERROR_SECONDS = 5.0
_paused_until: "WeakKeyDictionary[redis.Redis, float]" = WeakKeyDictionary()


# What this process has counted in the current bucket: (source id, key, known). A
# HyperLogLog does not change when a key it holds is added again, so a key counted once
# in a bucket is not sent again: a flood from one shop then costs one PFADD per bucket,
# not one round trip per event. Bounded; cleared at each new bucket. If Redis lost the
# bucket meanwhile (a restart), a key is counted again only from the next bucket.
MAX_REMEMBERED = 100_000
_counted: tuple[int, set[tuple[int, str, bool]]] = (-1, set())


def _remembered(bucket: int) -> set[tuple[int, str, bool]]:
    global _counted
    current, remembered = _counted
    if current != bucket:
        remembered = set()
        _counted = (bucket, remembered)  # one assignment: threads see one or the other
    return remembered


def forget_counted() -> None:
    """Forget what this process counted: the Redis database holding it was emptied."""
    global _counted
    _counted = (-1, set())


def note_key(source: Source, key: str, *, known: bool) -> None:
    """Count `key` as seen at `source` (and as unknown unless it named a tenant)."""
    now = time.time()
    size = _bucket_seconds(window_seconds())
    bucket = int(now // size)
    remembered = _remembered(bucket)
    # An unknown key was counted as seen too; a known one needs only that.
    if (source.pk, key, known) in remembered or (source.pk, key, False) in remembered:
        return
    connection = _connection()
    if time.monotonic() < _paused_until.get(connection, 0.0):
        return
    ttl = window_seconds() + size  # a bucket lives as long as some window still covers it
    try:
        pipe = connection.pipeline(transaction=False)
        kinds = (SEEN,) if known else (SEEN, UNKNOWN)
        for kind in kinds:
            name = _key(source.pk, kind, bucket)
            pipe.pfadd(name, key)
            pipe.expire(name, ttl)
        pipe.execute()
        if len(remembered) >= MAX_REMEMBERED:
            remembered.clear()
        remembered.add((source.pk, key, known))
    except redis.RedisError as exc:
        _paused_until[connection] = time.monotonic() + PAUSE_AFTER_ERROR_SECONDS
        logger.warning(
            "fairness-key counting paused for %.0f s (Redis: %s)", PAUSE_AFTER_ERROR_SECONDS, exc
        )


def distinct_keys(
    sources: list[Source], kinds: tuple[str, ...] = (SEEN, UNKNOWN)
) -> dict[str, dict[int, int]] | None:
    """kind -> distinct keys per source over the last window, all in one round trip;
    None without Redis."""
    now = time.time()
    wanted = [(kind, source) for kind in kinds for source in sources]
    try:
        pipe = _connection().pipeline(transaction=False)
        for kind, source in wanted:
            pipe.pfcount(*_window_keys(source.pk, kind, now))
        answers = pipe.execute()
    except redis.RedisError:
        return None
    found: dict[str, dict[int, int]] = {kind: {} for kind in kinds}
    for (kind, source), count in zip(wanted, answers, strict=True):
        found[kind][source.pk] = int(count)
    return found


def _counting_since(source: Source, now: datetime) -> datetime:
    since = now - timedelta(seconds=window_seconds())
    resumed = source.auto_register_resumed_at
    return max(since, resumed) if resumed else since


def registered_recently(source: Source, now: datetime | None = None) -> int:
    now = now or timezone.now()
    return Tenant.objects.filter(
        registered_by=source, created_at__gte=_counting_since(source, now)
    ).count()


def counts(sources: list[Source]) -> dict[int, KeyCounts]:
    """Every source's numbers for the admin and the metrics."""
    distinct = distinct_keys(sources)
    now = timezone.now()
    # One grouped query for the window; a source resumed within it counts on its own.
    registered = dict(
        Tenant.objects.filter(
            registered_by__in=sources,
            created_at__gte=now - timedelta(seconds=window_seconds()),
        )
        .values_list("registered_by")
        .annotate(Count("pk"))
    )
    for source in sources:
        if _counting_since(source, now) > now - timedelta(seconds=window_seconds()):
            registered[source.pk] = registered_recently(source, now)
    return {
        source.pk: KeyCounts(
            seen=distinct[SEEN][source.pk] if distinct is not None else None,
            unknown=distinct[UNKNOWN][source.pk] if distinct is not None else None,
            registered=registered.get(source.pk, 0),
            limit=limit_for(source),
        )
        for source in sources
    }


def suspended_sources(limit: int = 20) -> list[Source]:
    """The sources whose guard tripped: the admin warns about each."""
    return list(Source.objects.exclude(auto_register_suspended_at=None)[:limit])


def may_register(source: Source) -> tuple[bool, str]:
    """(allowed, fallback reason). Suspends the source when its registrations reach the
    limit; resumes a suspended one whose unknown keys have calmed down."""
    now = timezone.now()
    if source.auto_register_suspended_at is not None and not _calmed_down(source, now):
        return False, SUSPENDED_REASON
    limit = limit_for(source)
    registered = registered_recently(source, now)
    if registered >= limit:
        suspend(
            source,
            f"{registered} tenants registered in the last {window_phrase()} "
            f"(limit {limit}): the fairness key looks unbounded",
        )
        return False, SUSPENDED_REASON
    return True, ""


def _calmed_down(source: Source, now: datetime) -> bool:
    """A whole window suspended, and under half the limit of unknown keys in it: resume."""
    if source.auto_register_suspended_at > now - timedelta(seconds=window_seconds()):
        return False
    distinct = distinct_keys([source], (UNKNOWN,))
    if distinct is None or distinct[UNKNOWN][source.pk] >= limit_for(source) / 2:
        return False
    resume(source, by="the guard (unknown keys calmed down)")
    return True


def suspend(source: Source, reason: str) -> None:
    now = timezone.now()
    updated = Source.objects.filter(pk=source.pk, auto_register_suspended_at=None).update(
        auto_register_suspended_at=now, auto_register_suspended_reason=reason[:200]
    )
    source.auto_register_suspended_at = source.auto_register_suspended_at or now
    source.auto_register_suspended_reason = source.auto_register_suspended_reason or reason
    if updated:
        logger.warning(
            "auto-registration suspended for source %s: %s; its unknown keys now use the "
            "fallback lane",
            source.slug,
            reason,
        )
        data = {"source": source.slug, "reason": reason[:200], "suspended_at": now.isoformat()}
        operational.announce([Announcement(operational.SOURCE_KEY_UNBOUNDED, None, data)])


def resume(source: Source, *, by: str) -> None:
    """Registrations count again from now; earlier ones no longer weigh on the limit."""
    now = timezone.now()
    Source.objects.filter(pk=source.pk).update(
        auto_register_suspended_at=None,
        auto_register_suspended_reason="",
        auto_register_resumed_at=now,
    )
    source.auto_register_suspended_at = None
    source.auto_register_suspended_reason = ""
    source.auto_register_resumed_at = now
    logger.warning("auto-registration resumed for source %s by %s", source.slug, by)

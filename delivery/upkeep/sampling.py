"""Sampling history for the dashboards' charts: backlog age and delivery rate per tenant.

`sample()` runs from the maintenance sweep (an RQ job every MAINTENANCE_INTERVAL_SECONDS)
and writes at most one TenantSample row per busy tenant every HISTORY_SAMPLE_SECONDS:
the age and depth the scheduler reports now (top HISTORY_TOP_N oldest tenants, one
bounded Redis call), plus deliveries and received events counted since the previous
sample from two indexed timestamp ranges. Idle tenants write nothing. Rows older than
HISTORY_RETENTION_HOURS are deleted. So a page view reads a few dozen small rows instead
of recounting attempts, and the store stays small whatever the traffic.
"""

import logging
from datetime import datetime, timedelta

import redis
from django.conf import settings
from django.db.models import Count
from django.utils import timezone

from core import redis_connection
from core.env import env_int
from delivery.models import Delivery, TenantSample
from delivery.scheduler import get_scheduler
from tenants.models import Tenant
from webhooks.models import Event

logger = logging.getLogger(__name__)

GATE_KEY = (
    redis_connection.KEY_PREFIX + "history:gate"
)  # present while the last sample is recent enough
WINDOW_KEY = (
    redis_connection.KEY_PREFIX + "history:window-end"
)  # epoch seconds the last counted window ended
# Count up to a little before now: a delivery's row may commit a moment after the time
# stamped on it, and a window that ended at "now" would miss it for good.
COMMIT_LAG = timedelta(seconds=2)
FALLBACK = None  # the fallback lane's samples have no tenant


def _setting(name: str, default: int, minimum: int) -> int:
    """Django settings win (tests, deployments that set them); else the environment."""
    value = getattr(settings, name, None)
    return int(value) if value is not None else env_int(name, default, minimum=minimum)


def sample_seconds() -> int:
    return _setting("HISTORY_SAMPLE_SECONDS", 30, 1)


def retention_hours() -> int:
    return _setting("HISTORY_RETENTION_HOURS", 24, 1)


def top_n() -> int:
    return _setting("HISTORY_TOP_N", 500, 1)


def sample(*, force: bool = False) -> int:
    """Take one sample if the last is at least HISTORY_SAMPLE_SECONDS old; returns the rows
    written. Safe to call from several workers at once: a Redis gate lets one through."""
    scheduler = get_scheduler()
    connection = scheduler.connection
    interval = sample_seconds()
    # A little less than the interval, so a sweep that runs every `interval` seconds is not
    # turned away by a gate that has a few milliseconds left.
    if not connection.set(GATE_KEY, "1", nx=True, px=int(interval * 900)) and not force:
        return 0
    now = timezone.now()
    end = now - COMMIT_LAG
    previous = connection.getset(WINDOW_KEY, repr(end.timestamp()))
    start = (
        datetime.fromtimestamp(float(previous), tz=end.tzinfo)
        if previous is not None
        else end - timedelta(seconds=interval)
    )
    # A long pause (no worker for an hour) would smear an hour's deliveries into one point.
    start = max(start, end - timedelta(seconds=interval * 4))
    if start >= end:
        return 0
    snapshot = scheduler.snapshot(top_n=top_n())
    delivered = counts_per_tenant(
        Delivery.objects.filter(delivered_at__gt=start, delivered_at__lte=end)
    )
    received = counts_per_tenant(Event.objects.filter(received_at__gt=start, received_at__lte=end))
    seconds = (end - start).total_seconds()
    rows: dict[int | None, TenantSample] = {}

    def row(tenant_id: int | None) -> TenantSample:
        if tenant_id not in rows:
            rows[tenant_id] = TenantSample(tenant_id=tenant_id, at=now, interval_seconds=seconds)
        return rows[tenant_id]

    row(FALLBACK)  # always written: the sampler's heartbeat (see _instants)
    for tenant_row in snapshot.tenants:
        sampled = row(tenant_row.tenant_id)
        sampled.backlog_age_seconds = round(tenant_row.oldest_age_seconds, 3)
        sampled.queued = tenant_row.fresh + tenant_row.retry
        sampled.delayed = tenant_row.delayed
        sampled.in_flight = tenant_row.in_flight
    for tenant_id, n in delivered.items():
        row(tenant_id).delivered = n
    for tenant_id, n in received.items():
        row(tenant_id).received = n
    # A tenant deleted while its work was still in Redis has no row to point at.
    known = set(Tenant.objects.filter(pk__in=[t for t in rows if t]).values_list("pk", flat=True))
    kept = [r for t, r in rows.items() if t is FALLBACK or t in known]
    TenantSample.objects.bulk_create(kept, batch_size=500)
    TenantSample.objects.filter(at__lt=now - timedelta(hours=retention_hours())).delete()
    return len(kept)


def sample_quietly() -> int:
    """For the sweep: history is a nice-to-have and must never stop the schedule's repair."""
    try:
        return sample()
    except (redis.RedisError, ValueError, ArithmeticError) as exc:
        logger.warning("history sample skipped: %s", exc)
    except Exception:
        logger.exception("history sample failed")
    return 0


def counts_per_tenant(queryset) -> dict[int | None, int]:
    """Rows per tenant_id (None: the fallback lane)."""
    return dict(queryset.order_by().values_list("tenant_id").annotate(n=Count("pk")))


def last_sampled_at() -> datetime | None:
    value = get_scheduler().connection.get(WINDOW_KEY)
    if value is None:
        return None
    return datetime.fromtimestamp(float(value), tz=timezone.get_current_timezone()) + COMMIT_LAG

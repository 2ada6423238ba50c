"""History for the dashboards' charts: backlog age and delivery rate per tenant over time.

`sample()` runs from the maintenance sweep (an RQ job every MAINTENANCE_INTERVAL_SECONDS)
and writes at most one TenantSample row per busy tenant every HISTORY_SAMPLE_SECONDS:
the age and depth the scheduler reports now (top HISTORY_TOP_N oldest tenants, one
bounded Redis call), plus deliveries and received events counted since the previous
sample from two indexed timestamp ranges. Idle tenants write nothing. Rows older than
HISTORY_RETENTION_HOURS are deleted. So a page view reads a few dozen small rows instead
of recounting attempts, and the store stays small whatever the traffic.
"""

import logging
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

import redis
from django.conf import settings
from django.db.models import Count, Max, Q, Sum
from django.utils import timezone

from core import redis_connection
from core.env import env_int
from delivery.enqueueing import get_scheduler
from delivery.models import Delivery, TenantSample
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
    # 90% of the interval, so a sweep that runs every `interval` seconds is not turned away
    # by a gate that has a few milliseconds left.
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
    delivered = _counts(Delivery.objects.filter(delivered_at__gt=start, delivered_at__lte=end))
    received = _counts(Event.objects.filter(received_at__gt=start, received_at__lte=end))
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


def _counts(queryset) -> dict[int | None, int]:
    return dict(queryset.order_by().values_list("tenant_id").annotate(n=Count("pk")))


def last_sampled_at() -> datetime | None:
    value = get_scheduler().connection.get(WINDOW_KEY)
    if value is None:
        return None
    return datetime.fromtimestamp(float(value), tz=timezone.get_current_timezone()) + COMMIT_LAG


# --- reading ---------------------------------------------------------------------------


def delivered_recently(tenant_ids: Iterable[int | None] | None, seconds: int = 60) -> dict:
    """Deliveries in the last `seconds`, per tenant (None: the fallback lane). Live, from
    the delivered_at indexes: for a single tenant or the few on an overview page."""
    since = timezone.now() - timedelta(seconds=seconds)
    queryset = Delivery.objects.filter(delivered_at__gte=since)
    if tenant_ids is not None:
        ids = list(tenant_ids)
        wanted = Q(tenant_id__in=[t for t in ids if t is not None])
        if None in ids:
            wanted |= Q(tenant__isnull=True)
        queryset = queryset.filter(wanted)
    return _counts(queryset)


LIVE_COUNT_CAP = 50_000


def capped_count(queryset, cap: int = LIVE_COUNT_CAP) -> int:
    """COUNT that reads at most `cap` rows: a page refreshed every few seconds must not
    count two million held deliveries each time. `cap` itself means "at least cap"."""
    return queryset.order_by().values("pk")[:cap].count()


def received_since(tenant_id: int | None, since: datetime) -> int:
    """Events accepted since `since`. The samples' sum is cheap at any volume but misses
    what came before sampling started (a fresh deploy, the first minutes of a worker) and
    the last interval; a live count is exact but must stay cheap, so it stops at
    LIVE_COUNT_CAP rows. The larger of the two is the better answer either way."""
    samples = TenantSample.objects.filter(at__gt=since)
    events = Event.objects.filter(received_at__gte=since)
    if tenant_id is None:
        samples, events = samples.filter(tenant__isnull=True), events.filter(tenant__isnull=True)
    else:
        samples, events = samples.filter(tenant_id=tenant_id), events.filter(tenant_id=tenant_id)
    sampled = samples.aggregate(n=Sum("received"))["n"] or 0
    live = capped_count(events)
    return max(sampled, live)


@dataclass(frozen=True)
class Point:
    at: datetime
    value: float | None  # None: no sampling then (no worker ran); the line breaks


@dataclass(frozen=True)
class Series:
    age: list[Point]  # backlog age in seconds
    rate: list[Point]  # deliveries per minute


Row = tuple[float, int, float]  # backlog age, delivered, interval seconds


def tenant_series(tenant_id: int | None, since: datetime) -> Series:
    samples = TenantSample.objects.filter(at__gte=since)
    samples = (
        samples.filter(tenant__isnull=True)
        if tenant_id is None
        else samples.filter(tenant_id=tenant_id)
    )
    rows = {
        at: (age, n, s)
        for at, age, n, s in samples.values_list(
            "at", "backlog_age_seconds", "delivered", "interval_seconds"
        )
    }
    return _series(rows, _instants(since))


def platform_series(since: datetime) -> Series:
    """Everyone at once: the oldest backlog of any tenant, and all deliveries per minute."""
    grouped = (
        TenantSample.objects.filter(at__gte=since)
        .order_by()
        .values("at")
        .annotate(age=Max("backlog_age_seconds"), n=Sum("delivered"), s=Max("interval_seconds"))
        .values_list("at", "age", "n", "s")
    )
    rows = {at: (age, n, s) for at, age, n, s in grouped}
    return _series(rows, list(rows))


def _instants(since: datetime) -> list[datetime]:
    """Every moment a sample was taken: each sample writes the fallback lane's row, busy
    or not, so these rows double as the sampler's heartbeat."""
    return list(
        TenantSample.objects.filter(tenant__isnull=True, at__gte=since).values_list("at", flat=True)
    )


def _series(rows: dict[datetime, Row], instants: list[datetime]) -> Series:
    """One point per sampling instant: a tenant without a row then was idle (zero, not a
    straight line from its last busy moment to the next). Where no sample was taken
    at all for a while (no worker ran), the line breaks instead of claiming zero."""
    gap = timedelta(seconds=sample_seconds() * 2.5)
    age: list[Point] = []
    rate: list[Point] = []
    previous: datetime | None = None
    for at in sorted(set(instants) | set(rows)):
        if previous is not None and at - previous > gap:
            age.append(Point(previous + (at - previous) / 2, None))
            rate.append(Point(previous + (at - previous) / 2, None))
        backlog, delivered, seconds = rows.get(at, (0.0, 0, 0.0))
        age.append(Point(at, backlog))
        rate.append(Point(at, delivered * 60 / seconds if seconds > 0 else 0.0))
        previous = at
    return Series(age=age, rate=rate)


# --- charts (server-side SVG; the markup is templates/dashboards/chart.svg) ------------

CHART_MIN_SPAN = timedelta(minutes=10)
# (span of the chart up to this many seconds, minutes between x-axis ticks)
TICK_MINUTES = ((15 * 60, 2), (30 * 60, 5), (3600, 10))
AGE_STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 14400, 28800, 86400)


@dataclass(frozen=True)
class Tick:
    pos: float
    label: str


@dataclass(frozen=True)
class Chart:
    title: str
    width: int
    height: int
    left: int
    top: int
    plot_width: int
    plot_height: int
    line: str  # SVG path of the line: one "M… L…" run per stretch with samples
    area: str  # SVG path of the filled area under each run
    y_ticks: list[Tick]
    x_ticks: list[Tick]
    latest: str  # the newest value, formatted
    empty: bool
    color: str

    @property
    def right(self) -> int:
        return self.left + self.plot_width

    @property
    def bottom(self) -> int:
        return self.top + self.plot_height

    @property
    def middle_x(self) -> float:
        return self.left + self.plot_width / 2

    @property
    def middle_y(self) -> float:
        return self.top + self.plot_height / 2


def _nice_step(target: float, steps: Iterable[float] | None = None) -> float:
    if steps is not None:
        return next((s for s in steps if s >= target), max(steps))
    magnitude = 10 ** math.floor(math.log10(target)) if target > 0 else 1
    return next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= target)


def build_chart(
    title: str,
    points: list[Point],
    *,
    since: datetime,
    until: datetime,
    fmt: Callable[[float], str],
    duration_axis: bool = False,
    color: str = "#2563eb",
    width: int = 640,
    height: int = 200,
) -> Chart:
    left, right, top, bottom = 64, 16, 12, 28
    plot_w, plot_h = width - left - right, height - top - bottom
    visible = [p for p in points if since <= p.at <= until]
    values = [p.value for p in visible if p.value is not None]
    if visible:
        # Up to the whole window, but no emptier than needed: a flood that began three
        # minutes ago is a shape over ten minutes, not a spike at the edge of an hour.
        since = max(since, min(visible[0].at, until - CHART_MIN_SPAN))
    peak = max(values, default=0.0)
    step = _nice_step(max(peak, 1e-9) / 4, AGE_STEPS if duration_axis else None)
    if peak <= 0:
        step = AGE_STEPS[2] if duration_axis else 1
    top_value = step * max(1, math.ceil(peak / step)) if peak > 0 else step * 4
    span = (until - since).total_seconds() or 1

    def x(at: datetime) -> float:
        return left + (at - since).total_seconds() / span * plot_w

    def y(value: float) -> float:
        return top + plot_h - min(value, top_value) / top_value * plot_h

    segments: list[list[tuple[float, float]]] = [[]]
    for p in visible:
        if p.value is None:
            segments.append([])
        else:
            segments[-1].append((round(x(p.at), 1), round(y(p.value), 1)))
    base = top + plot_h
    line_parts, area_parts = [], []
    for coords in (segment for segment in segments if segment):
        line_parts.append("M" + " L".join(f"{cx},{cy}" for cx, cy in coords))
        area_parts.append(
            f"M{coords[0][0]},{base} "
            + " ".join(f"L{cx},{cy}" for cx, cy in coords)
            + f" L{coords[-1][0]},{base} Z"
        )
    line = " ".join(line_parts)
    area = " ".join(area_parts)
    y_ticks = [Tick(round(y(step * i), 1), fmt(step * i)) for i in range(int(top_value / step) + 1)]
    tick_minutes = next((m for limit, m in TICK_MINUTES if span <= limit), 60)
    first = since.replace(second=0, microsecond=0)
    first += timedelta(minutes=(-first.minute) % tick_minutes)
    if first < since:
        first += timedelta(minutes=tick_minutes)
    x_ticks = []
    at = first
    local = timezone.get_current_timezone()
    while at <= until:
        x_ticks.append(Tick(round(x(at), 1), f"{at.astimezone(local):%H:%M}"))
        at += timedelta(minutes=tick_minutes)
    return Chart(
        title=title,
        width=width,
        height=height,
        left=left,
        top=top,
        plot_width=plot_w,
        plot_height=plot_h,
        line=line,
        area=area,
        y_ticks=y_ticks,
        x_ticks=x_ticks,
        latest=fmt(values[-1]) if values else "no samples yet",
        empty=not values,
        color=color,
    )

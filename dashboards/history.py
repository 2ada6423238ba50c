"""Reading history for the dashboards: live counts that stay cheap, and the sampled series.

The samples are written by the maintenance sweep (`delivery.upkeep.sampling`); a page
view reads a few dozen small rows instead of recounting attempts.
"""

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import Max, Q, Sum
from django.utils import timezone

from delivery.models import Delivery, TenantSample
from delivery.upkeep.sampling import counts_per_tenant, sample_seconds
from webhooks.models import Event


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
    return counts_per_tenant(queryset)


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

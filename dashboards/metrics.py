"""Prometheus metrics read from the scheduler at scrape time, in the web process.

Worker processes keep no metrics of their own (a forking or restarting worker would
lose them): every figure here comes from Redis or the database when Prometheus asks.
Cardinality is bounded at any tenant count: the top-N oldest tenants and busiest
endpoints get labels, every tenant counts in one fixed-size histogram.
"""

import logging
from collections.abc import Iterator

import redis
from django.conf import settings
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import REGISTRY, Collector

from dashboards import status
from dashboards.endpoint_pace import backoff_reason
from delivery.scheduler import DEFAULT_AGE_BUCKETS, Snapshot, get_scheduler
from tenants.models import Endpoint, Tenant
from webhooks import key_hygiene
from webhooks.models import Source

logger = logging.getLogger(__name__)
FALLBACK_LABEL = "_fallback"


def age_buckets() -> tuple[float, ...]:
    """Histogram bounds, always including the alert thresholds so 'over N s' is exact."""
    return tuple(sorted(set(DEFAULT_AGE_BUCKETS) | set(settings.METRICS_AGE_THRESHOLDS)))


def _tenant_labels(snapshot: Snapshot) -> dict[int | None, str]:
    ids = [row.tenant_id for row in snapshot.tenants if row.tenant_id is not None]
    labels: dict[int | None, str] = dict(Tenant.objects.filter(pk__in=ids).values_list("pk", "key"))
    labels[None] = FALLBACK_LABEL
    return labels


def _endpoint_labels(snapshot: Snapshot) -> dict[int, str]:
    ids = [row.endpoint_id for row in snapshot.endpoints]
    return {pk: f"{pk}" for pk in Endpoint.objects.filter(pk__in=ids).values_list("pk", flat=True)}


class ScheduleCollector(Collector):
    def describe(self) -> list[Metric]:
        # Without this, registering would run a whole scrape (Redis and database queries)
        # at start-up, before migrations may even have run.
        return []

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily(
            "webhook_scheduler_up", "1 if the scheduler's Redis answered this scrape."
        )
        try:
            scheduler = get_scheduler()
            buckets = age_buckets()
            snapshot = scheduler.snapshot(top_n=settings.METRICS_TOP_N, age_buckets=buckets)
            counters = scheduler.counters()
        except redis.RedisError as exc:
            logger.warning("metrics: scheduler unavailable: %s", exc)
            up.add_metric([], 0)
            yield up
            yield from self._database_metrics()
            return
        up.add_metric([], 1)
        yield up
        yield from self._age_metrics(snapshot, buckets)
        yield from self._status_metrics(snapshot)
        yield from self._depth_metrics(snapshot)
        yield from self._counter_metrics(snapshot, counters)
        yield from self._endpoint_metrics(snapshot)
        yield from self._database_metrics()

    def _age_metrics(self, snapshot: Snapshot, buckets: tuple[float, ...]) -> Iterator[Metric]:
        labels = _tenant_labels(snapshot)
        per_tenant = GaugeMetricFamily(
            "webhook_backlog_age_seconds",
            "Age of the oldest undelivered delivery, for the top-N oldest backlogged tenants.",
            labels=["tenant"],
        )
        for row in snapshot.tenants:
            per_tenant.add_metric(
                [labels.get(row.tenant_id, str(row.tenant_id))], row.oldest_age_seconds
            )
        yield per_tenant
        histogram = HistogramMetricFamily(
            "webhook_tenant_backlog_age_seconds",
            "Backlog age of every backlogged tenant (a fixed number of series at any tenant count).",
            buckets=[(repr(bound), snapshot.age_histogram[bound]) for bound in buckets]
            + [("+Inf", snapshot.backlogged_tenants)],
            sum_value=None,
        )
        yield histogram
        yield GaugeMetricFamily(
            "webhook_backlog_age_max_seconds",
            "Age of the oldest undelivered delivery of any tenant.",
            value=snapshot.oldest_age_seconds,
        )
        yield GaugeMetricFamily(
            "webhook_tenants_backlogged",
            "Tenants with queued deliveries.",
            value=snapshot.backlogged_tenants,
        )
        over = GaugeMetricFamily(
            "webhook_tenants_over_threshold",
            "Tenants whose oldest queued delivery is older than the threshold (seconds).",
            labels=["threshold"],
        )
        for threshold in settings.METRICS_AGE_THRESHOLDS:
            over.add_metric(
                [f"{threshold:g}"], snapshot.backlogged_tenants - snapshot.age_histogram[threshold]
            )
        yield over

    def _status_metrics(self, snapshot: Snapshot) -> Iterator[Metric]:
        """The top-N tenants' pacing status (dashboards.status, the one the overview and the
        tenants' own pages show), one series per tenant: 1 on its current status."""
        family = GaugeMetricFamily(
            "webhook_tenant_status",
            "Pacing status of the top-N oldest backlogged tenants (1 = current), judged "
            "over the last 30 s as on the dashboards.",
            labels=["tenant", "status"],
        )
        tenants = status.tenants_of(r.tenant_id for r in snapshot.tenants)
        for key, found in status.read(tenants, snapshot).items():
            label = FALLBACK_LABEL if key is None else found.tenant.key
            family.add_metric([label, found.code], 1)
        yield family

    def _depth_metrics(self, snapshot: Snapshot) -> Iterator[Metric]:
        depth = GaugeMetricFamily(
            "webhook_lane_depth", "Queued deliveries by lane.", labels=["lane"]
        )
        depth.add_metric(["fresh"], snapshot.fresh_depth)
        depth.add_metric(["retry"], snapshot.retry_depth)
        depth.add_metric(["delayed"], snapshot.delayed_depth)
        depth.add_metric(["fallback"], snapshot.fallback_depth)
        yield depth
        yield GaugeMetricFamily(
            "webhook_in_flight", "Deliveries leased to workers now.", value=snapshot.in_flight
        )

    def _counter_metrics(self, snapshot: Snapshot, counters: dict[str, int]) -> Iterator[Metric]:
        outcomes = CounterMetricFamily(
            "webhook_deliveries", "Finished delivery attempts by outcome.", labels=["outcome"]
        )
        for outcome in ("delivered", "retry", "dead", "held"):
            outcomes.add_metric([outcome], counters.get(outcome, 0))
        yield outcomes
        yield CounterMetricFamily(
            "webhook_deferrals",
            "Times work was not handed out because its endpoint was at its cap (never an attempt).",
            value=snapshot.deferrals_total,
        )
        yield CounterMetricFamily(
            "webhook_retries_scheduled",
            "Deliveries put back for a later retry.",
            value=counters.get("retry", 0),
        )
        yield CounterMetricFamily(
            "webhook_dead_letters",
            "Deliveries that exhausted their retries.",
            value=counters.get("dead", 0),
        )
        yield CounterMetricFamily(
            "webhook_fallback_enqueued",
            "Deliveries that entered the fallback lane (events without a tenant key).",
            value=snapshot.fallback_enqueued_total,
        )

    def _endpoint_metrics(self, snapshot: Snapshot) -> Iterator[Metric]:
        labels = _endpoint_labels(snapshot)
        in_flight = GaugeMetricFamily(
            "webhook_endpoint_in_flight",
            "In-flight requests, top-N busiest endpoints.",
            labels=["endpoint"],
        )
        cap = GaugeMetricFamily(
            "webhook_endpoint_max_in_flight",
            "Concurrency cap, top-N busiest endpoints.",
            labels=["endpoint"],
        )
        limit = GaugeMetricFamily(
            "webhook_endpoint_adaptive_limit",
            "Adaptive in-flight limit under the cap, top-N busiest endpoints whose limit "
            "adapts (DELIVERY_ADAPTIVE_CONCURRENCY).",
            labels=["endpoint"],
        )
        budget = GaugeMetricFamily(
            "webhook_endpoint_retry_budget",
            "Retry tokens held (under one, its queued retries wait), top-N busiest endpoints "
            "and those waiting for a token.",
            labels=["endpoint"],
        )
        for row in snapshot.endpoints:
            label = labels.get(row.endpoint_id, str(row.endpoint_id))
            in_flight.add_metric([label], row.in_flight)
            cap.add_metric([label], row.max_in_flight)
            if row.adaptive_limit is not None:
                limit.add_metric([label], row.adaptive_limit)
            if row.retry_budget is not None:
                budget.add_metric([label], row.retry_budget)
        yield in_flight
        yield cap
        yield limit
        yield budget
        yield from _adaptive_why(snapshot, labels)

    def _database_metrics(self) -> Iterator[Metric]:
        fallback = CounterMetricFamily(
            "webhook_fallback_events",
            "Ingested events without a usable tenant key, per source.",
            labels=["source"],
        )
        sources = list(Source.objects.all())
        for source in sources:
            fallback.add_metric([source.slug], source.fallback_count)
        yield fallback
        yield from self._key_guard_metrics(sources)
        yield GaugeMetricFamily(
            "webhook_endpoints_disabled",
            "Endpoints disabled (by a 410, persistent failure or an operator).",
            value=Endpoint.objects.filter(enabled=False).count(),
        )

    def _key_guard_metrics(self, sources: list[Source]) -> Iterator[Metric]:
        """The fairness-key guard (webhooks.key_hygiene), per source, over its window."""
        suspended = GaugeMetricFamily(
            "webhook_source_auto_registration_suspended",
            "1 when a source's fairness key looked unbounded and auto-registration stopped.",
            labels=["source"],
        )
        registered = GaugeMetricFamily(
            "webhook_source_tenants_registered_recent",
            "Tenants a source registered automatically in the guard's window.",
            labels=["source"],
        )
        seen = GaugeMetricFamily(
            "webhook_source_keys_seen_recent",
            "Distinct fairness keys a source sent in the guard's window (estimate).",
            labels=["source"],
        )
        unknown = GaugeMetricFamily(
            "webhook_source_unknown_keys_recent",
            "Distinct keys in the window that named no tenant when they arrived (estimate).",
            labels=["source"],
        )
        numbers_by_source = key_hygiene.counts(sources)
        for source in sources:
            slug, numbers = source.slug, numbers_by_source[source.pk]
            suspended.add_metric([slug], 1 if source.auto_register_suspended_at else 0)
            registered.add_metric([slug], numbers.registered)
            if numbers.seen is not None:
                seen.add_metric([slug], numbers.seen)
            if numbers.unknown is not None:
                unknown.add_metric([slug], numbers.unknown)
        yield from (suspended, registered, seen, unknown)


_registered = False


def register() -> None:
    """Once per process; django-prometheus serves the default registry at /metrics."""
    global _registered
    if not _registered:
        REGISTRY.register(ScheduleCollector())
        _registered = True


def _adaptive_why(snapshot: Snapshot, labels: dict[int, str]) -> Iterator[Metric]:
    """Why each listed adaptive limit is where it is: the latencies it moves on and its
    last backoff, labelled with what caused it (answers too slow, or answers that said
    the endpoint was past its capacity)."""
    latency = GaugeMetricFamily(
        "webhook_endpoint_adaptive_latency_seconds",
        "Answers' recent latency and the endpoint's own baseline that its adaptive limit "
        "moves on, top-N busiest endpoints whose limit adapts.",
        labels=["endpoint", "which"],
    )
    backed_off_at = GaugeMetricFamily(
        "webhook_endpoint_adaptive_backoff_timestamp_seconds",
        "When its adaptive limit last backed off, and why: reason=latency (answers slowed "
        "against its baseline) or overload (429, 503, a timeout or refused connection).",
        labels=["endpoint", "reason"],
    )
    backed_off_from = GaugeMetricFamily(
        "webhook_endpoint_adaptive_backoff_from",
        "Its adaptive limit before the last backoff (the limit now is "
        "webhook_endpoint_adaptive_limit).",
        labels=["endpoint", "reason"],
    )
    for row in snapshot.endpoints:
        if row.adaptive_limit is None:
            continue
        label = labels.get(row.endpoint_id, str(row.endpoint_id))
        for which, value in (("recent", row.latency_ms), ("baseline", row.baseline_ms)):
            if value:  # none measured yet
                latency.add_metric([label, which], value / 1000)
        reason = backoff_reason(row)
        if reason is not None:
            backed_off_at.add_metric([label, reason], row.backed_off_at)
            if row.backed_off_from is not None:
                backed_off_from.add_metric([label, reason], row.backed_off_from)
    yield latency
    yield backed_off_at
    yield backed_off_from

"""Tenant-facing pages: a tenant's own dashboard, its live JSON status and its charts.

Every view goes through dashboards.access.tenant_view (membership or a share link). What a
tenant sees is built by `tenant_status()`, from the scheduler's snapshot (Redis, one
bounded call) and a few indexed queries on the tenant's own rows. Other tenants appear
only as counts ("sharing turns with 3 other tenants"), never by key or name.
"""

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import redis
from django.contrib.auth.decorators import login_required
from django.db.models import Min
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.template.loader import render_to_string
from django.urls import reverse, reverse_lazy
from django.utils import timezone

from dashboards import pacing
from dashboards.access import TenantAccess, tenant_view
from delivery import history
from delivery.enqueueing import get_scheduler
from delivery.models import Attempt, Delivery
from delivery.scheduler import Snapshot, TenantRow
from tenants.models import Endpoint, Tenant
from webhooks.models import Event

FAILURES_SHOWN = 8
EXCERPT_CHARS = 300
HISTORY_WINDOW = timedelta(hours=1)
POLL_SECONDS = 3
CHARTS = {"backlog-age", "delivered"}
# Drawn about this wide on a laptop, so the axis labels come out at their font size.
CHART_WIDTH, CHART_HEIGHT = 480, 200


# --- what a tenant sees ----------------------------------------------------------------


@dataclass(frozen=True)
class Live:
    """The scheduler's view of one tenant, and the others as counts."""

    row: TenantRow | None
    snapshot: Snapshot | None  # None: Redis did not answer

    @property
    def available(self) -> bool:
        return self.snapshot is not None


def read_live(tenant: Tenant) -> Live:
    try:
        snapshot = get_scheduler().snapshot(top_n=history.top_n())
    except redis.RedisError:
        return Live(row=None, snapshot=None)
    row = next((r for r in snapshot.tenants if r.tenant_id == tenant.pk), None)
    if row is None and snapshot.backlogged_tenants > len(snapshot.tenants):
        row = _row_from_database(tenant)  # beyond the top-N oldest: ask the truth instead
    return Live(row=row, snapshot=snapshot)


def _row_from_database(tenant: Tenant) -> TenantRow | None:
    pending = Delivery.objects.filter(
        tenant=tenant, status=Delivery.PENDING, endpoint__enabled=True
    )
    oldest = pending.aggregate(at=Min("enqueued_at"))["at"]
    if oldest is None:
        return None
    return TenantRow(
        tenant_id=tenant.pk,
        fresh=pending.count(),
        retry=0,
        delayed=Delivery.objects.filter(tenant=tenant, status=Delivery.RETRY_SCHEDULED).count(),
        in_flight=0,
        oldest_age_seconds=(timezone.now() - oldest).total_seconds(),
        weight=tenant.weight,
        paused=not tenant.is_active,
    )


def _endpoints_of(tenant: Tenant) -> list[Endpoint]:
    """The tenant's own endpoints, plus shared destinations its recent events went to."""
    recent_events = Event.objects.filter(tenant=tenant).order_by("-received_at")[:50]
    shared_ids = (
        Delivery.objects.filter(event__in=recent_events, endpoint__tenant__isnull=True)
        .values_list("endpoint_id", flat=True)
        .distinct()
    )
    own = list(Endpoint.objects.filter(tenant=tenant).order_by("pk"))
    shared = list(Endpoint.objects.filter(pk__in=list(shared_ids)).order_by("pk"))
    return own + shared


def _endpoint_label(endpoint: Endpoint) -> str:
    # A shared destination belongs to the platform, not this tenant: no URL.
    if endpoint.tenant_id is None:
        return endpoint.description or "the shared destination"
    return endpoint.url


def _recent_failures(tenant: Tenant) -> list[dict[str, Any]]:
    deliveries = list(
        Delivery.objects.filter(
            tenant=tenant,
            status__in=[Delivery.RETRY_SCHEDULED, Delivery.DEAD, Delivery.HELD],
        )
        .select_related("event", "endpoint")
        .order_by("-updated_at")[:FAILURES_SHOWN]
    )
    latest: dict[str, Attempt] = {}
    for attempt in Attempt.objects.filter(delivery_id__in=[d.id for d in deliveries]).order_by(
        "delivery_id", "-number"
    ):
        latest.setdefault(attempt.delivery_id, attempt)
    failures = []
    for delivery in deliveries:
        attempt = latest.get(delivery.id)
        failures.append(
            {
                "delivery_id": delivery.id,
                "event_type": delivery.event.event_type,
                "endpoint": _endpoint_label(delivery.endpoint),
                "status": delivery.get_status_display(),
                "attempts": delivery.attempts,
                "status_code": attempt.status_code if attempt else None,
                "error": (attempt.error if attempt else "") or delivery.last_error,
                "response_excerpt": (attempt.response_excerpt if attempt else "")[:EXCERPT_CHARS],
                "attempted_at": _iso(attempt.started_at if attempt else None),
                "next_retry_at": _iso(delivery.next_attempt_at)
                if delivery.status == Delivery.RETRY_SCHEDULED
                else None,
            }
        )
    return failures


def _last_error(failures: list[dict[str, Any]], label: str) -> str:
    for failure in failures:
        if failure["endpoint"] == label:
            if failure["status_code"]:
                return f"HTTP {failure['status_code']}"
            return failure["error"][:80]
    return ""


def tenant_status(tenant: Tenant) -> dict[str, Any]:
    """Everything the dashboard shows, as JSON-ready values (and their words)."""
    now = timezone.now()
    live = read_live(tenant)
    row = live.row
    endpoints = _endpoints_of(tenant)
    capacity = {e.endpoint_id: e for e in live.snapshot.endpoints} if live.snapshot else {}
    # Held work waits only on disabled endpoints; retries' next due time matters only on
    # failing ones. Asking just for those keeps each poll cheap during a flood.
    held = {
        e.pk: history.capped_count(
            Delivery.objects.filter(endpoint=e, tenant=tenant, status=Delivery.HELD)
        )
        for e in endpoints
        if not e.enabled
    }
    next_retry: dict[int, datetime] = {}
    for endpoint in endpoints:
        if endpoint.enabled and endpoint.consecutive_failures:
            due = (
                Delivery.objects.filter(
                    endpoint=endpoint, tenant=tenant, status=Delivery.RETRY_SCHEDULED
                )
                .order_by("next_attempt_at")
                .values_list("next_attempt_at", flat=True)
                .first()
            )
            if due is not None:
                next_retry[endpoint.pk] = due
    # No row: nothing is queued, so every retry the database knows of waits for its time.
    retrying = (
        0
        if row
        else history.capped_count(
            Delivery.objects.filter(tenant=tenant, status=Delivery.RETRY_SCHEDULED)
        )
    )
    failures = _recent_failures(tenant)
    endpoint_facts = []
    for endpoint in endpoints:
        label = _endpoint_label(endpoint)
        endpoint_facts.append(
            pacing.EndpointFacts(
                label=label,
                enabled=endpoint.enabled,
                max_in_flight=endpoint.max_in_flight,
                consecutive_failures=endpoint.consecutive_failures,
                held=held.get(endpoint.pk, 0),
                disabled_reason=endpoint.disabled_reason,
                failing_since=endpoint.failing_since,
                last_error=_last_error(failures, label),
                next_retry_at=next_retry.get(endpoint.pk),
                **pacing.live_endpoint_fields(capacity.get(endpoint.pk)),
            )
        )
    last_minute = history.delivered_recently([tenant.pk]).get(tenant.pk, 0)
    last_window = history.delivered_recently([tenant.pk], pacing.RECENT_WINDOW_SECONDS).get(
        tenant.pk, 0
    )
    facts = pacing.TenantFacts(
        weight=tenant.weight,
        paused=not tenant.is_active or bool(row and row.paused),
        fresh=row.fresh if row else 0,
        retry=row.retry if row else 0,
        delayed=row.delayed if row else retrying,
        in_flight=row.in_flight if row else 0,
        held=sum(held.values()),
        oldest_age_seconds=row.oldest_age_seconds if row else 0.0,
        delivered_last_minute=last_minute,
        rate_per_second=pacing.recent_rate(last_minute, last_window),
        received_recently=history.received_since(
            tenant.pk, now - timedelta(minutes=pacing.RECEIVED_WINDOW_MINUTES)
        ),
        endpoints=tuple(endpoint_facts),
        rate_limit_per_second=tenant.effective_rate_per_second(),
        rate_limited=bool(row and row.rate_limited),
    )
    platform = pacing.platform_facts(live.snapshot)
    assessed = pacing.assess(facts, platform, now=now, tz=timezone.get_current_timezone())
    sampled_at = history.last_sampled_at() if live.available else None
    return {
        "tenant": {"key": tenant.key, "name": str(tenant), "weight": tenant.weight},
        "generated_at": _iso(now),
        "live": live.available,
        "status": {
            "code": str(assessed.status),
            "label": assessed.label,
            "headline": assessed.headline,
            "explanation": assessed.explanation
            if live.available
            else "Live numbers are unavailable for a moment; your events are safe and "
            "will be delivered.",
            "reasons": [str(r) for r in assessed.reasons],
        },
        "backlog": {
            "age_seconds": round(facts.oldest_age_seconds, 1),
            "age_text": pacing.duration(facts.oldest_age_seconds) if facts.queued else "none",
            "fresh": facts.fresh,
            "retry": facts.retry,
            "delayed": facts.delayed,
            "in_flight": facts.in_flight,
            "held": facts.held,
            "waiting": facts.waiting,
            "waiting_text": pacing.human_count(facts.waiting),
        },
        "delivered_per_minute": facts.delivered_last_minute,
        # The card shows the current pace, the same number the explanation uses.
        "delivered_text": pacing.human_count(assessed.rate_per_second * 60),
        "rate_text": pacing.rate_phrase(assessed.rate_per_second),
        "received_last_10_minutes": facts.received_recently,
        "share_of_turns": {
            "fraction": round(assessed.share_of_turns, 4),
            "text": pacing.percent(assessed.share_of_turns),
            "weight": tenant.weight,
            "other_backlogged_tenants": assessed.other_backlogged,
        },
        "drain": {
            "seconds": round(assessed.drain_seconds) if assessed.drain_seconds else None,
            "text": _drain_text(assessed, facts),
            "clears_at": _iso(assessed.clears_at),
        },
        "endpoints": [
            _endpoint_json(endpoint, fact)
            for endpoint, fact in zip(endpoints, endpoint_facts, strict=True)
        ],
        "failures": failures,
        "history": {
            "last_sampled_at": _iso(sampled_at),
            "sample_seconds": history.sample_seconds(),
        },
    }


def _drain_text(assessed: pacing.Pacing, facts: pacing.TenantFacts) -> str:
    if facts.paused:
        return "paused"
    if facts.queued + facts.in_flight == 0:
        return "nothing to drain"
    if assessed.drain_seconds is None:
        return "estimating…"
    return pacing.duration(assessed.drain_seconds)


def _endpoint_json(endpoint: Endpoint, fact: pacing.EndpointFacts) -> dict[str, Any]:
    if not endpoint.enabled:
        state, text = "disabled", "disabled" + (f", {fact.held} held" if fact.held else "")
    elif fact.waiting_for_retry_after:
        until = pacing.clock(fact.paused_until, timezone.now(), timezone.get_current_timezone())
        state, text = "endpoint_wait", f"asked us to wait (Retry-After) until {until}"
    elif fact.failing:
        state, text = "failing", f"failing ({fact.consecutive_failures} in a row)"
    elif fact.at_cap:
        state, text = "at_cap", "at its concurrency cap"
    elif fact.at_rate:
        state, text = "rate_limited", f"at its rate limit ({fact.rate_per_second:g} per second)"
    else:
        state, text = "healthy", "healthy"
    return {
        "label": fact.label,
        "shared": endpoint.tenant_id is None,
        "state": state,
        "state_text": text,
        "in_flight": fact.in_flight,
        "max_in_flight": fact.max_in_flight,
        "rate_limit_per_second": fact.rate_per_second,
        "paused_until": _iso(fact.paused_until),
        "consecutive_failures": fact.consecutive_failures,
        "held": fact.held,
        "disabled_reason": endpoint.disabled_reason,
        "last_success_at": _iso(endpoint.last_success_at),
        "next_retry_at": _iso(fact.next_retry_at),
    }


def _iso(when: datetime | None) -> str | None:
    return when.isoformat() if when else None


def tenant_charts(tenant: Tenant) -> dict[str, history.Chart]:
    until = timezone.now()
    since = until - HISTORY_WINDOW
    series = history.tenant_series(tenant.pk, since)
    return {
        "backlog-age": history.build_chart(
            "Backlog age (oldest waiting event)",
            series.age,
            since=since,
            until=until,
            fmt=pacing.duration,
            duration_axis=True,
            width=CHART_WIDTH,
            height=CHART_HEIGHT,
        ),
        "delivered": history.build_chart(
            "Delivered per minute",
            series.rate,
            since=since,
            until=until,
            fmt=pacing.human_count,
            color="#059669",
            width=CHART_WIDTH,
            height=CHART_HEIGHT,
        ),
    }


# --- views -------------------------------------------------------------------------------


def _urls(access: TenantAccess) -> dict[str, Any]:
    """The page's own URLs, through the share link when that is how it was opened."""
    if access.shared:
        args: list[str] = [access.tenant.key, str(access.share_token)]
        status, chart = "tenants:shared-status", "tenants:shared-chart"
    else:
        args = [access.tenant.key]
        status, chart = "tenants:status", "tenants:chart"
    return {
        "status": reverse(status, args=args),
        "charts": {name: reverse(chart, args=[*args, name]) for name in sorted(CHARTS)},
    }


@tenant_view
def dashboard(request: HttpRequest, access: TenantAccess) -> HttpResponse:
    status = tenant_status(access.tenant)
    urls = _urls(access)
    charts = tenant_charts(access.tenant)
    return render(
        request,
        "dashboards/tenant.html",
        {
            "access": access,
            "tenant": access.tenant,
            "s": status,
            # Template variables cannot hold a hyphen: backlog-age -> backlog_age.
            "charts": {name.replace("-", "_"): chart for name, chart in charts.items()},
            "status_url": urls["status"],
            "chart_urls": {name.replace("-", "_"): url for name, url in urls["charts"].items()},
            "poll_seconds": POLL_SECONDS,
        },
    )


@tenant_view
def status_json(request: HttpRequest, access: TenantAccess) -> JsonResponse:
    return JsonResponse(tenant_status(access.tenant))


@tenant_view
def chart_svg(request: HttpRequest, access: TenantAccess, name: str) -> HttpResponse:
    charts = tenant_charts(access.tenant)
    if name not in charts:
        return HttpResponse("no such chart\n", status=404, content_type="text/plain")
    body = render_to_string("dashboards/chart.svg", {"chart": charts[name], "standalone": True})
    return HttpResponse(body, content_type="image/svg+xml")


@login_required(login_url=reverse_lazy("tenants:login"))
def home(request: HttpRequest) -> HttpResponse:
    """The tenants this user may see; straight to the dashboard when there is one."""
    tenants = list(Tenant.objects.filter(memberships__user=request.user).order_by("key"))
    if len(tenants) == 1 and not request.user.is_staff:
        return redirect("tenants:dashboard", key=tenants[0].key)
    return render(request, "dashboards/home.html", {"tenants": tenants})

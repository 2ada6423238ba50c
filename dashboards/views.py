"""Tenant-facing pages: a tenant's own dashboard, its live JSON status and its charts.

Every view goes through dashboards.access.tenant_view (membership or a share link). What a
tenant sees is built by `tenant_status()`, from the scheduler's snapshot (Redis, one
bounded call) and a few indexed queries on the tenant's own rows. Other tenants appear
only as counts ("sharing turns with 3 other tenants"), never by key or name.
"""

from datetime import datetime, timedelta
from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.template.loader import render_to_string
from django.urls import reverse, reverse_lazy
from django.utils import timezone

from dashboards import charts, history, pacing, status
from dashboards.access import TenantAccess, is_tenant_admin, tenant_view
from delivery.models import Attempt, Delivery
from delivery.upkeep import sampling
from tenants.models import Endpoint, Tenant

FAILURES_SHOWN = 8
EXCERPT_CHARS = 300
HISTORY_WINDOW = timedelta(hours=1)
POLL_SECONDS = 3
HOME_TENANTS_SHOWN = 200  # staff see every tenant: the rest are a search in the admin away
CHARTS = {"backlog-age", "delivered"}
UNKNOWN_DRAIN = "unknown"
ERROR_CHARS = 160  # the message page shows the whole error; the failures table a glance
# Drawn about this wide on a laptop, so the axis labels come out at their font size.
CHART_WIDTH, CHART_HEIGHT = 480, 200


# --- what a tenant sees ----------------------------------------------------------------


def _endpoint_label(endpoint: Endpoint) -> str:
    # A shared destination belongs to the platform, not this tenant: no URL.
    if endpoint.tenant_id is None:
        return endpoint.description or "the shared destination"
    return endpoint.url


def _recent_failures(tenant: Tenant) -> list[dict[str, Any]]:
    """The tenant's latest deliveries whose last attempt failed: waiting for a retry, or
    dead. Held deliveries are not failures (the endpoints table counts them): listed
    here, the newest of them would push the failures they wait behind off the page."""
    now = timezone.now()
    deliveries = list(
        Delivery.objects.filter(
            tenant=tenant,
            status__in=[Delivery.Status.RETRY_SCHEDULED, Delivery.Status.DEAD],
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
                "endpoint_id": delivery.endpoint_id,
                "status": delivery.get_status_display(),
                "attempts": delivery.attempts,
                "status_code": attempt.status_code if attempt else None,
                "error": ((attempt.error if attempt else "") or delivery.last_error)[:ERROR_CHARS],
                "response_excerpt": (attempt.response_excerpt if attempt else "")[:EXCERPT_CHARS],
                "attempted_at": _iso(attempt.started_at if attempt else None),
                "next_retry_at": _iso(delivery.next_attempt_at)
                if delivery.status == Delivery.Status.RETRY_SCHEDULED
                else None,
                # Its time has come: it waits for its turn and a free slot.
                "retry_due_now": delivery.status == Delivery.Status.RETRY_SCHEDULED
                and delivery.next_attempt_at is not None
                and delivery.next_attempt_at <= now,
            }
        )
    return failures


def _last_errors(failures: list[dict[str, Any]]) -> dict[int, str]:
    """Each endpoint's latest error, from the recent failures (newest first)."""
    errors: dict[int, str] = {}
    for failure in failures:
        text = f"HTTP {failure['status_code']}" if failure["status_code"] else failure["error"][:80]
        errors.setdefault(failure["endpoint_id"], text)
    return errors


def tenant_status(tenant: Tenant) -> dict[str, Any]:
    """Everything the dashboard shows, as JSON-ready values (and their words). The status
    is dashboards.status's, the one the operators' overview and `lanes` show too."""
    now = timezone.now()
    snapshot = status.take_snapshot()
    failures = _recent_failures(tenant)
    found = status.read(
        [tenant],
        snapshot,
        now=now,
        tz=timezone.get_current_timezone(),
        label=_endpoint_label,
        last_errors=_last_errors(failures),
        detail=True,
    )[tenant.pk]
    facts, assessed = found.facts, found.assessed
    live = snapshot is not None
    sampled_at = sampling.last_sampled_at() if live else None
    return {
        "tenant": {"key": tenant.key, "name": str(tenant), "weight": tenant.weight},
        "generated_at": _iso(now),
        "live": live,
        "status": _status_json(assessed, live=live),
        "backlog": _backlog_json(facts),
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
            # The estimate divides by the recent pace: with nothing delivered, there is none.
            "detail": "nothing went out lately to estimate from"
            if _drain_text(assessed, facts) == UNKNOWN_DRAIN
            else "at the current pace",
        },
        "endpoints": [
            _endpoint_json(endpoint, fact)
            for endpoint, fact in zip(found.endpoints, facts.endpoints, strict=True)
        ],
        "failures": failures,
        "history": {
            "last_sampled_at": _iso(sampled_at),
            "sample_seconds": sampling.sample_seconds(),
        },
    }


def _status_json(assessed: pacing.Pacing, *, live: bool) -> dict[str, Any]:
    return {
        "code": str(assessed.status),
        "label": assessed.label,
        "headline": assessed.headline,
        # Without Redis the numbers an explanation quotes are unknown: reassure instead.
        "explanation": assessed.explanation
        if live
        else "Live numbers are unavailable for a moment; your events are safe and "
        "will be delivered.",
        "reasons": [str(r) for r in assessed.reasons],
    }


def _backlog_json(facts: pacing.TenantFacts) -> dict[str, Any]:
    return {
        "age_seconds": round(facts.oldest_age_seconds, 1),
        "age_text": _age_text(facts),
        "fresh": facts.fresh,
        "retry": facts.retry,
        "delayed": facts.delayed,
        "in_flight": facts.in_flight,
        "held": facts.held,
        "dead": facts.dead,
        "waiting": facts.waiting,
        "waiting_text": pacing.human_count(facts.waiting),
    }


def _age_text(facts: pacing.TenantFacts) -> str:
    """The oldest queued event's age; with nothing queued, say what still waits (retries
    due later, held work) rather than a bare "none" while events are undelivered."""
    if facts.queued:
        return pacing.duration(facts.oldest_age_seconds)
    if facts.delayed:
        n = facts.delayed
        return f"none queued; {pacing.human_count(n)} {'retry' if n == 1 else 'retries'} due later"
    if facts.held:
        return f"none queued; {pacing.human_count(facts.held)} held"
    return "none"


def _drain_text(assessed: pacing.Pacing, facts: pacing.TenantFacts) -> str:
    if facts.paused:
        return "paused"
    if facts.queued + facts.in_flight == 0:
        return "nothing to drain"
    if assessed.drain_seconds is None:
        return UNKNOWN_DRAIN
    return pacing.duration(assessed.drain_seconds)


def _endpoint_json(endpoint: Endpoint, fact: pacing.EndpointFacts) -> dict[str, Any]:
    if not endpoint.enabled:
        state, text = "disabled", "disabled" + (f", {fact.held} held" if fact.held else "")
    elif fact.waiting_for_retry_after:
        until = pacing.clock(fact.paused_until, timezone.now(), timezone.get_current_timezone())
        state, text = "endpoint_wait", f"asked us to wait (Retry-After) until {until}"
    elif fact.failing:
        state, text = "failing", f"failing ({fact.consecutive_failures} in a row)"
    elif fact.at_cap and fact.in_flight_limit < fact.max_in_flight:
        state, text = (
            "at_cap",
            f"at its adaptive limit ({fact.in_flight_limit} of cap {fact.max_in_flight})",
        )
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
        "limit": fact.in_flight_limit,
        "rate_limit_per_second": fact.rate_per_second,
        "paused_until": _iso(fact.paused_until),
        "consecutive_failures": fact.consecutive_failures,
        "held": fact.held,
        "disabled_reason": endpoint.disabled_reason,
        "last_success_at": _iso(endpoint.last_success_at),
        "next_retry_at": _iso(fact.next_retry_at),
        "retries_due": fact.retries_due,
    }


def _iso(when: datetime | None) -> str | None:
    return when.isoformat() if when else None


def tenant_charts(tenant: Tenant) -> dict[str, charts.Chart]:
    until = timezone.now()
    since = until - HISTORY_WINDOW
    series = history.tenant_series(tenant.pk, since)
    return {
        "backlog-age": charts.build_chart(
            "Backlog age (oldest waiting event)",
            series.age,
            since=since,
            until=until,
            fmt=pacing.duration,
            duration_axis=True,
            width=CHART_WIDTH,
            height=CHART_HEIGHT,
        ),
        "delivered": charts.build_chart(
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
            # The portal's links (endpoints, audit) are for members, never a share link.
            "is_admin": is_tenant_admin(request, access),
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
    """The tenants this user may see; straight to the dashboard when there is one. Staff
    who may view tenants see every dashboard (the access rules let them open any)."""
    user = request.user
    everyone = user.is_staff and user.has_perm("tenants.view_tenant")
    tenants = Tenant.objects.all() if everyone else Tenant.objects.filter(memberships__user=user)
    shown = list(tenants.order_by("key")[: HOME_TENANTS_SHOWN + 1])
    if len(shown) == 1 and not user.is_staff:
        return redirect("tenants:dashboard", key=shown[0].key)
    return render(
        request,
        "dashboards/home.html",
        {
            "tenants": shown[:HOME_TENANTS_SHOWN],
            "more": len(shown) > HOME_TENANTS_SHOWN,
            "everyone": everyone,
        },
    )

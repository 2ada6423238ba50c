"""The operations overview in the admin (/admin/overview/): every backlogged tenant, why
it waits, and the buttons to act on it.

It reads one scheduler snapshot (the OVERVIEW_TOP_N oldest backlogged tenants and the
busiest endpoints, a bounded Redis call) and a handful of grouped, indexed queries, so it
costs the same at 10 or 100,000 tenants. The pacing status in words comes from the same
code as the tenants' own dashboards (dashboards.pacing), so operators and customers read
the same reason. Actions post here and reuse what the admin actions do.
"""

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from urllib.parse import urlencode

import redis
from django import forms
from django.contrib import admin, messages
from django.core.exceptions import BadRequest, PermissionDenied
from django.db import models
from django.db.models import Q
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_POST

from dashboards import charts, history, pacing, status
from dashboards.endpoint_pace import last_move
from delivery.models import Delivery
from delivery.replays.resend import replay
from delivery.scheduler import EndpointRow, Snapshot, TenantRow, get_scheduler
from tenants import audit
from tenants.models import WEIGHT_CHOICES, AuditEntry, Endpoint, Tenant
from tenants.operations import enable_endpoint, set_active
from webhooks import key_hygiene

OVERVIEW_TOP_N = 200
ENDPOINTS_SHOWN = 100
SORTS = {
    "age": ("oldest backlog first", lambda line: -line.age),
    "-age": ("newest backlog first", lambda line: line.age),
    "waiting": ("most waiting", lambda line: -line.waiting),
    "rate": ("fastest delivery", lambda line: -line.delivered_per_minute),
}


@dataclass
class TenantLine:
    tenant: Tenant | None  # None: the fallback lane
    row: TenantRow | None
    assessed: pacing.Pacing
    delivered_per_minute: int
    held: int
    dead: int
    delayed: int  # the snapshot's count, or the database's when nothing is queued
    holding_endpoint_id: int | None = None  # the endpoint its status names, if any

    @property
    def age(self) -> float:
        return self.row.oldest_age_seconds if self.row else 0.0

    @property
    def waiting(self) -> int:
        row = self.row
        return (row.fresh + row.retry if row else 0) + self.delayed + self.held

    @property
    def age_text(self) -> str:
        return pacing.duration(self.age) if self.row else "-"

    @property
    def clears_text(self) -> str:
        """When its queue should have drained at the pace it has now; "-" with nothing
        queued or no deliveries yet to estimate from."""
        drain, clears_at = self.assessed.drain_seconds, self.assessed.clears_at
        if drain is None or clears_at is None:
            return "-"
        if drain < 60:
            return "within a minute"
        now = timezone.now()
        return "around " + pacing.clock(clears_at, now, timezone.get_current_timezone())


@dataclass
class EndpointLine:
    endpoint: Endpoint
    row: EndpointRow | None
    held: int

    @property
    def problem(self) -> str:
        if not self.endpoint.enabled:
            return "disabled (held)"
        if self.endpoint.consecutive_failures:
            return f"failing ({self.endpoint.consecutive_failures} in a row)"
        if self.row and self.row.paused_until:
            return "waiting for its Retry-After"
        if self.row and self.row.rate_limited and self.row.rate_per_second:
            return f"at its rate limit ({self.row.rate_per_second:g}/s)"
        if self.row and self.row.adaptive_limit is not None:
            return "at its adaptive limit"
        return "at its concurrency cap"

    @property
    def why(self) -> str:
        """Why its adaptive limit is where it is: the limit's last backoff, in the endpoint
        page's words; nothing for a fixed cap."""
        if self.row is None or self.row.adaptive_limit is None:
            return ""
        return last_move(self.row, timezone.now(), timezone.get_current_timezone())


def held_counts() -> dict[int, int]:
    """Held deliveries per disabled endpoint (the only place they wait), each count
    capped (history.LIVE_COUNT_CAP) so a disabled endpoint holding millions stays cheap."""
    disabled = Endpoint.objects.filter(enabled=False).order_by("-disabled_at", "pk")
    counts = {
        endpoint_id: history.capped_count(
            Delivery.objects.filter(endpoint_id=endpoint_id, status=Delivery.Status.HELD)
        )
        for endpoint_id in disabled.values_list("pk", flat=True)[:ENDPOINTS_SHOWN]
    }
    return {endpoint_id: n for endpoint_id, n in counts.items() if n}


def tenant_lines(snapshot: Snapshot, held_by_endpoint: dict[int, int]) -> list[TenantLine]:
    """The snapshot's backlogged tenants, plus tenants whose work is held or failing (held
    and delayed work is not queued, so the snapshot's age ranking cannot show it). Each
    status is dashboards.status's, the same the tenant's own page shows."""
    keys: list[int | None] = [r.tenant_id for r in snapshot.tenants]
    troubled = Endpoint.objects.filter(
        Q(pk__in=list(held_by_endpoint)) | Q(enabled=True, consecutive_failures__gt=0),
        tenant__isnull=False,
    ).values_list("tenant_id", flat=True)[:ENDPOINTS_SHOWN]
    keys += [tenant_id for tenant_id in troubled if tenant_id not in keys]
    statuses = status.read(status.tenants_of(keys), snapshot)
    return [
        TenantLine(
            tenant=found.tenant,
            row=found.row,
            assessed=found.assessed,
            delivered_per_minute=found.facts.delivered_last_minute,
            held=found.facts.held,
            dead=found.facts.dead,
            delayed=found.facts.delayed,
            holding_endpoint_id=getattr(found.holding_endpoint(), "pk", None),
        )
        for found in statuses.values()
    ]


def endpoint_lines(
    snapshot: Snapshot, held: dict[int, int], holding: Iterable[int] = ()
) -> list[EndpointLine]:
    """Endpoints at their cap, rate or Retry-After with work parked (from the snapshot),
    failing, or disabled with work held; plus `holding`, the endpoints of tenants whose
    steady status says an endpoint holds them back (its slots may be free this instant)."""
    capped = {
        r.endpoint_id: r
        for r in snapshot.endpoints
        if (r.in_flight_limit and r.in_flight >= r.in_flight_limit)
        or (r.rate_limited and r.parked_lanes > 0)
    }
    capped.update({endpoint_id: None for endpoint_id in holding if endpoint_id not in capped})
    wanted = (
        Endpoint.objects.filter(
            Q(pk__in=list(capped))
            | Q(enabled=True, consecutive_failures__gt=0)
            | Q(enabled=False, pk__in=list(held))
        )
        .select_related("tenant")
        .order_by("-consecutive_failures", "pk")[:ENDPOINTS_SHOWN]
    )
    by_id = {r.endpoint_id: r for r in snapshot.endpoints}
    return [EndpointLine(e, by_id.get(e.pk), held.get(e.pk, 0)) for e in wanted]


def _holding(lines: list[TenantLine]) -> set[int]:
    return {line.holding_endpoint_id for line in lines if line.holding_endpoint_id is not None}


def _links(tenant: Tenant | None) -> dict[str, str]:
    events = reverse("admin:webhooks_event_changelist")
    attempts = reverse("admin:delivery_attempt_changelist")
    deliveries = reverse("admin:delivery_delivery_changelist")
    if tenant is None:
        return {
            "events": f"{events}?tenant__isnull=True",
            "attempts": f"{attempts}?delivery__tenant__isnull=True",
            "dead": f"{deliveries}?tenant__isnull=True&status__exact=dead",
        }
    return {
        "dashboard": reverse("tenants:dashboard", args=[tenant.key]),
        "change": reverse("admin:tenants_tenant_change", args=[tenant.pk]),
        # By key, so each list's tenant box shows whose rows these are.
        "events": f"{events}?{urlencode({'tenant_key': tenant.key})}",
        "attempts": f"{attempts}?{urlencode({'tenant_key': tenant.key})}",
        "dead": f"{deliveries}?{urlencode({'tenant_key': tenant.key, 'status__exact': 'dead'})}",
    }


@never_cache
def overview(request: HttpRequest) -> HttpResponse:
    if not request.user.has_perm("tenants.view_tenant"):
        raise PermissionDenied
    context = _page_context(request)
    try:
        snapshot = get_scheduler().snapshot(top_n=OVERVIEW_TOP_N)
    except redis.RedisError as exc:
        context["redis_error"] = str(exc)
        return TemplateResponse(request, "admin/overview.html", context)
    held = held_counts()
    lines = tenant_lines(snapshot, held)
    context.update(
        snapshot=snapshot,
        **_tenants_table(request, lines),
        endpoints=endpoint_lines(snapshot, held, _holding(lines)),
        held_cap=history.LIVE_COUNT_CAP,
        **_platform_totals(snapshot),
        **_platform_charts(),
        fallback_links=_links(None),
    )
    return TemplateResponse(request, "admin/overview.html", context)


def _page_context(request: HttpRequest) -> dict[str, Any]:
    """What the page shows even when Redis does not answer: the admin's frame and what
    this operator may do."""
    return {
        **admin.site.each_context(request),
        "title": "Operations overview",
        "is_nav_sidebar_enabled": False,  # the tenants table needs the width
        "weights": WEIGHT_CHOICES,
        "sorts": [(key, label) for key, (label, _) in SORTS.items()],
        "can_change_tenant": request.user.has_perm("tenants.change_tenant"),
        "can_change_endpoint": request.user.has_perm("tenants.change_endpoint"),
        "can_replay": request.user.has_perm("delivery.change_delivery"),
        "suspended_sources": key_hygiene.suspended_sources(),
    }


def _tenants_table(request: HttpRequest, lines: list[TenantLine]) -> dict[str, Any]:
    """The tenants' lines, filtered by ?status= and sorted by ?sort=, with each status's
    count over all lines for the filter buttons."""
    sort = request.GET.get("sort", "age")
    sort = sort if sort in SORTS else "age"
    wanted = request.GET.get("status", "")
    counts = {str(s): 0 for s in pacing.Status}
    for line in lines:
        counts[str(line.assessed.status)] += 1
    shown = [line for line in lines if not wanted or str(line.assessed.status) == wanted]
    shown.sort(key=SORTS[sort][1])
    oldest = max((line for line in lines if line.row), key=lambda line: line.age, default=None)
    return {
        "lines": [(line, _links(line.tenant)) for line in shown],
        "total_lines": len(lines),
        "oldest_line": oldest,
        "status_filters": [
            (str(s), pacing.STATUS_LABELS[s], counts[str(s)]) for s in pacing.Status
        ],
        "sort": sort,
        "wanted_status": wanted,
    }


def _platform_totals(snapshot: Snapshot) -> dict[str, Any]:
    return {
        "queued_total": snapshot.fresh_depth + snapshot.retry_depth + snapshot.delayed_depth,
        "delivered_per_minute": sum(history.delivered_recently(None).values()),
        "dead_total": Delivery.objects.filter(status=Delivery.Status.DEAD).count(),
        "top_n": OVERVIEW_TOP_N,
        "truncated": snapshot.backlogged_tenants > len(snapshot.tenants),
        # Backlogged tenants past the snapshot's top N are not lines of the list, but
        # they wait all the same.
        "unlisted_backlogged": max(0, snapshot.backlogged_tenants - len(snapshot.tenants)),
    }


def _platform_charts() -> dict[str, charts.Chart]:
    """The last hour, all tenants together."""
    until = timezone.now()
    since = until - timedelta(hours=1)
    series = history.platform_series(since)
    return {
        "age_chart": charts.build_chart(
            "Oldest backlog of any tenant",
            series.age,
            since=since,
            until=until,
            fmt=pacing.duration,
            duration_axis=True,
            width=600,
            height=190,
        ),
        "rate_chart": charts.build_chart(
            "Delivered per minute, all tenants",
            series.rate,
            since=since,
            until=until,
            fmt=pacing.human_count,
            color="#059669",
            width=600,
            height=190,
        ),
    }


def _back(request: HttpRequest) -> HttpResponseRedirect:
    target = request.POST.get("next", "")
    if not url_has_allowed_host_and_scheme(target, {request.get_host()}):
        target = reverse("admin-overview")
    return HttpResponseRedirect(target)


class Action(models.TextChoices):
    PAUSE = "pause", "Pause delivery"
    RESUME = "resume", "Resume delivery"
    WEIGHT = "weight", "Set the weight"
    REPLAY = "replay", "Replay dead letters"
    REENABLE = "reenable", "Re-enable an endpoint"


# The permission each action needs: the same the admin's own pages ask for.
PERMISSION = {
    Action.PAUSE: "tenants.change_tenant",
    Action.RESUME: "tenants.change_tenant",
    Action.WEIGHT: "tenants.change_tenant",
    Action.REPLAY: "delivery.change_delivery",
    Action.REENABLE: "tenants.change_endpoint",
}
FALLBACK = "fallback"  # `tenant` for the fallback lane's dead letters


class ActionForm(forms.Form):
    """One posted action; which fields it needs depends on the action."""

    action = forms.ChoiceField(choices=Action.choices)
    tenant = forms.CharField(required=False)  # a tenant's id, or FALLBACK for replay
    endpoint = forms.IntegerField(required=False)
    weight = forms.IntegerField(required=False)

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        action = data.get("action")
        if action == Action.REENABLE:
            if data.get("endpoint") is None:
                self.add_error("endpoint", "an endpoint's id is required")
            return data
        tenant = data.get("tenant", "")
        if not (action == Action.REPLAY and tenant == FALLBACK):
            if not tenant.isdigit():
                self.add_error("tenant", "a tenant's id is required")
            else:
                data["tenant"] = int(tenant)
        if action == Action.WEIGHT and data.get("weight") is None:
            self.add_error("weight", "a weight is required")
        return data


@require_POST
def act(request: HttpRequest) -> HttpResponse:
    """pause, resume, weight, replay (a tenant's dead letters) or reenable (an endpoint).
    Saving the model is what tells the scheduler (delivery/upkeep/signals.py), as in the admin."""
    action = request.POST.get("action", "")
    if action not in Action.values:
        messages.error(request, f"Unknown action {action!r}.")
        return _back(request)
    if not request.user.has_perm(PERMISSION[Action(action)]):
        raise PermissionDenied
    form = ActionForm(request.POST)
    if not form.is_valid():  # a hand-made post, not the page's buttons
        raise BadRequest("; ".join(f"{name}: {' '.join(e)}" for name, e in form.errors.items()))
    data = form.cleaned_data
    if action == Action.REENABLE:
        endpoint = get_object_or_404(Endpoint, pk=data["endpoint"])
        released = enable_endpoint(endpoint, actor=request.user, via=AuditEntry.Via.ADMIN)
        messages.success(request, f"{endpoint} enabled; {released} held deliveries resumed.")
        return _back(request)
    if action == Action.REPLAY:
        dead = Delivery.objects.filter(status=Delivery.Status.DEAD)
        if data["tenant"] == FALLBACK:
            dead = dead.filter(tenant__isnull=True)
        else:
            dead = dead.filter(tenant_id=get_object_or_404(Tenant, pk=data["tenant"]).pk)
        count = replay(dead.select_related("tenant"), actor=request.user, via=AuditEntry.Via.ADMIN)
        messages.success(request, f"{count} dead deliveries put back in their lane.")
        return _back(request)
    tenant = get_object_or_404(Tenant, pk=data["tenant"])
    if action in (Action.PAUSE, Action.RESUME):
        set_active(tenant, action == Action.RESUME, actor=request.user, via=AuditEntry.Via.ADMIN)
        messages.success(request, f"{tenant.key}: delivery {action}d.")
    elif data["weight"] not in dict(WEIGHT_CHOICES):
        tiers = ", ".join(map(str, dict(WEIGHT_CHOICES)))
        messages.error(request, f"Weight must be one of {tiers}.")
    else:
        old_weight, tenant.weight = tenant.weight, data["weight"]
        tenant.save(update_fields=["weight"])
        audit.record(
            actor=request.user,
            action=AuditEntry.Action.TENANT_WEIGHT_CHANGED,
            via=AuditEntry.Via.ADMIN,
            tenant=tenant,
            target=f"tenant {tenant.key}",
            old={"weight": old_weight},
            new={"weight": tenant.weight},
        )
        messages.success(request, f"{tenant.key}: weight set to {tenant.weight}.")
    return _back(request)


urlpatterns = [
    path("admin/overview/", admin.site.admin_view(overview), name="admin-overview"),
    path("admin/overview/act/", admin.site.admin_view(act), name="admin-overview-act"),
]

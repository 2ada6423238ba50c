"""Window replays in the admin: a form (or the deliveries list's selection) names the
window, a preview says how many deliveries will go out again, a confirmation starts the
job, and the job's page shows its progress with a Cancel button.

Kept apart from delivery/admin/deliveries.py: the deliveries list only gains an action
(`replay_window`) that opens the form filled in from the rows selected.
"""

from datetime import UTC, datetime
from urllib.parse import urlencode

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import Max, Min
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.views.decorators.http import require_POST

from core.admin_cells import clipped, timed, when
from core.admin_readonly import EvidenceAdmin
from core.ids import ulid_time_ms
from delivery.models import ReplayJob
from delivery.replays import window as replay_window
from delivery.replays.forms import TIME_FORMAT, WindowForm, last_hour
from tenants.models import AuditEntry

PERMISSION = "delivery.change_delivery"


def _require(request: HttpRequest) -> None:
    if not request.user.has_perm(PERMISSION):
        raise PermissionDenied("Replaying deliveries needs the change delivery permission.")


def _local(iso: str) -> str:
    moment = parse_datetime(iso)
    return f"{timezone.localtime(moment):%Y-%m-%d %H:%M:%S %Z}" if moment else iso


def window_text(filters: dict) -> str:
    """A job's filters in words, for its page and the list; times to the second, in the
    operator's time zone."""
    parts = [f"{_local(filters['from'])} to {_local(filters['to'])}", "/".join(filters["statuses"])]
    if filters.get("endpoint"):
        parts.append(f"endpoint {filters['endpoint']}")
    if filters.get("event_type"):
        parts.append(f"type {filters['event_type']}")
    return ", ".join(parts)


# permissions=["change"]: offered only to those who may replay (DeliveryAdmin's change
# permission is delivery.change_delivery); the form checks it again.
@admin.action(
    description="Replay a window like the selected deliveries (preview first)…",
    permissions=["change"],
)
def replay_window_action(modeladmin, request: HttpRequest, queryset) -> HttpResponse | None:
    """Open the window form filled in from the selection (with "select all", the list's
    current filters): its tenant, its endpoint if only one, its time span."""
    tenants = list(queryset.order_by().values_list("tenant__key", flat=True).distinct()[:2])
    if len(tenants) != 1 or tenants[0] is None:
        messages.error(request, "Select deliveries of one tenant: a replay goes through one lane.")
        return None
    endpoints = list(queryset.order_by().values_list("endpoint_id", flat=True).distinct()[:2])
    span = queryset.order_by().aggregate(first=Min("id"), last=Max("id"))
    start = datetime.fromtimestamp(ulid_time_ms(span["first"]) / 1000, tz=UTC)
    # The end is exclusive and to the second: the next second keeps the last one in.
    end = datetime.fromtimestamp(ulid_time_ms(span["last"]) // 1000 + 1, tz=UTC)
    query = {
        "tenant": tenants[0],
        "start": timezone.localtime(start).strftime(TIME_FORMAT),
        "end": timezone.localtime(end).strftime(TIME_FORMAT),
    }
    if len(endpoints) == 1:
        query["endpoint"] = endpoints[0]
    return HttpResponseRedirect(reverse("admin:delivery_replayjob_window") + "?" + urlencode(query))


@admin.register(ReplayJob)
class ReplayJobAdmin(EvidenceAdmin):
    list_display = [
        "id",
        clipped("tenant", 24),
        "state",
        "progress",
        "window",
        "created_by_name",
        timed("created_at", description="created"),
    ]
    list_filter = ["state"]
    search_fields = ["=tenant__key"]
    list_select_related = ["tenant"]
    fields = [
        "tenant",
        "state",
        "progress",
        "window",
        "created_by_name",
        "created",
        "ended",
        "cancelled_by_name",
        "cursor",
        "chunk",
    ]
    readonly_fields = fields
    change_form_template = "admin/delivery/replayjob/change_form.html"
    change_list_template = "admin/delivery/replayjob/change_list.html"

    # Read-only records (EvidenceAdmin): jobs are made by the window form, changed only by
    # the feeder and Cancel. Operators who may replay may see them.

    def has_view_permission(self, request, obj=None) -> bool:
        return request.user.has_perm(PERMISSION) or super().has_view_permission(request, obj)

    def has_module_permission(self, request) -> bool:
        return self.has_view_permission(request)

    @admin.display(description="Progress (fed / matched)")
    def progress(self, obj: ReplayJob) -> str:
        return f"{obj.fed:,} / {obj.matched_text}"

    @admin.display(description="Window")
    def window(self, obj: ReplayJob) -> str:
        return window_text(obj.filters)

    @admin.display(description="Created")
    def created(self, obj: ReplayJob) -> str:
        return when(obj.created_at) or "-"

    @admin.display(description="Finished or cancelled")
    def ended(self, obj: ReplayJob) -> str:
        return when(obj.finished_at) or "-"

    @admin.display(description="Last chunk")
    def chunk(self, obj: ReplayJob) -> str:
        return f"{len(obj.last_chunk)} deliveries"

    def get_urls(self):
        own = [
            path(
                "window/",
                self.admin_site.admin_view(self.window_view),
                name="delivery_replayjob_window",
            ),
            path(
                "<int:pk>/cancel/",
                self.admin_site.admin_view(self.cancel_view),
                name="delivery_replayjob_cancel",
            ),
        ]
        return own + super().get_urls()

    def window_view(self, request: HttpRequest) -> HttpResponse:
        """GET: the form (filled in from the query). POST: a preview with its count, or,
        with `confirm`, the job started and its page."""
        _require(request)
        context = {**self.admin_site.each_context(request), "opts": self.model._meta}
        if request.method != "POST":
            form = WindowForm(initial=request.GET.dict() or last_hour())
            context.update(form=form, title="Replay a window of deliveries")
            return TemplateResponse(request, "admin/delivery/replayjob/window.html", context)
        form = WindowForm(request.POST)
        if not form.is_valid():
            context.update(form=form, title="Replay a window of deliveries")
            return TemplateResponse(
                request, "admin/delivery/replayjob/window.html", context, status=400
            )
        tenant, window = form.chosen_tenant(), form.window()
        if "confirm" in request.POST:
            job = replay_window.start(tenant, window, user=request.user, via=AuditEntry.Via.ADMIN)
            messages.success(
                request,
                f"Replay started: {job.matched_text} deliveries go out again through "
                f"{tenant}'s lane, a chunk at a time.",
            )
            return HttpResponseRedirect(reverse("admin:delivery_replayjob_change", args=[job.pk]))
        count, capped = replay_window.count_bounded(tenant, window)
        context.update(
            form=form,
            title="Replay a window of deliveries: preview",
            preview={"count": count, "capped": capped, "tenant": tenant},
        )
        return TemplateResponse(request, "admin/delivery/replayjob/window.html", context)

    def cancel_view(self, request: HttpRequest, pk: int) -> HttpResponse:
        _require(request)
        return _cancel(request, get_object_or_404(ReplayJob, pk=pk))


@require_POST
def _cancel(request: HttpRequest, job: ReplayJob) -> HttpResponse:
    if replay_window.cancel(job, user=request.user, via=AuditEntry.Via.ADMIN):
        messages.success(
            request,
            f"Replay cancelled after {job.fed:,} deliveries; those already in the lane still go out.",
        )
    else:
        messages.warning(request, f"This replay was already {job.get_state_display().lower()}.")
    return HttpResponseRedirect(reverse("admin:delivery_replayjob_change", args=[job.pk]))

"""A tenant's window replays on its portal: /t/<key>/replays/.

Members see their tenant's replays and their progress; the tenant's admins (and operators
allowed to replay) preview a window, confirm it and cancel it. The page is behind
dashboards.access.tenant_view like every tenant page, and never opens through a share
link: its URLs take no token, and a shared access is refused here as well.
"""

from django.conf import settings
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_http_methods, require_POST

from dashboards.access import TenantAccess, is_tenant_admin, tenant_view
from delivery.models import ReplayJob
from delivery.replays import window as replay_window
from delivery.replays.forms import WindowForm, last_hour
from tenants.models import AuditEntry, Endpoint

JOBS_SHOWN = 25
NOT_ALLOWED = "Only the tenant's admins can start or cancel replays."


def may_replay(request: HttpRequest, access: TenantAccess) -> bool:
    """Tenant admins change things; viewers and share links only read. Operators need the
    same permission as in the admin."""
    user = request.user
    if access.shared:
        return False
    if user.is_staff and user.has_perm("delivery.change_delivery"):
        return True
    return is_tenant_admin(request, access)


def _jobs(access: TenantAccess, before: str | None) -> tuple[list[ReplayJob], int | None]:
    """One page of the tenant's jobs, newest first, by keyset on the id; and the id to
    continue before, if there are more."""
    jobs = ReplayJob.objects.filter(tenant=access.tenant).order_by("-id")
    if before and before.isdigit():
        jobs = jobs.filter(id__lt=int(before))
    page = list(jobs[: JOBS_SHOWN + 1])
    more = page[JOBS_SHOWN].id + 1 if len(page) > JOBS_SHOWN else None
    page = page[:JOBS_SHOWN]
    urls = dict(
        Endpoint.objects.filter(
            tenant=access.tenant, pk__in={job.filters.get("endpoint") for job in page}
        ).values_list("pk", "url")
    )
    for job in page:
        # What the template shows of the window: times it can format, the endpoint's URL.
        window = replay_window.Window.from_json(job.filters)
        job.window_start, job.window_end = window.start, window.end
        job.window_endpoint = urls.get(window.endpoint_id, "") if window.endpoint_id else ""
        job.window_statuses = " and ".join(window.statuses)
        job.window_event_type = window.event_type
        job.percent = min(100, round(100 * job.fed / job.matched)) if job.matched else 100
    return page, more


def _page(
    request: HttpRequest, access: TenantAccess, form: WindowForm, *, preview=None, status=200
) -> HttpResponse:
    jobs, more = _jobs(access, request.GET.get("before"))
    context = {
        "access": access,
        "tenant": access.tenant,
        "form": form,
        "preview": preview,
        "jobs": jobs,
        "older": more,
        "can_replay": may_replay(request, access),
        "any_running": any(job.state == ReplayJob.State.RUNNING for job in jobs),
        "chunk_size": settings.REPLAY_CHUNK_SIZE,
        "time_zone": timezone.get_current_timezone_name(),
    }
    template = "dashboards/replay_jobs.html" if request.GET.get("part") == "jobs" else None
    response = render(request, template or "dashboards/replays.html", context, status=status)
    return response


@tenant_view
@require_http_methods(["GET", "POST"])
def replays(request: HttpRequest, access: TenantAccess) -> HttpResponse:
    """GET: the form and the list. POST: a preview (with its count), or with `confirm`,
    the replay started (then back to the list, Post/Redirect/Get)."""
    if access.shared:
        raise Http404("No such page.")
    tenant = access.tenant
    if request.method != "POST":
        return _page(request, access, WindowForm(tenant=tenant, initial=last_hour()))
    if not may_replay(request, access):
        raise PermissionDenied(NOT_ALLOWED)
    form = WindowForm(request.POST, tenant=tenant)
    if not form.is_valid():
        return _page(request, access, form, status=400)
    if "confirm" in request.POST:
        replay_window.start(tenant, form.window(), user=request.user, via=AuditEntry.Via.PORTAL)
        return redirect(reverse("tenants:replays", kwargs={"key": tenant.key}))
    count, capped = replay_window.count_bounded(tenant, form.window())
    return _page(request, access, form, preview={"count": count, "capped": capped})


@tenant_view
@require_POST
def cancel(request: HttpRequest, access: TenantAccess, job_id: str) -> HttpResponse:
    if access.shared:
        raise Http404("No such page.")
    # Looked up within the tenant: another tenant's job id is simply not found.
    job = ReplayJob.objects.filter(pk=int(job_id), tenant=access.tenant).first()
    if job is None:
        raise Http404("No such replay.")
    if not may_replay(request, access):
        raise PermissionDenied(NOT_ALLOWED)
    replay_window.cancel(job, user=request.user, via=AuditEntry.Via.PORTAL)
    return redirect(reverse("tenants:replays", kwargs={"key": access.tenant.key}))

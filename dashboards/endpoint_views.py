"""The tenant portal's endpoint pages: /t/<key>/endpoints/ and one endpoint's page.

Members read; tenant admins change (every POST checks the role and answers 403 to
anyone else). Endpoints are looked up within the tenant of the URL, so another tenant's
endpoint id is a 404. Share links never reach these views: their URLs have no token.
"""

from collections.abc import Callable
from datetime import timedelta
from functools import wraps

import redis
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
)
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html

from dashboards import endpoint_actions as actions
from dashboards.access import TenantAccess, is_tenant_admin, tenant_view
from dashboards.endpoint_forms import (
    DEFAULT_OVERLAP_HOURS,
    DisableForm,
    PortalEndpointForm,
    RotateForm,
)
from dashboards.endpoint_health import (
    MAX_ATTEMPTS_READ,
    MinuteAnswers,
    endpoint_health,
    health_of,
)
from dashboards.endpoint_pace import pace_lines
from delivery.models import Attempt, Delivery
from delivery.scheduler import get_scheduler
from ingest.publish import PublishError
from tenants.models import Endpoint, EndpointSecret, mask_secret

ENDPOINTS_SHOWN = 100  # a tenant has a handful; the cap only bounds the page
ATTEMPTS_SHOWN = 20
FORBIDDEN = "Only an admin of this tenant may change its endpoints."


def _not_shared(access: TenantAccess) -> None:
    # Defence in depth: no URL here carries a share token, but the gate must hold even
    # if one is ever added by mistake.
    if access.shared:
        raise Http404("No such page.")


def admin_post(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """POST only, by an admin of the tenant, on an endpoint of that tenant."""

    @wraps(view)
    def wrapper(request: HttpRequest, access: TenantAccess, endpoint_id: str) -> HttpResponse:
        _not_shared(access)
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        endpoint = get_object_or_404(Endpoint, pk=int(endpoint_id), tenant=access.tenant)
        if not is_tenant_admin(request, access):
            raise PermissionDenied(FORBIDDEN)
        return view(request, access, endpoint)

    return wrapper


def _endpoint_url(endpoint: Endpoint) -> str:
    return reverse("tenants:endpoint", args=[endpoint.tenant.key, endpoint.pk])


def _secrets_listing(endpoint: Endpoint) -> list[dict]:
    """Masked: enough to tell the secrets apart and see which one expires when."""
    return [
        {
            "masked": mask_secret(row.secret),
            "created_at": row.created_at,
            "expires_at": row.expires_at,
            "active": row.is_active(),
        }
        for row in endpoint.secrets.all()[:10]
    ]


@tenant_view
def endpoint_list(request: HttpRequest, access: TenantAccess) -> HttpResponse:
    _not_shared(access)
    endpoints = list(Endpoint.objects.filter(tenant=access.tenant).order_by("pk")[:ENDPOINTS_SHOWN])
    health = health_of([e.pk for e in endpoints])
    return render(
        request,
        "dashboards/endpoints.html",
        {
            "access": access,
            "tenant": access.tenant,
            "rows": [(e, health[e.pk]) for e in endpoints],
            "is_admin": is_tenant_admin(request, access),
            "max_read": MAX_ATTEMPTS_READ,
        },
    )


def _pace(endpoint: Endpoint, minute: MinuteAnswers) -> list[str]:
    """The schedule's view of its pace; nothing when Redis cannot say (the page's other
    figures come from the database and stand)."""
    try:
        state = get_scheduler().endpoint_state(endpoint.pk)
    except redis.RedisError:
        return []
    return pace_lines(
        state,
        timezone.now(),
        timezone.get_current_timezone(),
        minute,
        own_cap=endpoint.max_in_flight is not None,
    )


def _detail(
    request: HttpRequest,
    access: TenantAccess,
    endpoint: Endpoint,
    form: PortalEndpointForm | None = None,
    status: int = 200,
    **extra: object,
) -> HttpResponse:
    admin = is_tenant_admin(request, access)
    health = endpoint_health(endpoint.pk)
    return render(
        request,
        "dashboards/endpoint.html",
        {
            "access": access,
            "tenant": access.tenant,
            "endpoint": endpoint,
            "health": health,
            "pace": _pace(endpoint, health.minute),
            "secrets": _secrets_listing(endpoint),
            "is_admin": admin,
            "form": form or (PortalEndpointForm(instance=endpoint) if admin else None),
            "disable_form": extra.pop("disable_form", None) or DisableForm(),
            "rotate_form": extra.pop("rotate_form", None) or RotateForm(),
            "default_overlap": DEFAULT_OVERLAP_HOURS,
            "max_read": MAX_ATTEMPTS_READ,
            **extra,
        },
        status=status,
    )


@tenant_view
def endpoint_detail(request: HttpRequest, access: TenantAccess, endpoint_id: str) -> HttpResponse:
    """GET: the endpoint, its health and (for admins) its forms. POST: save the edit."""
    _not_shared(access)
    endpoint = get_object_or_404(Endpoint, pk=int(endpoint_id), tenant=access.tenant)
    if request.method == "GET":
        return _detail(request, access, endpoint)
    if request.method != "POST":
        return HttpResponseNotAllowed(["GET", "POST"])
    if not is_tenant_admin(request, access):
        raise PermissionDenied(FORBIDDEN)
    before = {field: getattr(endpoint, field) for field in actions.EDITABLE}
    form = PortalEndpointForm(request.POST, instance=endpoint)
    if not form.is_valid():
        # Invalid input is the user's to fix: a 400 with the form's own messages.
        endpoint.refresh_from_db()
        return _detail(request, access, endpoint, form=form, status=400)
    changed = actions.change_endpoint(form.save(commit=False), before, request.user)
    if changed:
        messages.success(request, f"Saved: {', '.join(f.replace('_', ' ') for f in changed)}.")
    else:
        messages.info(request, "Nothing changed.")
    return redirect(_endpoint_url(endpoint))


@tenant_view
def endpoint_new(request: HttpRequest, access: TenantAccess) -> HttpResponse:
    _not_shared(access)
    if not is_tenant_admin(request, access):
        raise PermissionDenied(FORBIDDEN)
    if request.method not in ("GET", "POST"):
        return HttpResponseNotAllowed(["GET", "POST"])
    form = PortalEndpointForm(
        request.POST if request.method == "POST" else None,
        instance=Endpoint(tenant=access.tenant),
    )
    if request.method == "POST" and form.is_valid():
        endpoint = form.save(commit=False)
        endpoint.tenant = access.tenant  # never from the form: a tenant adds to its own
        made = actions.create_endpoint(endpoint, request.user)
        secrets = list(endpoint.secrets.all()) if made else []
        return _secret_page(request, access, endpoint, secrets, "created")
    return render(
        request,
        "dashboards/endpoint_new.html",
        {"access": access, "tenant": access.tenant, "form": form},
        status=400 if form.is_bound else 200,
    )


def _secret_page(
    request: HttpRequest,
    access: TenantAccess,
    endpoint: Endpoint,
    secrets: list[EndpointSecret],
    why: str,
    **extra: object,
) -> HttpResponse:
    """Post/Redirect/Get: the secrets to show are remembered in the session, and the
    page that shows them in full takes them from there once. A reload of that page then
    shows nothing again, and no reload ever repeats the POST (a second rotation)."""
    request.session[_SHOWN_KEY.format(endpoint.pk)] = {
        "ids": [secret.pk for secret in secrets],
        "why": why,
        **extra,
    }
    return HttpResponseRedirect(
        reverse("tenants:endpoint-secrets-shown", args=[access.tenant.key, endpoint.pk]),
        status=303,  # See Other: the next request is a GET, whatever the browser
    )


_SHOWN_KEY = "endpoint-secrets-shown:{}"


@tenant_view
def secrets_shown(request: HttpRequest, access: TenantAccess, endpoint_id: str) -> HttpResponse:
    """The only page that shows secrets in full, once, after the POST that asked."""
    _not_shared(access)
    endpoint = get_object_or_404(Endpoint, pk=int(endpoint_id), tenant=access.tenant)
    if not is_tenant_admin(request, access):
        raise PermissionDenied(FORBIDDEN)
    shown = request.session.pop(_SHOWN_KEY.format(endpoint.pk), None)
    if shown is None:
        messages.info(
            request,
            "Signing secrets are shown once. Reveal the active ones again here; each reveal "
            "is recorded in the audit trail.",
        )
        return redirect(_endpoint_url(endpoint))
    rows = list(endpoint.secrets.filter(pk__in=shown["ids"]).order_by("-created_at", "-pk"))
    return render(
        request,
        "dashboards/endpoint_secret.html",
        {
            "access": access,
            "tenant": access.tenant,
            "endpoint": endpoint,
            "secrets": rows,
            "newest": rows[0] if rows else None,
            **shown,
        },
    )


@tenant_view
@admin_post
def endpoint_disable(request: HttpRequest, access: TenantAccess, endpoint: Endpoint):
    form = DisableForm(request.POST)
    if not form.is_valid():
        return _detail(request, access, endpoint, status=400, disable_form=form)
    if actions.disable_endpoint(endpoint, form.cleaned_data["reason"], request.user):
        messages.success(request, "Endpoint disabled: its deliveries are held until re-enabled.")
    else:
        messages.info(request, "The endpoint was already disabled.")
    return redirect(_endpoint_url(endpoint))


@tenant_view
@admin_post
def endpoint_enable(request: HttpRequest, access: TenantAccess, endpoint: Endpoint):
    if endpoint.enabled:
        messages.info(request, "The endpoint is already enabled.")
    else:
        resumed = actions.enable_endpoint(endpoint, request.user)
        messages.success(request, f"Endpoint enabled; {resumed} held deliveries resumed.")
    return redirect(_endpoint_url(endpoint))


@tenant_view
@admin_post
def secret_reveal(request: HttpRequest, access: TenantAccess, endpoint: Endpoint):
    rows = actions.reveal_secrets(endpoint, request.user)
    return _secret_page(request, access, endpoint, rows, "revealed")


@tenant_view
@admin_post
def secret_rotate(request: HttpRequest, access: TenantAccess, endpoint: Endpoint):
    form = RotateForm(request.POST)
    if not form.is_valid():
        return _detail(request, access, endpoint, status=400, rotate_form=form)
    hours = form.cleaned_data["overlap_hours"]
    new = actions.rotate_secret(endpoint, timedelta(hours=hours), request.user)
    return _secret_page(request, access, endpoint, [new], "rotated", overlap_hours=hours)


@tenant_view
@admin_post
def send_test(request: HttpRequest, access: TenantAccess, endpoint: Endpoint):
    try:
        accepted = actions.send_test_event(endpoint, request.user)
    except PublishError as exc:
        return HttpResponse(f"Could not send a test event: {exc.message}\n", status=400)
    except actions.TooManyTestEvents as exc:
        return HttpResponse(f"{exc.message}\n", status=429, headers={"Retry-After": "60"})
    delivery = Delivery.objects.filter(event=accepted.event, endpoint=endpoint).first()
    if delivery is None:  # cannot happen: accept_to makes exactly this one
        messages.error(request, "The test event was stored but no delivery was made.")
        return redirect(_endpoint_url(endpoint))
    where = reverse("tenants:endpoint-delivery", args=[access.tenant.key, endpoint.pk, delivery.pk])
    held = " It is held until the endpoint is enabled." if not endpoint.enabled else ""
    messages.success(
        request,
        format_html(
            'Test event {} queued for this endpoint.{} <a href="{}">See its result</a>.',
            accepted.event.id,
            held,
            where,
        ),
    )
    return redirect(_endpoint_url(endpoint))


@tenant_view
def endpoint_delivery(
    request: HttpRequest, access: TenantAccess, endpoint_id: str, delivery_id: str
) -> HttpResponse:
    """One delivery to one of the tenant's endpoints and its attempts (the test event's
    result). Both ids must belong to this tenant, or it is a 404."""
    _not_shared(access)
    delivery = get_object_or_404(
        Delivery.objects.select_related("event", "endpoint"),
        pk=delivery_id,
        endpoint_id=int(endpoint_id),
        endpoint__tenant=access.tenant,
    )
    attempts = list(Attempt.objects.filter(delivery=delivery).order_by("-number")[:ATTEMPTS_SHOWN])
    return render(
        request,
        "dashboards/endpoint_delivery.html",
        {
            "access": access,
            "tenant": access.tenant,
            "endpoint": delivery.endpoint,
            "delivery": delivery,
            "attempts": attempts,
        },
    )

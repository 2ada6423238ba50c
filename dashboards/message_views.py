"""The tenant portal's message log, an event's page and its resend button.

Members only: these pages are never routed under a share link (dashboards/urls.py), and
each view refuses a share-link access as well, so a read-only link to the pacing pages
can never open a payload. Every lookup is scoped to the tenant in the URL: another
tenant's event or delivery id is a 404, the same answer as an id that does not exist.
"""

from django.contrib import messages as flash
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.http import urlencode
from django.views.decorators.http import require_GET, require_POST

from dashboards import message_detail, messages
from dashboards.access import TenantAccess, may_change, tenant_view
from delivery.models import Delivery
from delivery.replays.resend import resend
from tenants import audit
from tenants.models import AuditEntry
from webhooks.models import Event


def _members_only(access: TenantAccess) -> None:
    # The URLs take no token; this guards against one being routed here by mistake.
    if access.shared:
        raise Http404("No such page.")


@require_GET
@tenant_view
def message_log(request: HttpRequest, access: TenantAccess) -> HttpResponse:
    _members_only(access)
    tenant = access.tenant
    form = messages.LogFilter(request.GET or None, tenant=tenant)
    context = {"tenant": tenant, "access": access, "form": form, "page": None, "rows": []}
    if request.GET and not form.is_valid():
        return render(request, "dashboards/messages.html", context, status=400)
    filters = form.cleaned_data if request.GET else {}
    try:
        shown = messages.page(
            messages.filtered_events(tenant, filters),
            before=request.GET.get("before") or None,
            after=request.GET.get("after") or None,
        )
    except messages.BadCursor as exc:
        context["cursor_error"] = str(exc)
        return render(request, "dashboards/messages.html", context, status=400)
    messages.attach_deliveries(tenant, shown)
    # The page links keep the filters and swap the cursor.
    kept = {k: v for k, v in request.GET.items() if k not in ("before", "after") and v}
    base = reverse("tenants:messages", args=[tenant.key])
    context.update(
        page=shown,
        rows=[
            {
                "event": event,
                "deliveries": [
                    {
                        "status": messages.STATUS_WORDS.get(d.status, d.status),
                        "endpoint": message_detail.endpoint_label(d.endpoint),
                    }
                    for d in shown.deliveries.get(event.pk, [])
                ],
            }
            for event in shown.events
        ],
        older_url=f"{base}?{urlencode({**kept, 'before': shown.older})}" if shown.older else None,
        newer_url=f"{base}?{urlencode({**kept, 'after': shown.newer})}" if shown.newer else None,
        filtered=bool(kept),
    )
    return render(request, "dashboards/messages.html", context)


def _tenant_event(access: TenantAccess, event_id: str) -> Event:
    event = Event.objects.filter(pk=event_id, tenant=access.tenant).first()
    if event is None:
        raise Http404("No such event.")
    return event


@require_GET
@tenant_view
def message_detail_view(request: HttpRequest, access: TenantAccess, event_id: str) -> HttpResponse:
    _members_only(access)
    event = _tenant_event(access, event_id)
    return render(
        request,
        "dashboards/message.html",
        {
            "tenant": access.tenant,
            "access": access,
            "event": event,
            "headers": message_detail.received_headers(event),
            "payload": message_detail.payload(event),
            "payload_limit_kb": message_detail.PAYLOAD_SHOWN_BYTES // 1024,
            "payload_days": message_detail.payload_retention_days(),
            "deliveries": message_detail.deliveries(access.tenant, event),
            "can_resend": may_change(request.user, access.tenant),
        },
    )


@require_POST
@tenant_view
def resend_delivery(
    request: HttpRequest, access: TenantAccess, event_id: str, delivery_id: str
) -> HttpResponse:
    _members_only(access)
    tenant = access.tenant
    delivery = (
        Delivery.objects.filter(pk=delivery_id, event_id=event_id, tenant=tenant)
        .select_related("endpoint")
        .first()
    )
    if delivery is None:
        raise Http404("No such delivery.")
    if not may_change(request.user, tenant):
        raise PermissionDenied("Only an admin of this tenant may resend deliveries.")
    back = reverse("tenants:message", args=[tenant.key, event_id])
    queued = resend([delivery])
    if not queued and Event.objects.filter(pk=event_id, payload_pruned_at__isnull=False).exists():
        flash.error(
            request,
            f"Delivery {delivery.id} cannot be resent: its event's payload was removed "
            "after the retention period.",
        )
        return redirect(back)
    if not queued:
        # Held and open deliveries are on their way already (or wait for their endpoint).
        flash.error(
            request,
            f"Delivery {delivery.id} is {delivery.get_status_display().lower()}: only "
            "delivered or dead deliveries can be resent.",
        )
        return redirect(back)
    audit.record(
        actor=request.user,
        action=AuditEntry.Action.DELIVERY_RESENT,
        via=AuditEntry.Via.PORTAL,
        tenant=tenant,
        target=f"delivery {delivery.id}",
        event_id=event_id,
        endpoint_id=delivery.endpoint_id,
        previous_status=delivery.status,
    )
    flash.success(request, _resent(delivery))
    return redirect(back)


def _resent(delivery: Delivery) -> str:
    label = message_detail.endpoint_label(delivery.endpoint)
    if delivery.endpoint.enabled:
        return (
            f"Delivery {delivery.id} to {label} is queued again; it goes out in your turn "
            "with the same webhook-id."
        )
    # The worker holds it, as it holds every delivery for a disabled endpoint.
    return (
        f"Delivery {delivery.id} to {label} is queued again, but that endpoint is disabled: "
        "it is held, and goes out with the same webhook-id once the endpoint is enabled again."
    )

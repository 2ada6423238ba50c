"""/t/<key>/audit/: a tenant's own audit trail, for its admins only (viewers get 403 and
no link: the trail names who did what, which is the admins' business).

Newest first, a page at a time by keyset on (at, id), the order of the (tenant, -at)
index: no COUNT and no OFFSET, so the hundredth page costs what the first does.
"""

from typing import Any

from django.core.exceptions import PermissionDenied
from django.db.models import Q
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.shortcuts import render
from django.urls import reverse

from dashboards.access import TenantAccess, is_tenant_admin, tenant_view
from tenants.models import AuditEntry

PAGE_SIZE = 50


@tenant_view
def audit_trail(request: HttpRequest, access: TenantAccess) -> HttpResponse:
    if not is_tenant_admin(request, access):
        raise PermissionDenied("Only an admin of this tenant may read its audit trail.")
    entries = AuditEntry.objects.filter(tenant=access.tenant)
    before = request.GET.get("before")
    if before is not None:
        # The cursor is the last entry shown: an id, looked up within this tenant only.
        if not before.isdigit():
            return HttpResponseBadRequest("The 'before' cursor must be an entry id.")
        cursor = entries.filter(pk=int(before)).values_list("at", "pk").first()
        if cursor is None:
            return HttpResponseBadRequest("No such entry in this tenant's audit trail.")
        at, pk = cursor
        entries = entries.filter(Q(at__lt=at) | Q(at=at, pk__lt=pk))
    page = list(entries.order_by("-at", "-pk")[: PAGE_SIZE + 1])
    more = len(page) > PAGE_SIZE
    page = page[:PAGE_SIZE]
    next_url = None
    if more:
        next_url = reverse("tenants:audit", args=[access.tenant.key]) + f"?before={page[-1].pk}"
    return render(
        request,
        "dashboards/audit.html",
        {
            "access": access,
            "tenant": access.tenant,
            "entries": [(entry, readable(entry.detail)) for entry in page],
            "next_url": next_url,
            "first_page": before is None,
        },
    )


def readable(detail: dict[str, Any]) -> list[str]:
    """An entry's detail as lines a person reads: each changed field as "field: before →
    after", then every other fact as "Label: value". Nothing is cut."""
    old, new = detail.get("old") or {}, detail.get("new") or {}
    lines = [
        f"{_label(field)}: {_value(old[field])} → {_value(new.get(field))}"
        if field in old
        else f"{_label(field)}: {_value(new[field])}"
        for field in dict.fromkeys([*old, *new])
    ]
    lines += [
        f"{_label(key)}: {_value(value)}"
        for key, value in sorted(detail.items())
        if key not in ("old", "new")
    ]
    return lines


def _label(key: str) -> str:
    return key.replace("_", " ").capitalize()


def _value(value: Any) -> str:
    if value is None or value == "":
        return "(empty)"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, dict):
        return ", ".join(f"{_label(k).lower()} {_value(v)}" for k, v in value.items())
    if isinstance(value, list):
        return ", ".join(_value(item) for item in value) or "(none)"
    return str(value)

"""List filters by tenant and endpoint that scale to thousands of them: an exact value in
a box (see core.admin_filters), never a list of every tenant. Exact keys and ids keep the
lookup on the tenants' and endpoints' unique indexes."""

from django.contrib import messages

from core.admin_filters import InputFilter
from tenants.models import Endpoint


class TenantKeyFilter(InputFilter):
    """Rows of one tenant, by its exact key. `tenant_field` is the path to the tenant."""

    title = "tenant"
    parameter_name = "tenant_key"
    placeholder = "shop.example"
    help_text = "A tenant's exact key."
    tenant_field = "tenant"

    def queryset(self, request, queryset):
        key = (self.value() or "").strip()
        if not key:
            return queryset
        return queryset.filter(**{f"{self.tenant_field}__key": key})


class EndpointIdFilter(InputFilter):
    """Rows of one endpoint, by its id (an endpoint's page links here with it)."""

    title = "endpoint"
    parameter_name = "endpoint_id"
    placeholder = "id, e.g. 42"
    help_text = "An endpoint's id (its page links here: \u201cthis endpoint's deliveries\u201d)."
    endpoint_field = "endpoint"

    def queryset(self, request, queryset):
        raw = (self.value() or "").strip()
        if not raw:
            return queryset
        if not raw.isdecimal() or len(raw) > 18:
            messages.error(
                request, f"Endpoint filter: {raw[:40]!r} is not an endpoint id (a number)."
            )
            return queryset.none()
        return queryset.filter(**{f"{self.endpoint_field}_id": int(raw)})


class AttemptTenantKeyFilter(TenantKeyFilter):
    """Attempts of one tenant, by the endpoints they went to (an attempt carries its
    endpoint): the tenant's endpoint ids, looked up first, are an index range each on a
    table of tens of millions of attempts, where a join through their deliveries reads
    attempts newest first until a page of the tenant's turns up (bench/history.py).
    Attempts written before they carried their endpoint are not found
    this way (they leave with retention)."""

    def queryset(self, request, queryset):
        key = (self.value() or "").strip()
        if not key:
            return queryset
        endpoints = list(Endpoint.objects.filter(tenant__key=key).values_list("pk", flat=True))
        return queryset.filter(endpoint_id__in=endpoints)

"""Every tenant-scoped route starts here: the tenant a URL names, if the token may see
it. Everything else is then looked up within that tenant, so another tenant's id is
simply not found (404), never "forbidden", which would confirm that it exists."""

from django.db.models import Model, QuerySet
from rest_framework.exceptions import NotFound
from rest_framework.request import Request

from tenants.models import Tenant

NO_TENANT = "No tenant has this key."


def tenants_visible(request: Request) -> QuerySet[Tenant]:
    token = request.auth
    tenants = Tenant.objects.all()
    return tenants if token.is_operator else tenants.filter(pk=token.tenant_id)


def tenant_for(request: Request, key: str) -> Tenant:
    tenant = tenants_visible(request).filter(key=key).first()
    if tenant is None:
        raise NotFound(NO_TENANT)
    return tenant


def one(queryset: QuerySet, what: str, **lookup: object) -> Model:
    """The row `lookup` names within an already tenant-scoped queryset, or 404."""
    try:
        found = queryset.filter(**lookup).first()
    except (ValueError, TypeError):
        found = None  # an id of the wrong shape names nothing
    if found is None:
        raise NotFound(f"No {what} has this id.")
    return found

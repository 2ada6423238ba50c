"""What a signed-in member may do on their tenant's portal: viewers read, admins change.

Staff who open a tenant's pages through `tenants.view_tenant` read them like a viewer;
operators change endpoints in the Django admin, where their own permissions apply.
"""

from django.http import HttpRequest

from dashboards.access import TenantAccess
from tenants.models import Membership


def is_tenant_admin(request: HttpRequest, access: TenantAccess) -> bool:
    if access.shared or not request.user.is_authenticated:
        return False  # a share link is read-only whoever holds it
    return Membership.objects.filter(
        user=request.user, tenant=access.tenant, role=Membership.ADMIN
    ).exists()

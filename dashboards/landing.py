"""The site's front door (/): where operators and tenants each go from here.

Anonymous visitors see both doors. A signed-in user sees the dashboards of their own
tenants (their memberships, never anyone else's key) and, if staff, the admin and the
operations overview. The full list staff may open is /t/'s job, not this page's.
"""

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.cache import never_cache

from tenants.models import Tenant

TENANTS_SHOWN = 20  # more than this: the link to /t/ lists them all


@never_cache
def landing(request: HttpRequest) -> HttpResponse:
    user = request.user
    own: list[Tenant] = []
    if user.is_authenticated:
        memberships = Tenant.objects.filter(memberships__user=user).order_by("key")
        own = list(memberships[: TENANTS_SHOWN + 1])
    return render(
        request,
        "dashboards/landing.html",
        {
            "tenants": own[:TENANTS_SHOWN],
            "more": len(own) > TENANTS_SHOWN,
            # The overview answers 403 without it: no link to a page that refuses.
            "can_view_overview": user.is_staff and user.has_perm("tenants.view_tenant"),
        },
    )

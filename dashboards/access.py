"""The one gate every tenant-facing view goes through.

A signed share link opens its own tenant's read-only dashboard; otherwise the user must
be signed in and a member of the tenant (or staff allowed to view tenants). Anyone else
gets 404, not 403, so a dashboard never confirms that another tenant exists. Anonymous
users go to the login page before any lookup, for the same reason.
"""

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from functools import wraps

from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.cache import never_cache

from tenants.models import Membership, Tenant
from tenants.share import ShareLinkExpired, ShareLinkInvalid, read_token


class LoginRequired(Exception):
    pass


@dataclass(frozen=True)
class TenantAccess:
    tenant: Tenant
    share_token: str | None = None  # set: a read-only view through a share link
    share_expires_at: datetime | None = None

    @property
    def shared(self) -> bool:
        return self.share_token is not None


def may_view(user, tenant: Tenant) -> bool:
    if not (user.is_authenticated and user.is_active):
        return False
    if user.is_staff and user.has_perm("tenants.view_tenant"):
        return True  # operators open any tenant's dashboard from the overview
    return Membership.objects.filter(user=user, tenant=tenant).exists()


def may_change(user, tenant: Tenant) -> bool:
    """Whether `user` may act on the tenant's rows from the portal (resend a delivery…):
    its admins only. Viewers read; staff act through the Django admin, where each action
    has its own permission."""
    if not (user.is_authenticated and user.is_active):
        return False
    return Membership.objects.filter(user=user, tenant=tenant, role=Membership.ADMIN).exists()


def is_tenant_admin(request: HttpRequest, access: TenantAccess) -> bool:
    """Whether this request may change the tenant's endpoints and deliveries: signed in
    as one of its admins, not through a share link (read-only whoever holds it)."""
    return not access.shared and may_change(request.user, access.tenant)


def get_tenant_access(
    request: HttpRequest, key: str, share_token: str | None = None
) -> TenantAccess:
    """The tenant `key` names, if this request may see it; else Http404 or LoginRequired.
    Share links raise ShareLinkExpired when genuine but too old."""
    if share_token is not None:
        try:
            grant = read_token(share_token)
        except ShareLinkInvalid as exc:
            raise Http404("No such dashboard.") from exc
        tenant = Tenant.objects.filter(pk=grant.tenant_id, key=key).first()
        if tenant is None:
            raise Http404("No such dashboard.")
        return TenantAccess(tenant, share_token=share_token, share_expires_at=grant.expires_at)
    if not request.user.is_authenticated:
        raise LoginRequired
    tenant = Tenant.objects.filter(key=key).first()
    if tenant is None or not may_view(request.user, tenant):
        raise Http404("No such dashboard.")
    return TenantAccess(tenant)


TenantView = Callable[..., HttpResponse]


def frame_for_portal(response: HttpResponse) -> HttpResponse:
    """Let the origins in PORTAL_FRAME_ANCESTORS frame this page (an operator's app that
    embeds the portal), and no other: CSP frame-ancestors names them, and X-Frame-Options,
    which can only say "nobody", steps aside. With the setting empty, nothing changes:
    frame-ancestors 'none' and X-Frame-Options: DENY."""
    # A value holding a separator would smuggle in more directives or sources: skipped.
    origins = [
        origin.strip()
        for origin in settings.PORTAL_FRAME_ANCESTORS
        if origin.strip() and not any(char in origin.strip() for char in ";, \t\r\n")
    ]
    if origins:
        # The rest of the page's policy (project/settings.py) stays as it is.
        response._csp_replace = {"frame-ancestors": origins}
        response.xframe_options_exempt = True
    return response


def tenant_view(view: TenantView) -> Callable[..., HttpResponse]:
    """Wrap a view taking (request, access, **kwargs): resolves `key` (and `token`) first.
    Pages are private and live, so nothing is cached, and nothing leaks to other sites
    through the Referer header (a share token least of all)."""

    @wraps(view)
    @never_cache
    def wrapper(
        request: HttpRequest, key: str, token: str | None = None, **kwargs: object
    ) -> HttpResponse:
        try:
            access = get_tenant_access(request, key, token)
        except LoginRequired:
            return redirect_to_login(request.get_full_path(), login_url=reverse("tenants:login"))
        except ShareLinkExpired as exc:
            response = render(
                request, "dashboards/share_expired.html", {"expired_at": exc.expired_at}, status=403
            )
        else:
            response = view(request, access, **kwargs)
        # A share token is in the URL: nothing may carry it anywhere. A member's page has
        # no token, and its forms need the Origin header that no-referrer would make
        # "null" (Django's CSRF check then refuses every POST): same-origin sends it to
        # this site only.
        response["Referrer-Policy"] = "no-referrer" if token is not None else "same-origin"
        response["X-Robots-Tag"] = "noindex, nofollow"
        return frame_for_portal(response)

    return wrapper

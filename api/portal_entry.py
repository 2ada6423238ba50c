"""GET /portal/enter/<token>: a portal link (api.portal_links) signs its visitor in to
one tenant's portal, once.

The operator's app has already decided who the visitor is; the platform has no account
for them and needs none. Each (tenant, visitor) gets a dedicated Django user of its own:
no password, not staff, a member of that one tenant with the link's role and of no other,
so the portal's ordinary checks (dashboards.access) keep the session to that tenant.

Redeeming is a single conditional UPDATE: two clicks racing on one link sign in once.
Whatever is wrong with a link (used, expired, altered, unknown) the answer is the same
page, asking for a new link; it never says more to someone holding a bad token.
"""

import hashlib
import logging

from axes.handlers.proxy import AxesProxyHandler
from axes.helpers import get_lockout_response
from django.contrib.auth import get_user_model, login
from django.contrib.auth.hashers import make_password
from django.contrib.auth.models import AbstractBaseUser
from django.contrib.auth.signals import user_login_failed
from django.db import transaction
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from api.models import PortalLink
from dashboards.access import frame_for_portal
from dashboards.sign_in_limits import PORTAL_LINK_CREDENTIALS
from tenants import audit
from tenants.models import AuditEntry, Membership
from webhooks.models import hash_token

logger = logging.getLogger(__name__)
MAX_TOKEN_CHARS = 100  # token_urlsafe(32) is 43; anything much longer is not ours
USERNAME_PREFIX = "portal-"
VISITOR_HASH_CHARS = 16
BACKEND = "django.contrib.auth.backends.ModelBackend"


def visitor_username(tenant_pk: int, visitor: str) -> str:
    """One username per (tenant, visitor), in a shape people's usernames do not take."""
    digest = hashlib.sha256(visitor.encode()).hexdigest()[:VISITOR_HASH_CHARS]
    return f"{USERNAME_PREFIX}{tenant_pk}-{digest}"


def _visitor_user(link: PortalLink) -> AbstractBaseUser | None:
    """The link's dedicated user, a member of the link's tenant alone with its role; None
    when the username belongs to someone else (a person, staff) or was deactivated by an
    operator, who can stop a visitor that way."""
    user, _ = get_user_model().objects.get_or_create(
        username=visitor_username(link.tenant_id, link.visitor),
        defaults={"first_name": link.visitor[:150], "password": make_password(None)},
    )
    if user.is_staff or user.is_superuser or user.has_usable_password() or not user.is_active:
        logger.warning("portal link %s: user %s is not a portal visitor's", link.pk, user.pk)
        return None
    Membership.objects.filter(user=user).exclude(tenant_id=link.tenant_id).delete()
    Membership.objects.update_or_create(
        user=user, tenant_id=link.tenant_id, defaults={"role": link.role}
    )
    return user


def _redeem(secret: str) -> tuple[PortalLink, AbstractBaseUser] | None:
    """Use the link up and make its visitor ready to sign in; None if it cannot be."""
    if len(secret) > MAX_TOKEN_CHARS:
        return None
    digest = hash_token(secret)
    now = timezone.now()
    with transaction.atomic():
        claimed = PortalLink.objects.filter(
            token_hash=digest, used_at__isnull=True, expires_at__gt=now
        ).update(used_at=now)
        if claimed != 1:
            return None
        link = PortalLink.objects.select_related("tenant").get(token_hash=digest)
        # A link whose user cannot be had stays used: a retry would meet the same user.
        user = _visitor_user(link)
        if user is None:
            return None
        link.used_by = user
        link.save(update_fields=["used_by"])
        audit.record(
            actor=user,
            action=AuditEntry.Action.PORTAL_LINK_USED,
            via=AuditEntry.Via.PORTAL,
            tenant=link.tenant,
            target=f"portal link {link.pk}",
            visitor=link.visitor,
            role=link.role,
        )
    return link, user


@never_cache
@require_GET
def enter(request: HttpRequest, token: str) -> HttpResponse:
    # Bad links count like wrong passwords (django-axes, by address): past the limit the
    # landing pauses, even for a good link, whose use would otherwise tell a guesser so.
    if AxesProxyHandler.is_locked(request, PORTAL_LINK_CREDENTIALS):
        return frame_for_portal(get_lockout_response(request, None, PORTAL_LINK_CREDENTIALS))
    redeemed = _redeem(token)
    if redeemed is None:
        user_login_failed.send(__name__, credentials=PORTAL_LINK_CREDENTIALS, request=request)
        response = render(request, "dashboards/portal_link_refused.html", status=403)
    else:
        link, user = redeemed
        login(request, user, backend=BACKEND)
        response = redirect(reverse("tenants:dashboard", kwargs={"key": link.tenant.key}))
        response.status_code = 303
    # The token is in this URL: nothing may carry it on, nor keep the answer.
    response["Referrer-Policy"] = "no-referrer"
    response["X-Robots-Tag"] = "noindex, nofollow"
    return frame_for_portal(response)

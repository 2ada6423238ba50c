"""/api/v1/tenants/{key}/portal-links: one-use links that sign a visitor in to one
tenant's portal, for an operator's app that shows its customers their webhooks without
giving them an account here. The app asks for a link when its user opens the page and
sends the browser there (GET /portal/enter/<token>, api.portal_entry).

A link is a secret: only its sha256 is stored, it works once and for PORTAL_LINK_SECONDS
at most, and its answer is never kept (no Idempotency-Key here, which would store it).
A viewer link shows what a read-only token reads, so a read-only token may make one; an
admin link acts on the tenant's endpoints and deliveries and needs a read-write token.
"""

import secrets
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.urls import path, reverse
from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import exceptions, serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from api.auth import TokenAccess
from api.models import PortalLink
from api.portal_entry import enter
from api.routes import KEY, tenant_route
from api.schema import errors
from api.scope import tenant_for
from api.strict import StrictSerializer
from tenants import audit
from tenants.models import AuditEntry, Membership
from webhooks.models import ApiToken, hash_token

MIN_SECONDS = 10
SECRET_BYTES = 32
DEFAULT_VISITOR = "portal visitor"
# Used and expired links serve no purpose once their day is over (the audit trail keeps
# who came in); each new link clears a few, as the idempotency keys are cleared.
KEPT_AFTER_EXPIRY = timedelta(days=1)
EXPIRED_DELETED_PER_REQUEST = 100


class PortalLinkAccess(TokenAccess):
    """TokenAccess, except that a read-only token may POST here (for a viewer link)."""

    def has_permission(self, request: Request, view: object) -> bool:
        token = request.auth
        if (
            request.method == "POST"
            and isinstance(token, ApiToken)
            and token.access == ApiToken.Access.READ
        ):
            return True
        return super().has_permission(request, view)


class PortalLinkIn(StrictSerializer):
    role = serializers.ChoiceField(
        choices=[Membership.VIEWER, Membership.ADMIN],
        default=Membership.VIEWER,
        help_text="viewer reads; admin also changes endpoints, resends and replays "
        "(a read-write token only).",
    )
    visitor = serializers.CharField(
        max_length=150,
        default=DEFAULT_VISITOR,
        help_text="Who your app says this is (an email, a user id): one portal user per "
        "visitor and tenant, named in the audit trail.",
    )

    def validate_visitor(self, value: str) -> str:
        if not value.isprintable():
            raise serializers.ValidationError("Printable text.")
        return value

    def get_fields(self) -> dict[str, serializers.Field]:
        fields = super().get_fields()
        # Made per use, not once at import: its maximum is a setting, and the document
        # states the one in force.
        fields["ttl_seconds"] = serializers.IntegerField(
            min_value=MIN_SECONDS,
            max_value=settings.PORTAL_LINK_SECONDS,
            required=False,
            help_text="How long the link waits to be used, up to PORTAL_LINK_SECONDS (300 "
            "by default), which is also the default.",
        )
        return fields


class PortalLinkOut(serializers.Serializer):
    url = serializers.URLField(help_text="Send the visitor's browser here, once.")
    expires_at = serializers.DateTimeField()
    role = serializers.ChoiceField(choices=[Membership.VIEWER, Membership.ADMIN])


def _clear_expired() -> None:
    cutoff = timezone.now() - KEPT_AFTER_EXPIRY
    old = PortalLink.objects.filter(expires_at__lt=cutoff)
    PortalLink.objects.filter(
        pk__in=list(old.values_list("pk", flat=True)[:EXPIRED_DELETED_PER_REQUEST])
    ).delete()


class PortalLinkList(APIView):
    permission_classes = [PortalLinkAccess]

    @extend_schema(
        operation_id="portal_links_create",
        request=PortalLinkIn,
        responses={201: PortalLinkOut, **errors(404, 422)},
    )
    def post(self, request: Request, key: str) -> Response:
        """A link that signs one visitor in to this tenant's portal, once, before
        expires_at. Ask for a new one each time the visitor opens the portal."""
        tenant = tenant_for(request, key)
        given = PortalLinkIn(data=request.data)
        given.is_valid(raise_exception=True)
        data = given.validated_data
        token = request.auth
        if data["role"] == Membership.ADMIN and token.access != ApiToken.Access.WRITE:
            raise exceptions.PermissionDenied("An admin link needs a read-write token.")
        secret = secrets.token_urlsafe(SECRET_BYTES)
        now = timezone.now()
        seconds = data.get("ttl_seconds", settings.PORTAL_LINK_SECONDS)
        _clear_expired()
        with transaction.atomic():
            link = PortalLink.objects.create(
                tenant=tenant,
                role=data["role"],
                visitor=data["visitor"],
                token_hash=hash_token(secret),
                created_by=token,
                created_at=now,
                expires_at=now + timedelta(seconds=seconds),
            )
            audit.record(
                actor=token,
                action=AuditEntry.Action.PORTAL_LINK_CREATED,
                via=AuditEntry.Via.API,
                tenant=tenant,
                target=f"portal link {link.pk}",
                role=link.role,
                visitor=link.visitor,
                expires_at=link.expires_at.isoformat(),
            )
        url = request.build_absolute_uri(reverse("portal-enter", kwargs={"token": secret}))
        return Response(
            {"url": url, "expires_at": link.expires_at.isoformat(), "role": link.role},
            status=201,
            headers={"Cache-Control": "no-store"},
        )


urlpatterns = [
    tenant_route(rf"{KEY}/portal-links", PortalLinkList, "api-portal-links"),
    # Not under /api/v1/: a browser comes here, with cookies, on the full middleware stack.
    path("portal/enter/<str:token>", enter, name="portal-enter"),
]

"""Who is calling: a bearer token (webhooks.models.ApiToken), and what it may do.

Operator tokens (no tenant) reach every tenant; a tenant's token reaches its own and
nothing else, and another tenant's rows answer 404 exactly as rows that do not exist
(api.scope). Read-only tokens read; publish-only tokens, the kind made before this API
existed, are refused here with 403 and keep publishing at POST /api/v1/events.
"""

from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication
from rest_framework.permissions import SAFE_METHODS, BasePermission
from rest_framework.request import Request

from ingest.api import authenticate as token_of
from webhooks.models import ApiToken


class BearerTokenAuthentication(BaseAuthentication):
    def authenticate(self, request: Request) -> tuple[ApiToken, ApiToken] | None:
        if not request.headers.get("Authorization"):
            return None
        token = token_of(request._request)
        if token is None:
            raise exceptions.AuthenticationFailed("The bearer token is not valid or was revoked.")
        return token, token

    def authenticate_header(self, request: Request) -> str:
        # Makes DRF answer 401 (with this challenge) rather than 403 to a missing token.
        return 'Bearer realm="api"'


class TokenAccess(BasePermission):
    """A management token, and a read-write one for anything but reading."""

    def has_permission(self, request: Request, view: object) -> bool:
        token = request.auth
        if not isinstance(token, ApiToken):
            raise exceptions.NotAuthenticated("Send a token: Authorization: Bearer <token>.")
        if token.access == ApiToken.Access.PUBLISH:
            raise exceptions.PermissionDenied(
                "This token may only publish events (POST /api/v1/events); the management "
                "API needs a read-only or read-write token."
            )
        if request.method not in SAFE_METHODS and token.access != ApiToken.Access.WRITE:
            raise exceptions.PermissionDenied("This token is read-only.")
        return True


def require_operator(request: Request) -> None:
    """For acts that are the operator's alone (creating tenants, their weight and rate)."""
    if not request.auth.is_operator:
        raise exceptions.PermissionDenied("Only an operator token may do this.")

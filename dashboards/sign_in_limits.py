"""How django-axes counts failed sign-ins (AXES_LOCKOUT_PARAMETERS, AXES_FAILURE_LIMIT):
a password by username and by address, after LOGIN_FAILURE_LIMIT failures; a portal link,
which has no username, by address alone, after PORTAL_LINK_FAILURE_LIMIT bad links (more:
a visitor clicking an old link is no guesser, and links are too long to guess anyway)."""

from typing import Any

from axes.models import AccessBase
from django.conf import settings
from django.http import HttpRequest

# The credentials a portal link's landing reports to django-axes.
PORTAL_LINK_CREDENTIALS = {"portal_link": True}


def _is_portal_link(request_or_attempt: HttpRequest | AccessBase, credentials: Any) -> bool:
    if isinstance(credentials, dict) and credentials.get("portal_link"):
        return True
    # An attempt read back from the table: portal links record no username.
    return isinstance(request_or_attempt, AccessBase) and not request_or_attempt.username


def lockout_parameters(
    request_or_attempt: HttpRequest | AccessBase, credentials: Any = None
) -> list[str]:
    if _is_portal_link(request_or_attempt, credentials):
        return ["ip_address"]
    return ["username", "ip_address"]


def failure_limit(request: HttpRequest, credentials: Any = None) -> int:
    if _is_portal_link(request, credentials):
        return settings.PORTAL_LINK_FAILURE_LIMIT
    return settings.LOGIN_FAILURE_LIMIT

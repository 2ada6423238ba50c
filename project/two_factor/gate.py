"""The door: with ADMIN_REQUIRE_2FA on, a staff member signed in by password alone reaches
nothing but the second-factor pages (and signing out) until a code is typed. With it off,
the same holds for whoever set up an authenticator of their own accord."""

from collections.abc import Callable
from urllib.parse import urlencode

from django.conf import settings
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse

from project.two_factor import devices

# The bearer-token API never reads the session; static files carry nothing to protect.
_OPEN_PREFIXES = ("/api/", "/static/")


def _open_paths() -> tuple[str, ...]:
    return (reverse("two-factor"), reverse("two-factor-enrol"), reverse("admin:logout"))


class RequireOperatorSecondFactor:
    """After django_otp's OTPMiddleware, which tells whether this session typed a code."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if self._must_verify(request):
            return HttpResponseRedirect(
                f"{reverse('two-factor')}?{urlencode({'next': request.get_full_path()})}"
            )
        return self.get_response(request)

    @staticmethod
    def _must_verify(request: HttpRequest) -> bool:
        user = request.user
        if not (user.is_authenticated and user.is_staff) or user.is_verified():
            return False
        path = request.path
        if path.startswith(_OPEN_PREFIXES) or path in _open_paths():
            return False
        return settings.ADMIN_REQUIRE_2FA or devices.authenticator(user) is not None

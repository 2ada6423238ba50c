"""The second-factor pages under /admin/2fa/: the check after a password sign-in, the
first sign-in's enrolment (QR code, a code typed back, recovery codes shown once), and a
fresh set of recovery codes. Wrong codes are throttled per device by django-otp: each
failure doubles the wait before the next try."""

import base64
import logging
import re
from collections.abc import Callable

import segno
from django.contrib import admin, messages
from django.contrib.auth.decorators import user_passes_test
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods
from django_otp import login as otp_login
from django_otp import verify_token
from django_otp.models import Device

from project.two_factor import devices

logger = logging.getLogger(__name__)
_AUTHENTICATOR_CODE = re.compile(r"\d{6}")


def _next_url(request: HttpRequest) -> str:
    wanted = request.POST.get("next") or request.GET.get("next") or ""
    if url_has_allowed_host_and_scheme(
        wanted, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return wanted
    return reverse("admin:index")


def _page(
    request: HttpRequest, template: str, context: dict, error: str | None = None
) -> HttpResponse:
    """A page in the admin's frame; a refused code makes it a 400 saying why."""
    return render(
        request,
        template,
        {**admin.site.each_context(request), "next": _next_url(request), "error": error, **context},
        status=400 if error else 200,
    )


def _codes_page(request: HttpRequest, codes: list[str], *, first_time: bool) -> HttpResponse:
    """Recovery codes, shown this once (never stored in the clear anywhere we show)."""
    context = {"title": "Your recovery codes", "codes": codes, "first_time": first_time}
    return _page(request, "two_factor/recovery_codes.html", context)


def _refusal(device: Device) -> str | None:
    """Why the device takes no code now (django-otp's throttle), or None."""
    allowed, details = device.verify_is_allowed()
    if allowed:
        return None
    until = (details or {}).get("locked_until")
    seconds = max(1, int((until - timezone.now()).total_seconds()) + 1) if until else 1
    return (
        f"Wait {seconds} second{'s' if seconds != 1 else ''} before the next try: each wrong "
        "code doubles the wait."
    )


def _verify(device: Device | None, code: str) -> str | None:
    """None if the code is the device's (a recovery code is then used up), else why not."""
    if device is None:
        return "That code is not right."
    refusal = _refusal(device)
    if refusal:
        return refusal
    if verify_token(device.user, device.persistent_id, code):
        return None
    return "That code is not right."


def two_factor_page(view: Callable[[HttpRequest], HttpResponse]) -> Callable[..., HttpResponse]:
    """Never cached, staff only (others go to the admin's sign-in), GET or POST."""
    allowed = require_http_methods(["GET", "POST"])(view)
    staff = user_passes_test(lambda user: user.is_active and user.is_staff, "admin:login")
    return never_cache(staff(allowed))


@two_factor_page
def check(request: HttpRequest) -> HttpResponse:
    user = request.user
    if user.is_verified():
        return HttpResponseRedirect(_next_url(request))
    authenticator = devices.authenticator(user)
    if authenticator is None:
        return HttpResponseRedirect(f"{reverse('two-factor-enrol')}?{request.GET.urlencode()}")
    error = None
    if request.method == "POST":
        code = "".join(request.POST.get("code", "").split())
        device = (
            authenticator if _AUTHENTICATOR_CODE.fullmatch(code) else devices.recovery_device(user)
        )
        error = _verify(device, code)
        if error is None:
            otp_login(request, device)
            if device != authenticator:
                left = devices.recovery_codes_left(user)
                logger.warning("%s signed in with a recovery code (%d left)", user, left)
                messages.warning(
                    request,
                    f"You used a recovery code: {left} left. Make a new set under "
                    "Two-factor sign-in if you are running out.",
                )
            return HttpResponseRedirect(_next_url(request))
    return _page(request, "two_factor/check.html", {"title": "Two-factor sign-in"}, error)


@two_factor_page
def enrol(request: HttpRequest) -> HttpResponse:
    user = request.user
    if devices.authenticator(user) is not None:
        # Replacing an authenticator is a reset (manage.py reset_2fa), never a page a
        # password alone can reach.
        return HttpResponseRedirect(f"{reverse('two-factor')}?{request.GET.urlencode()}")
    device = devices.pending_authenticator(user)
    error = None
    if request.method == "POST":
        code = "".join(request.POST.get("code", "").split())
        error = _verify(device, code)
        if error is None:
            device.confirmed = True
            device.save(update_fields=["confirmed"])
            codes = devices.new_recovery_codes(user)
            otp_login(request, device)
            logger.info("%s enrolled an authenticator", user)
            return _codes_page(request, codes, first_time=True)
    secret = base64.b32encode(device.bin_key).decode()
    return _page(
        request,
        "two_factor/enrol.html",
        {
            "title": "Set up two-factor sign-in",
            "qr_svg": segno.make(device.config_url, error="m").svg_inline(scale=5),
            "secret": " ".join(secret[i : i + 4] for i in range(0, len(secret), 4)),
        },
        error,
    )


@two_factor_page
def recovery_codes(request: HttpRequest) -> HttpResponse:
    user = request.user
    if not user.is_verified():
        return HttpResponseRedirect(f"{reverse('two-factor')}?next={request.path}")
    if request.method == "POST":
        logger.info("%s made new recovery codes", user)
        return _codes_page(request, devices.new_recovery_codes(user), first_time=False)
    return _page(
        request,
        "two_factor/recovery_status.html",
        {"title": "Recovery codes", "left": devices.recovery_codes_left(user)},
    )

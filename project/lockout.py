"""The page a locked-out sign-in gets (django-axes' AXES_LOCKOUT_CALLABLE): 429, in the
portal's style, saying how long the pause lasts and that it ends by itself."""

from typing import Any

from axes.helpers import get_cool_off, get_failure_limit
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render


def locked_out(
    request: HttpRequest, original_response: HttpResponse | None, credentials: Any
) -> HttpResponse:
    cool_off = get_cool_off(request)
    minutes = max(1, round(cool_off.total_seconds() / 60)) if cool_off else None
    response = render(
        request,
        "registration/locked_out.html",
        {"failure_limit": get_failure_limit(request, credentials), "minutes": minutes},
        status=429,
    )
    if cool_off:
        response["Retry-After"] = str(int(cool_off.total_seconds()))
    return response

"""/metrics: django-prometheus' exporter behind an optional bearer token."""

import hmac

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django_prometheus.exports import ExportToDjangoView

from core.bearer import bearer_token


def metrics(request: HttpRequest) -> HttpResponse:
    """Open when METRICS_TOKEN is unset (development); else `Authorization: Bearer <token>`."""
    token = settings.METRICS_TOKEN
    if token:
        offered = bearer_token(request.headers.get("Authorization", "")) or ""
        if not hmac.compare_digest(offered.encode(), token.encode()):
            response = HttpResponse(
                "metrics need a bearer token\n", status=401, content_type="text/plain"
            )
            response["WWW-Authenticate"] = "Bearer"
            return response
    return ExportToDjangoView(request)

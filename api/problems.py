"""Errors as RFC 9457 problem details, one shape for every answer that is not a success:

    {"type": "about:blank", "title": "Unprocessable Content", "status": 422,
     "detail": "Fix the fields listed in errors.",
     "errors": [{"field": "url", "detail": "Private and loopback addresses are refused."}]}

served as application/problem+json. `errors` lists each wrong field (dotted for nested
ones, "body" for the document as a whole); other problems have none.
"""

import logging
from http import HTTPStatus
from typing import Any

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import DatabaseError
from django.http import Http404, HttpRequest, JsonResponse
from rest_framework import exceptions, serializers
from rest_framework.response import Response
from rest_framework.views import exception_handler

logger = logging.getLogger(__name__)
MEDIA_TYPE = "application/problem+json"
RETRY_AFTER_SECONDS = 5


class FieldError(serializers.Serializer):
    field = serializers.CharField(help_text="The field to fix, dotted when nested; 'body' for all.")
    detail = serializers.CharField()


class Problem(serializers.Serializer):
    """RFC 9457 problem details."""

    type = serializers.CharField(default="about:blank")
    title = serializers.CharField()
    status = serializers.IntegerField()
    detail = serializers.CharField()
    errors = FieldError(many=True, required=False)


class Conflict(exceptions.APIException):
    status_code = 409
    default_detail = "The request conflicts with the current state of the resource."
    default_code = "conflict"


class Unprocessable(exceptions.APIException):
    status_code = 422
    default_detail = "Fix the fields listed in errors."
    default_code = "invalid"


def field_errors(detail: Any, prefix: str = "") -> list[dict[str, str]]:
    """DRF's nested error detail flattened to [{"field", "detail"}]."""
    if isinstance(detail, dict):
        found = []
        for name, inner in detail.items():
            name = "body" if name in ("non_field_errors", "__all__") and not prefix else name
            found += field_errors(inner, f"{prefix}.{name}" if prefix else str(name))
        return found
    if isinstance(detail, list):
        if all(not isinstance(item, dict | list) for item in detail):
            return [{"field": prefix or "body", "detail": str(item)} for item in detail]
        found = []
        for index, inner in enumerate(detail):
            found += field_errors(inner, f"{prefix}[{index}]")
        return found
    return [{"field": prefix or "body", "detail": str(detail)}]


def body(status: int, detail: str, errors: list[dict[str, str]] | None = None) -> dict:
    problem: dict[str, Any] = {
        "type": "about:blank",
        "title": HTTPStatus(status).phrase,
        "status": status,
        "detail": detail,
    }
    if errors:
        problem["errors"] = errors
    return problem


def _translated(exc: Exception) -> Exception:
    if isinstance(exc, Http404):
        return exceptions.NotFound(str(exc) or "Not found.")
    if isinstance(exc, DjangoPermissionDenied):
        return exceptions.PermissionDenied(str(exc) or None)
    if isinstance(exc, DjangoValidationError):
        return Unprocessable(
            {"errors": exc.message_dict if hasattr(exc, "error_dict") else {"body": exc.messages}}
        )
    return exc


def handle(exc: Exception, context: dict) -> Response | None:
    """DRF's EXCEPTION_HANDLER: every error as a problem. A database that cannot answer is
    a 503 with Retry-After; anything else unexpected stays a 500 for Django to log."""
    if isinstance(exc, DatabaseError):
        logger.exception("database unavailable in the management API")
        response = Response(
            body(503, "The database is unavailable; retry later."),
            status=503,
            headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
        )
        response.content_type = MEDIA_TYPE
        return response
    exc = _translated(exc)
    response = exception_handler(exc, context)
    if response is None:
        return None
    status = response.status_code
    errors = None
    if isinstance(exc, exceptions.ValidationError | Unprocessable):
        detail = (
            exc.detail.get("errors", exc.detail) if isinstance(exc.detail, dict) else exc.detail
        )
        errors = field_errors(detail)
        message = "Fix the fields listed in errors."
        if isinstance(exc, exceptions.ValidationError):
            # Well-formed JSON whose values are wrong: 422 (RFC 9110), not "unreadable" 400.
            status = response.status_code = 422
    else:
        message = str(exc.detail) if hasattr(exc, "detail") else HTTPStatus(status).phrase
    response.data = body(status, message, errors)
    response.content_type = MEDIA_TYPE
    return response


def not_found(request: HttpRequest, exception: Exception | None = None) -> JsonResponse:
    """A path under /api/v1/ that names no operation."""
    return JsonResponse(
        body(404, "No operation at this path: see /api/v1/openapi.json."),
        status=404,
        content_type=MEDIA_TYPE,
    )

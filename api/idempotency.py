"""Idempotency-Key on POSTs: a client that retries after a timeout gets the first answer
again instead of a second tenant, endpoint or replay. Keyed per token; a key reused with
a different request is a 422, and a key whose first request is still running a 409.
Only successes are kept: a refused request may be corrected and sent with the same key."""

import functools
import hashlib
import json
import re
from collections.abc import Callable
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from api.models import IdempotentRequest
from api.problems import Conflict, Unprocessable

HEADER = "Idempotency-Key"
MAX_KEY_CHARS = 255
EXPIRED_DELETED_PER_REQUEST = 100
# Visible ASCII, spaces only inside (HTTP drops them at either end): what a UUID or any
# generated key is, and a rule the document can state exactly.
KEY_PATTERN = r"^[!-~]([ -~]*[!-~])?$"

PARAMETER = OpenApiParameter(
    HEADER,
    {"type": "string", "minLength": 1, "maxLength": MAX_KEY_CHARS, "pattern": KEY_PATTERN},
    location=OpenApiParameter.HEADER,
    description="Send the same key again to get the first answer, not a second act (kept "
    "API_IDEMPOTENCY_HOURS, 24 by default).",
)


def _fingerprint(request: Request) -> str:
    body = json.dumps(request.data, sort_keys=True, default=str)
    return hashlib.sha256(f"{request.method} {request.path}\n{body}".encode()).hexdigest()


def _claim(request: Request, key: str) -> IdempotentRequest | None:
    """Our row for this key (None when we are the first to use it), else the earlier one."""
    cutoff = timezone.now() - timedelta(hours=settings.API_IDEMPOTENCY_HOURS)
    expired = IdempotentRequest.objects.filter(created_at__lt=cutoff)
    IdempotentRequest.objects.filter(
        pk__in=list(expired.values_list("pk", flat=True)[:EXPIRED_DELETED_PER_REQUEST])
    ).delete()
    try:
        with transaction.atomic():
            IdempotentRequest.objects.create(
                token=request.auth, key=key, fingerprint=_fingerprint(request)
            )
        return None
    except IntegrityError:
        return IdempotentRequest.objects.get(token=request.auth, key=key)


def idempotent(post: Callable[..., Response]) -> Callable[..., Response]:
    @functools.wraps(post)
    def wrapper(view: object, request: Request, *args: object, **kwargs: object) -> Response:
        key = request.headers.get(HEADER)
        if key is None:
            return post(view, request, *args, **kwargs)
        if len(key) > MAX_KEY_CHARS or not re.fullmatch(KEY_PATTERN, key):
            raise ValidationError(
                {HEADER: [f"1 to {MAX_KEY_CHARS} visible ASCII characters (spaces inside)."]}
            )
        earlier = _claim(request, key)
        if earlier is not None:
            if earlier.fingerprint != _fingerprint(request):
                raise Unprocessable(
                    {"errors": {HEADER: ["Already used with a different request."]}}
                )
            if earlier.status_code is None:
                raise Conflict("The first request with this Idempotency-Key is still running.")
            return Response(
                earlier.response,
                status=earlier.status_code,
                headers={"Idempotent-Replayed": "true"},
            )
        mine = IdempotentRequest.objects.filter(token=request.auth, key=key)
        try:
            response = post(view, request, *args, **kwargs)
        except BaseException:
            mine.delete()
            raise
        if 200 <= response.status_code < 300:
            mine.update(status_code=response.status_code, response=response.data)
        else:
            mine.delete()
        return response

    return wrapper

"""What every JSON door into ingest shares: POST only (405 with `Allow`), no CSRF (the
callers are machines, proven by a signature or a bearer token instead), errors as JSON
with a reason (and the field to fix, where there is one), and a 503 with `Retry-After`
when the database cannot store the event, so the sender retries and nothing is lost."""

import functools
import logging
from collections.abc import Callable

from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt

logger = logging.getLogger(__name__)
RETRY_AFTER_SECONDS = 5


def error(status: int, message: str, **extra: object) -> JsonResponse:
    """`{"error": message, ...extra}`; empty extras (None, "") are left out."""
    body = {"error": message, **{k: v for k, v in extra.items() if v not in (None, "")}}
    return JsonResponse(body, status=status)


def json_post_view(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    @csrf_exempt
    @functools.wraps(view)
    def door(request: HttpRequest, *args: object, **kwargs: object) -> HttpResponse:
        if request.method != "POST":
            response = error(405, "only POST is accepted here")
            response["Allow"] = "POST"
            return response
        try:
            return view(request, *args, **kwargs)
        except DatabaseError:
            logger.exception("database unavailable during %s %s", request.method, request.path)
            response = error(503, "temporarily unable to store events; retry later")
            response["Retry-After"] = str(RETRY_AFTER_SECONDS)
            return response

    return door

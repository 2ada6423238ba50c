"""POST /api/v1/events: the publish API, with platform bearer tokens.

One event: {"tenant", "event_type", "payload", "idempotency_key"?}. A batch:
{"events": [...]} (at most PUBLISH_MAX_BATCH), stored in one transaction. Errors are
JSON with the field to fix: 400 unreadable body, 401 token, 413 too large, 422 invalid.
"""

import json

from django.conf import settings
from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from webhooks.body import BodyTooLarge, read_limited
from webhooks.models import ApiToken, hash_token
from webhooks.publish import PublishError, publish_batch, validate

BEARER = "bearer "


def _error(status: int, message: str, field: str | None = None) -> JsonResponse:
    body = {"error": message}
    if field:
        body["field"] = field
    return JsonResponse(body, status=status)


def authenticate(request: HttpRequest) -> ApiToken | None:
    header = request.headers.get("Authorization", "")
    if not header.lower().startswith(BEARER):
        return None
    # Looked up by hash: an index lookup that never compares secrets character by character.
    token = ApiToken.objects.select_related("tenant").filter(
        token_hash=hash_token(header[len(BEARER) :].strip()), is_active=True
    ).first()
    if token is not None:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=timezone.now())
    return token


@csrf_exempt
@require_POST
def publish_events(request: HttpRequest) -> HttpResponse:
    try:
        return _publish_events(request)
    except DatabaseError:
        response = _error(503, "temporarily unable to store events; retry later")
        response["Retry-After"] = "5"
        return response


def _publish_events(request: HttpRequest) -> HttpResponse:
    token = authenticate(request)
    if token is None:
        response = _error(401, "missing or invalid bearer token")
        response["WWW-Authenticate"] = "Bearer"
        return response
    try:
        raw = read_limited(request, settings.INGEST_MAX_BODY_BYTES)
    except BodyTooLarge:
        return _error(413, f"body larger than {settings.INGEST_MAX_BODY_BYTES} bytes")
    try:
        document = json.loads(raw)
    except (ValueError, RecursionError):
        return _error(400, "body is not valid JSON")
    is_batch = isinstance(document, dict) and "events" in document
    items = document["events"] if is_batch else [document]
    if is_batch and (not isinstance(items, list) or not items):
        return _error(422, "expected a non-empty list", field="events")
    if len(items) > settings.PUBLISH_MAX_BATCH:
        return _error(422, f"at most {settings.PUBLISH_MAX_BATCH} events per request", field="events")
    try:
        requests = [
            validate(item, allowed_tenant=token.tenant, prefix=f"events[{index}]." if is_batch else "")
            for index, item in enumerate(items)
        ]
    except PublishError as exc:
        return _error(422, exc.message, field=exc.field)
    accepted = publish_batch(requests)
    results = [
        {"id": one.event.id, "deliveries": one.deliveries, "duplicate": not one.created} for one in accepted
    ]
    status = 202 if any(one.created for one in accepted) else 200
    return JsonResponse({"events": results} if is_batch else results[0], status=status)

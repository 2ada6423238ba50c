"""POST /api/v1/events: the publish API, with platform bearer tokens.

One event: {"tenant", "event_type", "payload", "idempotency_key"?}. A batch:
{"events": [...]} (at most PUBLISH_MAX_BATCH), stored in one transaction. Errors are
JSON with the field to fix: 400 unreadable body, 401 token, 405 method, 413 too large,
403 a read-only token, 422 invalid, 503 when the database cannot store them (ingest.json_views).

The body must be strict JSON (UTF-8, no NaN/Infinity, no number that overflows a float):
payloads are re-serialized for delivery, and what we send must be JSON that any receiver
can parse.
"""

import json
import math
from datetime import timedelta

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils import timezone

from core.bearer import bearer_token
from ingest.body import BodyError, read_limited
from ingest.json_views import error, json_post_view
from ingest.publish import PublishError, publish_batch, tenants_by_key, validate
from webhooks.models import ApiToken, hash_token

LAST_USED_RESOLUTION = timedelta(seconds=60)
_UTF8_BOM = b"\xef\xbb\xbf"


def authenticate(request: HttpRequest) -> ApiToken | None:
    offered = bearer_token(request.headers.get("Authorization", ""))
    if offered is None:
        return None
    # Looked up by hash: an index lookup that never compares secrets character by character.
    token = (
        ApiToken.objects.select_related("tenant")
        .filter(token_hash=hash_token(offered), is_active=True)
        .first()
    )
    now = timezone.now()
    if token is not None and (
        token.last_used_at is None or now - token.last_used_at > LAST_USED_RESOLUTION
    ):
        # A write per request only to move a timestamp is not worth it: a minute is precise
        # enough to tell a token in use from one that is not.
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
    return token


class _NotStrictJson(ValueError):
    pass


def _reject_constant(name: str) -> float:
    raise _NotStrictJson(f"{name} is not JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _NotStrictJson(f"the number {text[:40]} is too large")
    return value


def unique_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    """json's object_pairs_hook: an object that names a key twice is refused, where the
    json module would keep the last value and let the first pass unseen."""
    found = dict(pairs)
    if len(found) != len(pairs):
        seen = set()
        for key, _ in pairs:
            if key in seen:
                raise _NotStrictJson(f"the key {key[:100]!r} appears twice in one object")
            seen.add(key)
    return found


def parse_document(raw: bytes) -> object:
    """Strict JSON, or ValueError with a reason fit for a 400."""
    try:
        text = raw.removeprefix(_UTF8_BOM).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError("body is not UTF-8") from exc
    try:
        return json.loads(
            text,
            parse_constant=_reject_constant,
            parse_float=_finite_float,
            object_pairs_hook=unique_keys,
        )
    except _NotStrictJson as exc:
        raise ValueError(f"body is not valid JSON: {exc}") from exc
    except RecursionError as exc:
        raise ValueError("body JSON is nested too deeply") from exc
    except ValueError as exc:
        raise ValueError("body is not valid JSON") from exc


@json_post_view
def publish_events(request: HttpRequest) -> HttpResponse:
    token = authenticate(request)
    if token is None:
        response = error(401, "missing or invalid bearer token")
        response["WWW-Authenticate"] = "Bearer"
        return response
    if not token.may_publish:
        return error(403, "this token is read-only: publishing needs a read-write token")
    try:
        raw = read_limited(request, settings.INGEST_MAX_BODY_BYTES)
    except BodyError as exc:
        return error(exc.status, exc.message)
    try:
        document = parse_document(raw)
    except ValueError as exc:
        return error(400, str(exc))
    is_batch = isinstance(document, dict) and "events" in document
    items = document["events"] if is_batch else [document]
    if is_batch and (not isinstance(items, list) or not items):
        return error(422, "expected a non-empty list", field="events")
    if len(items) > settings.PUBLISH_MAX_BATCH:
        return error(
            422, f"at most {settings.PUBLISH_MAX_BATCH} events per request", field="events"
        )
    tenants = tenants_by_key(items)
    try:
        requests = [
            validate(
                item,
                allowed_tenant=token.tenant,
                prefix=f"events[{index}]." if is_batch else "",
                tenants=tenants,
            )
            for index, item in enumerate(items)
        ]
    except PublishError as exc:
        return error(422, exc.message, field=exc.field)
    accepted = publish_batch(requests)
    results = [
        {"id": one.event.id, "deliveries": one.deliveries, "duplicate": not one.created}
        for one in accepted
    ]
    status = 202 if any(one.created for one in accepted) else 200
    return JsonResponse({"events": results} if is_batch else results[0], status=status)

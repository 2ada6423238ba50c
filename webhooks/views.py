"""POST /ingest/<source>/: verify first, then derive the tenant, persist, enqueue, answer.

A forged request is refused before anything is read from it, so it can never choose a
lane. Every refusal is a 4xx with a JSON reason; a database outage is a 503 so the
provider retries; a 2xx is only sent after the commit.
"""

import logging
import time

from django.conf import settings
from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from webhooks import providers
from webhooks.accept import accept, resolve_tenant
from webhooks.body import BodyTooLarge, parse_body, read_limited
from webhooks.fairness_key import KeyResult, extract_key, parse_location
from webhooks.models import Source
from webhooks.signatures import SignatureError, VerificationConfig, verify_request

logger = logging.getLogger(__name__)
# Headers worth keeping with the event (for support and replay); never auth material.
_DROPPED_HEADERS = {"authorization", "cookie", "proxy-authorization"}


def _error(status: int, message: str, **extra: object) -> JsonResponse:
    return JsonResponse({"error": message, **extra}, status=status)


def _verification_config(source: Source) -> VerificationConfig:
    return VerificationConfig(
        scheme=source.scheme,
        secrets=source.active_secrets(),
        tolerance_seconds=settings.INGEST_TIMESTAMP_TOLERANCE_SECONDS,
        hmac_header=source.hmac_header,
        hmac_encoding=source.hmac_encoding,
        hmac_prefix=source.hmac_prefix,
    )


def _tenant_key(source: Source, request: HttpRequest, body_json: object, path: str) -> KeyResult:
    if not source.fairness_key:
        return KeyResult(None, "the source has no fairness key configured")
    return extract_key(
        parse_location(source.fairness_key),
        body_json=body_json,
        headers=dict(request.headers),
        query={key: request.GET.get(key, "") for key in request.GET},
        path_segments=[segment for segment in path.split("/") if segment],
    )


@csrf_exempt
@require_POST
def ingest(request: HttpRequest, slug: str, path: str = "") -> HttpResponse:
    try:
        return _ingest(request, slug, path)
    except DatabaseError:
        logger.exception("database unavailable during ingest of %s", slug)
        response = _error(503, "temporarily unable to store events; retry later")
        response["Retry-After"] = "5"
        return response


def _ingest(request: HttpRequest, slug: str, path: str) -> HttpResponse:
    source = Source.objects.prefetch_related("secrets").filter(slug=slug, is_active=True).first()
    if source is None:
        return _error(404, f"no active source named {slug!r}")
    try:
        raw = read_limited(request, settings.INGEST_MAX_BODY_BYTES)
    except BodyTooLarge:
        return _error(413, f"body larger than {settings.INGEST_MAX_BODY_BYTES} bytes")
    try:
        verify_request(_verification_config(source), request.headers, raw, time.time())
    except SignatureError as exc:
        return _error(401, f"signature verification failed: {exc}")

    parsed = parse_body(raw, request.headers.get("Content-Type", ""))
    tenant, fallback_reason = resolve_tenant(source, _tenant_key(source, request, parsed.json, path))
    headers = {
        name: value for name, value in request.headers.items() if name.lower() not in _DROPPED_HEADERS
    }
    accepted = accept(
        source=source,
        tenant=tenant,
        event_type=providers.event_type(source.scheme, request.headers, parsed.json),
        headers=headers,
        content_type=request.headers.get("Content-Type", "application/octet-stream")[:200],
        payload=raw,
        idempotency_key=providers.idempotency_key(source.scheme, request.headers, parsed.json),
        fallback_reason=fallback_reason,
    )
    body = {
        "id": accepted.event.id,
        "tenant": accepted.event.tenant.key if accepted.event.tenant else None,
        "lane": "tenant" if accepted.event.tenant_id else "fallback",
        "duplicate": not accepted.created,
    }
    if not accepted.event.tenant_id:
        body["fallback_reason"] = accepted.event.fallback_reason
    return JsonResponse(body, status=202 if accepted.created else 200)

"""POST /ingest/<slug>/: verify first, then derive the tenant, persist, enqueue, answer.

A forged request is refused before anything is read from it, so it can never choose a
lane. Every refusal is a 4xx with a JSON reason; a database outage is a 503 so the
provider retries; a 2xx is only sent after the commit. An authentic request is never
refused for the shape of its body: whatever it holds is stored as sent, and when the
tenant key cannot be read from it the event goes to the fallback lane with the reason.
docs/INGEST.md has the table of inputs and answers.
"""

import logging
import time

from django.conf import settings
from django.core.exceptions import SuspiciousOperation, ValidationError
from django.http import HttpRequest, HttpResponse, JsonResponse

from core import tracing
from core.signatures import (
    SignatureError,
    VerificationConfig,
    standard_webhooks_key,
    verify_request,
)
from ingest import config_cache, providers
from ingest.accept import accept_to, destinations_for, load_source, resolve_tenant
from ingest.body import BodyError, check_content_encoding, parse_body, read_limited
from ingest.json_views import error, json_post_view
from webhooks.fairness_key import KeyResult, clean_text, extract_key, header_text, parse_location
from webhooks.models import Source

logger = logging.getLogger(__name__)
# Headers worth keeping with the event (for support and replay); never auth material.
_DROPPED_HEADERS = {"authorization", "cookie", "proxy-authorization"}
CONTENT_TYPE_LENGTH = 200
_WARN_EVERY_SECONDS = 60.0
_last_warned: dict[tuple[int, str], float] = {}


class SourceMisconfigured(Exception):
    """The source cannot verify anything as configured; the operator must fix it."""


def _warn_once_a_minute(source: Source, problem: str) -> None:
    key, now = (source.pk, problem), time.monotonic()
    if now - _last_warned.get(key, -_WARN_EVERY_SECONDS) >= _WARN_EVERY_SECONDS:
        _last_warned[key] = now
        logger.warning("source %s is misconfigured: %s", source.slug, problem)


def _usable_secrets(source: Source, active: list[str]) -> list[str]:
    secrets = [secret for secret in active if secret]
    if source.scheme == Source.STANDARD_WEBHOOKS:
        usable = []
        for secret in secrets:
            try:
                standard_webhooks_key(secret)
            except ValueError:
                _warn_once_a_minute(source, "a Standard Webhooks secret is not whsec_<base64>")
                continue
            usable.append(secret)
        secrets = usable
    return secrets


def verification_config(source: Source, active_secrets: list[str]) -> VerificationConfig:
    """The source's verification settings; SourceMisconfigured when nothing could pass."""
    secrets = _usable_secrets(source, active_secrets)
    if source.scheme != Source.NONE and not secrets:
        raise SourceMisconfigured("no usable signing secret is active")
    if source.scheme == Source.HMAC_SHA256 and not source.hmac_header.strip():
        raise SourceMisconfigured("no signature header is configured")
    try:
        return VerificationConfig(
            scheme=source.scheme,
            secrets=secrets,
            tolerance_seconds=settings.INGEST_TIMESTAMP_TOLERANCE_SECONDS,
            hmac_header=source.hmac_header,
            hmac_encoding=source.hmac_encoding,
            hmac_prefix=source.hmac_prefix,
        )
    except (TypeError, ValueError) as exc:
        raise SourceMisconfigured(str(exc)) from exc


def _tenant_key(source: Source, request: HttpRequest, body_json: object, path: str) -> KeyResult:
    """Only the part of the request the location names is read."""
    if not source.fairness_key:
        return KeyResult(None, "the source has no fairness key configured")
    try:
        location = parse_location(source.fairness_key)
    except ValidationError:
        return KeyResult(None, "the source's fairness-key location is invalid")
    query: dict[str, str] = {}
    if location.kind == "query":
        name = location.parts[0]
        try:
            values = request.GET.getlist(name)
        except SuspiciousOperation:  # more query fields than Django allows
            return KeyResult(None, "the query string has too many fields")
        if len(values) > 1:
            return KeyResult(None, f"query parameter {name} appears more than once")
        query = {name: values[0]} if values else {}
    return extract_key(
        location,
        body_json=body_json,
        headers=request.headers if location.kind == "header" else {},
        query=query,
        path_segments=[segment for segment in path.split("/") if segment],
    )


def _stored_headers(request: HttpRequest) -> dict[str, str]:
    """The request's headers, minus credentials; control characters escaped (PostgreSQL's
    JSON cannot hold NUL)."""
    stored = {}
    for name, value in request.headers.items():
        if name.lower() in _DROPPED_HEADERS:
            continue
        value = header_text(value) or value  # not UTF-8: its bytes, escaped below
        stored[name] = value if value.isprintable() else value.encode("unicode_escape").decode()
    return stored


@json_post_view
def ingest(request: HttpRequest, slug: str, path: str = "") -> HttpResponse:
    body: list[bytes] = []  # read once; a second attempt takes it from here
    try:
        # What this process kept, under the newest version it has seen: the write checks
        # that version in its own statement (ingest.config_cache; PostgreSQL).
        return _ingest(request, slug, path, config_cache.lookups(assume=True), body)
    except config_cache.Stale:
        # The configuration changed since: nothing was written. Again, version first.
        return _ingest(request, slug, path, config_cache.lookups(), body)


def _refused(lookups: config_cache.Lookups, status: int, message: str) -> HttpResponse:
    lookups.refuse()  # raises config_cache.Stale if the refusal rests on an assumed version
    return error(status, message)


def _ingest(
    request: HttpRequest, slug: str, path: str, lookups: config_cache.Lookups, body: list[bytes]
) -> HttpResponse:
    source, active_secrets = load_source(slug, lookups)
    if source is None:
        return _refused(lookups, 404, f"no active source named {slug!r}")
    if not body:
        try:
            check_content_encoding(request)
            body.append(read_limited(request, settings.INGEST_MAX_BODY_BYTES))
        except BodyError as exc:
            # The request's own fault, whatever the configuration: no second attempt
            # (which could not read the body again anyway).
            return error(exc.status, exc.message)
    raw = body[0]
    try:
        config = verification_config(source, active_secrets)
    except SourceMisconfigured as exc:
        lookups.refuse()  # first: the warning is for a source as it is now
        _warn_once_a_minute(source, str(exc))
        return error(401, f"source misconfigured: {exc}; the operator has to fix it")
    try:
        with tracing.span("webhook.verify", {"webhook.scheme": source.scheme}):
            verify_request(config, request.headers, raw, time.time())
    except SignatureError as exc:
        return _refused(lookups, 401, f"signature verification failed: {exc}")

    content_type = request.headers.get("Content-Type", "")
    with tracing.span("webhook.tenant_key"):
        parsed = parse_body(raw, content_type)
        tenant, fallback_reason = resolve_tenant(
            source, _tenant_key(source, request, parsed.json, path), lookups
        )
    event_type = providers.event_type(source.scheme, request.headers, parsed.json)
    accepted = accept_to(
        destinations_for(source, tenant, event_type, lookups),
        lookups.assumed,
        source=source,
        tenant=tenant,
        event_type=event_type,
        headers=_stored_headers(request),
        content_type=clean_text(content_type, CONTENT_TYPE_LENGTH) or "application/octet-stream",
        payload=raw,
        idempotency_key=providers.idempotency_key(source.scheme, request.headers, parsed.json),
        fallback_reason=fallback_reason,
    )
    event = accepted.event
    body = {
        "id": event.id,
        "tenant": event.tenant.key if event.tenant_id else None,
        "lane": "tenant" if event.tenant_id else "fallback",
        "duplicate": not accepted.created,
    }
    if not event.tenant_id:
        body["fallback_reason"] = event.fallback_reason
    return JsonResponse(body, status=202 if accepted.created else 200)

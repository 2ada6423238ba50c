"""What each provider calls the event type and the delivery id (for idempotency).

Signed values come first. Shopify, GitHub and generic HMAC sign only the body, so their
headers are taken as sent; Stripe signs the body (its event `id` and `type` are in it) and
Standard Webhooks signs `webhook-id` with the body, so those are preferred over any header.

A value that is not printable text (NUL, control characters, lone surrogates) is ignored;
an idempotency key longer than MAX_FIELD_LENGTH is replaced by its SHA-256 (truncating it
could make two different keys equal).
"""

import hashlib
from collections.abc import Mapping

from webhooks.fairness_key import HugeInteger, clean_text, duplicated, header_text
from webhooks.models import Source

# Header names in order of preference; the first usable one wins.
IDEMPOTENCY_HEADERS = {
    Source.SHOPIFY: ["X-Shopify-Event-Id", "X-Shopify-Webhook-Id", "Idempotency-Key"],
    Source.GITHUB: ["X-GitHub-Delivery", "Idempotency-Key"],
    Source.STRIPE: ["Idempotency-Key"],  # after the body's `id`
    Source.STANDARD_WEBHOOKS: ["webhook-id", "svix-id", "Idempotency-Key"],
    Source.HMAC_SHA256: ["Idempotency-Key", "webhook-id", "X-Request-Id"],
    Source.NONE: ["Idempotency-Key", "webhook-id", "X-Request-Id"],
}
EVENT_TYPE_HEADERS = {
    Source.SHOPIFY: ["X-Shopify-Topic"],
    Source.GITHUB: ["X-GitHub-Event"],
}
GENERIC_EVENT_TYPE_HEADERS = ["X-Event-Type", "webhook-event-type"]
# Schemes whose body is signed and carries the provider's own event id and type.
_SIGNED_BODY_IDS = {Source.STRIPE: "id"}
_BODY_TYPE_FIRST = {Source.STRIPE, Source.STANDARD_WEBHOOKS}
MAX_FIELD_LENGTH = 200


def _first_header(headers: Mapping[str, str], names: list[str]) -> str | None:
    for name in names:
        value = headers.get(name)
        value = header_text(value) if isinstance(value, str) else None
        if value is not None:
            text = clean_text(value, 10_000)
            if text is not None:
                return text
    return None


def _body_string(body: object, field: str) -> str | None:
    if not isinstance(body, dict) or duplicated(body, field):
        return None
    value = body.get(field)
    if isinstance(value, str) and not isinstance(value, HugeInteger):
        return clean_text(value, 10_000)
    return None


def _bounded_key(value: str | None) -> str | None:
    if value is None or len(value) <= MAX_FIELD_LENGTH:
        return value
    return "sha256:" + hashlib.sha256(value.encode()).hexdigest()


def idempotency_key(scheme: str, headers: Mapping[str, str], body: object) -> str | None:
    """The provider's id for this event, so a resend is recognised; None if it has none."""
    found = None
    if scheme in _SIGNED_BODY_IDS:
        found = _body_string(body, _SIGNED_BODY_IDS[scheme])  # Stripe: evt_1N...
    if found is None:
        found = _first_header(headers, IDEMPOTENCY_HEADERS.get(scheme, ["Idempotency-Key"]))
    return _bounded_key(found)


def event_type(scheme: str, headers: Mapping[str, str], body: object) -> str:
    from_body = _body_string(body, "type") or _body_string(body, "event_type")
    if scheme in _BODY_TYPE_FIRST and from_body:
        return from_body[:MAX_FIELD_LENGTH]
    found = _first_header(headers, EVENT_TYPE_HEADERS.get(scheme, []) + GENERIC_EVENT_TYPE_HEADERS)
    return (found or from_body or "")[:MAX_FIELD_LENGTH]

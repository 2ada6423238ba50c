"""What each provider calls the event type and the delivery id (for idempotency)."""

from collections.abc import Mapping

from webhooks.models import Source

# Header names in order of preference; the first present wins.
_IDEMPOTENCY_HEADERS = {
    Source.SHOPIFY: ["X-Shopify-Event-Id", "X-Shopify-Webhook-Id"],
    Source.GITHUB: ["X-GitHub-Delivery"],
    Source.STANDARD_WEBHOOKS: ["webhook-id", "svix-id"],
}
_EVENT_TYPE_HEADERS = {
    Source.SHOPIFY: ["X-Shopify-Topic"],
    Source.GITHUB: ["X-GitHub-Event"],
}
GENERIC_IDEMPOTENCY_HEADERS = ["Idempotency-Key", "webhook-id", "X-Request-Id"]
GENERIC_EVENT_TYPE_HEADERS = ["X-Event-Type", "webhook-event-type"]
MAX_FIELD_LENGTH = 200


def _first_header(headers: Mapping[str, str], names: list[str]) -> str | None:
    for name in names:
        value = headers.get(name)
        if value and value.strip():
            return value.strip()[:MAX_FIELD_LENGTH]
    return None


def _body_string(body: object, field: str) -> str | None:
    if isinstance(body, dict):
        value = body.get(field)
        if isinstance(value, str) and value.strip():
            return value.strip()[:MAX_FIELD_LENGTH]
    return None


def idempotency_key(scheme: str, headers: Mapping[str, str], body: object) -> str | None:
    """The provider's id for this delivery, so a resend is recognised; None if it has none."""
    names = _IDEMPOTENCY_HEADERS.get(scheme, []) + ["Idempotency-Key"]
    found = _first_header(headers, names)
    if found is None and scheme == Source.STRIPE:
        found = _body_string(body, "id")  # Stripe's event id, e.g. evt_1N...
    if found is None and scheme in (Source.HMAC_SHA256, Source.NONE):
        found = _first_header(headers, GENERIC_IDEMPOTENCY_HEADERS)
    return found


def event_type(scheme: str, headers: Mapping[str, str], body: object) -> str:
    found = _first_header(headers, _EVENT_TYPE_HEADERS.get(scheme, []) + GENERIC_EVENT_TYPE_HEADERS)
    if found is None:
        found = _body_string(body, "type") or _body_string(body, "event_type")
    return found or ""

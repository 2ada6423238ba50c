"""One event as its tenant sees it: what we received, where it went, every attempt.

Nothing here shows a credential: received headers that sign or authenticate are left
out, and the signature we sent is masked (a tenant who could copy it could replay a
signed request to their own receiver from anywhere).
"""

import json
import re
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from delivery.models import Attempt, Delivery
from delivery.replays.resend import RESENDABLE
from tenants.models import Endpoint, Tenant
from webhooks.models import Event

PAYLOAD_SHOWN_BYTES = 64 * 1024
# Deeper payloads are shown as their text: laying them out recurses once per level.
MAX_LAID_OUT_DEPTH = 200
EXCERPT_CHARS = 2000
# Header names that carry a signature, a secret or a credential (Shopify's
# X-Shopify-Hmac-Sha256, GitHub's X-Hub-Signature-256, Stripe-Signature, webhook-signature,
# Authorization, API keys, cookies…).
SENSITIVE_HEADER = re.compile(
    r"signature|hmac|secret|token|auth|cookie|api[-_]?key|password", re.IGNORECASE
)
MASK = "•••••• (masked)"


def endpoint_label(endpoint: Endpoint) -> str:
    """A shared destination belongs to the platform: its description, never its URL (the
    same rule as dashboards.views._endpoint_label)."""
    if endpoint.tenant_id is None:
        return endpoint.description or "the shared destination"
    return endpoint.url


def received_headers(event: Event) -> list[tuple[str, str]]:
    """The headers we received, without any that sign or authenticate the request."""
    return sorted(
        (name, str(value))
        for name, value in (event.headers or {}).items()
        if not SENSITIVE_HEADER.search(name)
    )


def sent_headers(attempt: Attempt) -> list[tuple[str, str]]:
    """The headers we sent, a signature's value masked (the attempt log already drops
    webhook-signature; this also covers any older or custom signing header)."""
    return [
        (name, MASK if SENSITIVE_HEADER.search(name) else str(value))
        for name, value in (attempt.request_headers or {}).items()
    ]


@dataclass(frozen=True)
class Payload:
    text: str
    clipped: bool
    total_bytes: int
    is_json: bool


def parsed_payload(raw: bytes) -> Any:
    """The payload as a JSON value, or ValueError when it is not JSON or is nested deeper
    than MAX_LAID_OUT_DEPTH: a validly signed body of 10,000 nested arrays is accepted and
    delivered as it came, but laying it out (json.dumps, a template, a renderer) would
    recurse past Python's limit, so it is shown as the text it is."""
    try:
        value = json.loads(raw)
    except RecursionError as exc:
        raise ValueError("nested too deeply to lay out") from exc
    if _deeper_than(value, MAX_LAID_OUT_DEPTH):
        raise ValueError("nested too deeply to lay out")
    return value


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether arrays and objects nest more than `limit` deep, without recursing."""
    stack = [(value, 1)] if isinstance(value, dict | list) else []
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        children = item.values() if isinstance(item, dict) else item
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False


def payload(event: Event) -> Payload:
    """The payload pretty-printed when it is JSON, clipped at PAYLOAD_SHOWN_BYTES."""
    raw = bytes(event.payload or b"")
    try:
        text = json.dumps(parsed_payload(raw), indent=2, ensure_ascii=False, sort_keys=False)
        is_json = True
    except ValueError:
        text, is_json = raw.decode("utf-8", errors="replace"), False
    encoded = text.encode("utf-8")
    clipped = len(encoded) > PAYLOAD_SHOWN_BYTES
    if clipped:
        text = encoded[:PAYLOAD_SHOWN_BYTES].decode("utf-8", errors="ignore")
    return Payload(text=text, clipped=clipped, total_bytes=len(raw), is_json=is_json)


def payload_retention_days() -> int:
    """The days after which payloads are removed (delivery.upkeep.retention): never more than the
    event's own retention, whatever the settings say."""
    return min(settings.PAYLOAD_RETENTION_DAYS, settings.RETENTION_DAYS)


def deliveries(tenant: Tenant, event: Event) -> list[dict[str, Any]]:
    """The event's deliveries with their attempts (oldest first), as the page shows them."""
    rows = list(
        Delivery.objects.filter(event=event, tenant=tenant)
        .select_related("endpoint")
        .order_by("id")
    )
    attempts: dict[str, list[Attempt]] = {}
    for attempt in Attempt.objects.filter(delivery_id__in=[d.id for d in rows]).order_by(
        "delivery_id", "started_at", "number"
    ):
        attempts.setdefault(attempt.delivery_id, []).append(attempt)
    return [
        {
            "delivery": delivery,
            "endpoint": endpoint_label(delivery.endpoint),
            "shared": delivery.endpoint.tenant_id is None,
            # Nothing to send once retention removed the payload (delivery.replays.resend refuses too).
            "resendable": delivery.status in RESENDABLE and event.payload_pruned_at is None,
            "attempts": [
                {
                    "attempt": attempt,
                    "headers": sent_headers(attempt),
                    "excerpt": attempt.response_excerpt[:EXCERPT_CHARS],
                }
                for attempt in attempts.get(delivery.id, [])
            ],
        }
        for delivery in rows
    ]

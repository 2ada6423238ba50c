"""The sender side: publish events for a tenant, to be fanned out to its endpoints.

`publish()` is for in-process producers; the HTTP API (ingest/api.py) validates and
calls the same code. Events are persisted, then enqueued on commit.

The event type catalogue (webhooks.models.EventType, read through ingest.catalogue)
applies here: a type whose schema is enforced refuses a payload that does not match it,
and with EVENT_TYPES_REQUIRE_CATALOGUE a type not catalogued (or archived) is refused.
"""

import json
from dataclasses import dataclass

from django.conf import settings

from core import operational
from ingest.accept import Accepted, accept, accept_many, accept_to
from ingest.catalogue import Catalogue, catalogue_for
from tenants.models import Endpoint, Tenant

MAX_EVENT_TYPE_LENGTH = 200
MAX_IDEMPOTENCY_KEY_LENGTH = 255


def _printable(text: str) -> bool:
    """No NUL, control characters or lone surrogates (PostgreSQL and UTF-8 refuse them)."""
    return text.isprintable()


class PublishError(ValueError):
    """Invalid input; `field` names what to fix."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


@dataclass(frozen=True)
class PublishRequest:
    tenant: Tenant
    event_type: str
    payload: bytes
    idempotency_key: str | None


class BatchLookups(dict[str, Tenant]):
    """The tenants a batch names, by key, and the catalogue entries of the event types it
    names (`catalogue`): what `validate` reads for every event of a batch, read once."""

    def __init__(self, tenants: dict[str, Tenant], catalogue: Catalogue) -> None:
        super().__init__(tenants)
        self.catalogue = catalogue


def tenants_by_key(items: list[object]) -> BatchLookups:
    """What a batch names, in one query for its tenants and one for its event types (for
    `validate(..., tenants=...)`)."""
    keys = {
        item["tenant"].strip()
        for item in items
        if isinstance(item, dict) and isinstance(item.get("tenant"), str)
    }
    keys = {key for key in keys if _printable(key)}
    tenants = {tenant.key: tenant for tenant in Tenant.objects.filter(key__in=keys)} if keys else {}
    types = [item.get("event_type") for item in items if isinstance(item, dict)]
    return BatchLookups(tenants, catalogue_for(types))


def _check_catalogue(
    event_type: str, payload: object, catalogue: Catalogue | None, prefix: str
) -> None:
    if catalogue is None:
        catalogue = catalogue_for([event_type])  # one event alone: its own query
    entry = catalogue.get(event_type)
    if settings.EVENT_TYPES_REQUIRE_CATALOGUE and (entry is None or entry.archived):
        state = "not in the event type catalogue" if entry is None else "archived"
        raise PublishError(f"{prefix}event_type", f"{event_type[:100]!r} is {state}")
    problem = entry.check(payload) if entry is not None and entry.check is not None else None
    if problem is not None:
        raise PublishError(f"{prefix}payload", problem)


def validate(
    raw: object,
    *,
    allowed_tenant: Tenant | None = None,
    prefix: str = "",
    tenants: dict[str, Tenant] | None = None,
    use_catalogue: bool = True,
) -> PublishRequest:
    """Check one event's fields; a token bound to a tenant sees other tenants as unknown.

    `tenants`, when given, holds every tenant the caller may name (from `tenants_by_key`),
    so validating a batch costs one query rather than one per event; the catalogue
    entries it carries do the same for event types. `use_catalogue=False` leaves the
    catalogue out (the platform's own test events).
    """
    if not isinstance(raw, dict):
        raise PublishError(prefix.removesuffix(".") or "body", "expected a JSON object")
    key = raw.get("tenant")
    if not isinstance(key, str) or not key.strip():
        raise PublishError(f"{prefix}tenant", "required: the tenant's key (a non-empty string)")
    if not _printable(key.strip()):
        tenant = None  # no tenant key holds control characters (and PostgreSQL refuses NUL)
    elif tenants is not None:
        tenant = tenants.get(key.strip())
    else:
        tenant = Tenant.objects.filter(key=key.strip()).first()
    if tenant is None or (allowed_tenant is not None and tenant.pk != allowed_tenant.pk):
        raise PublishError(f"{prefix}tenant", f"unknown tenant {key.strip()[:100]!r}")
    if tenant.key == operational.TENANT_KEY:
        # Its events are the platform's news (ingest.operational): none may be forged.
        raise PublishError(f"{prefix}tenant", "the platform's own tenant takes no published events")
    event_type = raw.get("event_type")
    if not isinstance(event_type, str) or not event_type.strip():
        raise PublishError(f"{prefix}event_type", "required: a non-empty string")
    if len(event_type) > MAX_EVENT_TYPE_LENGTH:
        raise PublishError(f"{prefix}event_type", f"at most {MAX_EVENT_TYPE_LENGTH} characters")
    if not _printable(event_type):
        raise PublishError(f"{prefix}event_type", "must not contain control characters")
    if "payload" not in raw:
        raise PublishError(f"{prefix}payload", "required: any JSON value")
    idempotency_key = raw.get("idempotency_key")
    if idempotency_key is not None and (
        not isinstance(idempotency_key, str)
        or not idempotency_key.strip()
        or len(idempotency_key) > MAX_IDEMPOTENCY_KEY_LENGTH
    ):
        raise PublishError(
            f"{prefix}idempotency_key",
            f"a non-empty string of at most {MAX_IDEMPOTENCY_KEY_LENGTH} characters",
        )
    if idempotency_key is not None and not _printable(idempotency_key):
        raise PublishError(f"{prefix}idempotency_key", "must not contain control characters")
    try:
        # allow_nan=False: NaN and Infinity are not JSON, and receivers would choke on them.
        payload = json.dumps(raw["payload"], separators=(",", ":"), allow_nan=False).encode()
    except (TypeError, ValueError, RecursionError) as exc:
        raise PublishError(f"{prefix}payload", f"not serializable as JSON: {exc}") from exc
    if use_catalogue:
        catalogue = tenants.catalogue if isinstance(tenants, BatchLookups) else None
        _check_catalogue(event_type.strip(), raw["payload"], catalogue, prefix)
    return PublishRequest(tenant, event_type.strip(), payload, idempotency_key)


def _accept_kwargs(request: PublishRequest) -> dict:
    return {
        "source": None,
        "tenant": request.tenant,
        "event_type": request.event_type,
        "headers": {},
        "content_type": "application/json",
        "payload": request.payload,
        "idempotency_key": request.idempotency_key,
    }


def publish(
    tenant: Tenant | str, event_type: str, payload: object, idempotency_key: str | None = None
) -> Accepted:
    """Publish one event for a tenant (object or key). Raises PublishError on bad input."""
    key = tenant.key if isinstance(tenant, Tenant) else tenant
    request = validate(
        {
            "tenant": key,
            "event_type": event_type,
            "payload": payload,
            "idempotency_key": idempotency_key,
        }
    )
    return accept(**_accept_kwargs(request))


def publish_to_endpoint(endpoint: Endpoint, event_type: str, payload: object) -> Accepted:
    """Publish one event of the endpoint's tenant to that endpoint alone, whatever its
    event-type filter (a "send a test event" button): validated like any event and
    queued in the tenant's lane, but never fanned out to the tenant's other endpoints.
    The catalogue does not apply: the test event's type and payload are the platform's,
    not a publisher's, and a catalogue that must list every type would otherwise break
    the button."""
    if endpoint.tenant_id is None:
        raise PublishError("endpoint", "a shared destination has no tenant to publish for")
    request = validate(
        {"tenant": endpoint.tenant.key, "event_type": event_type, "payload": payload},
        allowed_tenant=endpoint.tenant,
        use_catalogue=False,
    )
    return accept_to([endpoint], **_accept_kwargs(request))


def publish_batch(requests: list[PublishRequest]) -> list[Accepted]:
    """All or nothing: one transaction for the whole batch."""
    return accept_many([_accept_kwargs(request) for request in requests])

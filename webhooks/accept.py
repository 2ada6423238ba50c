"""Persist an accepted event and its deliveries in one transaction, then enqueue on commit.

Shared by ingest (gateway side) and publish (sender side). The caller answers 2xx only
after `accept` returns, i.e. after the commit.
"""

from collections.abc import Iterable
from dataclasses import dataclass

from django.db import IntegrityError, transaction
from django.db.models import F

from delivery.enqueueing import enqueue_on_commit
from delivery.models import Delivery
from tenants.models import Endpoint, Tenant
from webhooks.fairness_key import KeyResult
from webhooks.models import Event, Source


@dataclass(frozen=True)
class Accepted:
    event: Event
    created: bool  # False: an idempotent repeat of an earlier event
    deliveries: int


def resolve_tenant(source: Source, key: KeyResult) -> tuple[Tenant | None, str]:
    """(tenant, fallback reason). Unknown keys register a tenant only if the source allows it."""
    if key.value is None:
        return None, key.missing_reason or "no fairness key configured"
    tenant = Tenant.objects.filter(key=key.value).first()
    if tenant is not None:
        return tenant, ""
    if source.auto_register_tenants:
        tenant, _ = Tenant.objects.get_or_create(
            key=key.value, defaults={"name": key.value, "auto_registered": True}
        )
        return tenant, ""
    return None, "unknown tenant key (auto-registration is off for this source)"


def destinations_for(source: Source | None, tenant: Tenant | None, event_type: str) -> list[Endpoint]:
    """Gateway mode: the source's destinations. Otherwise the tenant's matching endpoints."""
    if source is not None:
        shared = list(source.destinations.all())
        if shared:
            return shared
    if tenant is None:
        return []
    return [endpoint for endpoint in tenant.endpoints.all() if endpoint.accepts(event_type)]


def _existing(source: Source | None, tenant: Tenant | None, idempotency_key: str) -> Event | None:
    if source is not None:
        return Event.objects.filter(source=source, idempotency_key=idempotency_key).first()
    return Event.objects.filter(source=None, tenant=tenant, idempotency_key=idempotency_key).first()


def _deliveries_for(event: Event, endpoints: Iterable[Endpoint]) -> list[Delivery]:
    return [
        Delivery(
            event=event,
            endpoint=endpoint,
            tenant=event.tenant,
            # A disabled endpoint's work is held, not dropped: it resumes when re-enabled.
            status=Delivery.PENDING if endpoint.enabled else Delivery.HELD,
        )
        for endpoint in endpoints
    ]


def accept(
    *,
    source: Source | None,
    tenant: Tenant | None,
    event_type: str,
    headers: dict[str, str],
    content_type: str,
    payload: bytes,
    idempotency_key: str | None,
    fallback_reason: str = "",
) -> Accepted:
    if idempotency_key:
        earlier = _existing(source, tenant, idempotency_key)
        if earlier is not None:
            return Accepted(earlier, created=False, deliveries=0)
    endpoints = destinations_for(source, tenant, event_type)
    try:
        with transaction.atomic():
            event = Event.objects.create(
                source=source,
                tenant=tenant,
                event_type=event_type,
                headers=headers,
                content_type=content_type,
                payload=payload,
                idempotency_key=idempotency_key,
                fallback_reason=fallback_reason[:200],
            )
            deliveries = Delivery.objects.bulk_create(_deliveries_for(event, endpoints))
            if source is not None and tenant is None:
                Source.objects.filter(pk=source.pk).update(fallback_count=F("fallback_count") + 1)
            enqueue_on_commit(deliveries)
    except IntegrityError:
        # Two identical requests raced: the other one committed first; answer with its id.
        earlier = _existing(source, tenant, idempotency_key) if idempotency_key else None
        if earlier is None:
            raise
        return Accepted(earlier, created=False, deliveries=0)
    return Accepted(event, created=True, deliveries=len(deliveries))


def accept_many(items: list[dict]) -> list[Accepted]:
    """Several published events in one transaction (the batch form of the publish API)."""
    with transaction.atomic():
        return [accept(**item) for item in items]

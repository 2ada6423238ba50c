"""What a tenant admin changes on the portal, each change with its audit entry.

Views call these after checking the role; these never check permissions themselves.
Secrets go to the caller (to show once) and nowhere else: not to the audit detail, not
to a log line.
"""

import logging
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from delivery.pipeline import endpoint_health
from ingest.accept import Accepted
from ingest.publish import publish_to_endpoint
from tenants import audit, operations
from tenants.models import AuditEntry, Endpoint, EndpointSecret

logger = logging.getLogger(__name__)

PORTAL = AuditEntry.Via.PORTAL
EDITABLE = ("url", "description", "event_types", "operational_events", "send_trace_context")
TEST_EVENT_TYPE = "webhook.test"


def _audit(endpoint: Endpoint, actor, action: AuditEntry.Action, via: str, **detail: Any) -> None:
    audit.record(
        actor=actor,
        action=action,
        via=via,
        tenant=endpoint.tenant,
        target=f"endpoint {endpoint.pk}",
        **detail,
    )


def create_endpoint(endpoint: Endpoint, actor, *, via: str = PORTAL) -> str | None:
    """Save a new endpoint (tenant already set); returns its generated secret, if any."""
    with transaction.atomic():
        endpoint.save()
        _audit(
            endpoint,
            actor,
            AuditEntry.Action.ENDPOINT_CREATED,
            via=via,
            new={field: getattr(endpoint, field) for field in EDITABLE},
        )
    return endpoint.generated_secret


def change_endpoint(
    endpoint: Endpoint,
    before: dict[str, Any],
    actor,
    *,
    via: str = PORTAL,
    fields: tuple[str, ...] = EDITABLE,
) -> dict[str, Any]:
    """Save edited fields; audit old and new values of those that changed (none: no row)."""
    changed = {f: before[f] for f in fields if before[f] != getattr(endpoint, f)}
    if not changed:
        return {}
    with transaction.atomic():
        endpoint.save(update_fields=list(changed))
        _audit(
            endpoint,
            actor,
            AuditEntry.Action.ENDPOINT_CHANGED,
            via=via,
            old=changed,
            new={f: getattr(endpoint, f) for f in changed},
        )
    return changed


def disable_endpoint(endpoint: Endpoint, reason: str, actor, *, via: str = PORTAL) -> bool:
    """Disable with the admin's reason; its deliveries are held, not lost. False if it
    was already disabled."""
    with transaction.atomic():
        done = endpoint_health.disable(endpoint, f"Disabled by {actor.get_username()}: {reason}")
        if done:
            _audit(
                endpoint,
                actor,
                AuditEntry.Action.ENDPOINT_DISABLED,
                via=via,
                reason=reason,
                old={"enabled": True},
                new={"enabled": False},
            )
    return done


def enable_endpoint(endpoint: Endpoint, actor, *, via: str = PORTAL) -> int:
    """Re-enable; its held deliveries resume in order. Returns how many resumed."""
    return operations.enable_endpoint(endpoint, actor=actor, via=via)


def active_secrets(endpoint: Endpoint) -> list[EndpointSecret]:
    now = timezone.now()
    return list(endpoint.secrets.filter(Q(expires_at__isnull=True) | Q(expires_at__gt=now)))


def reveal_secrets(endpoint: Endpoint, actor, *, via: str = PORTAL) -> list[EndpointSecret]:
    """The active secrets, for the caller to show once; the act is audited."""
    shown = active_secrets(endpoint)
    _audit(
        endpoint,
        actor,
        AuditEntry.Action.SECRET_REVEALED,
        via=via,
        secrets_shown=len(shown),
    )
    logger.info("user %s revealed the signing secret of endpoint %s", actor, endpoint.pk)
    return shown


def rotate_secret(
    endpoint: Endpoint, overlap: timedelta, actor, *, via: str = PORTAL
) -> EndpointSecret:
    """A new secret signs from now on; the secrets active now keep signing beside it
    until now + overlap, so a receiver can switch without a gap (deliveries carry one
    signature per active secret). A secret already expiring sooner keeps its own time."""
    now = timezone.now()
    until = now + overlap
    with transaction.atomic():
        endpoint.secrets.filter(Q(expires_at__isnull=True) | Q(expires_at__gt=until)).update(
            expires_at=until
        )
        new = EndpointSecret.objects.create(endpoint=endpoint)
        _audit(
            endpoint,
            actor,
            AuditEntry.Action.SECRET_ROTATED,
            via=via,
            overlap_hours=overlap.total_seconds() / 3600,
            old_expires_at=until.isoformat(),
        )
    logger.info("user %s rotated the signing secret of endpoint %s", actor, endpoint.pk)
    return new


TEST_EVENTS_PER_MINUTE = 10


class TooManyTestEvents(Exception):
    """A test button is for trying an endpoint, not for load: a tight loop of them would
    fill the tenant's own lane and its audit trail."""

    message = (
        f"At most {TEST_EVENTS_PER_MINUTE} test events a minute per endpoint; try again shortly."
    )


def send_test_event(endpoint: Endpoint, actor, *, via: str = PORTAL) -> Accepted:
    """One small event to this endpoint alone, through the tenant's lane like any other.
    Raises TooManyTestEvents past TEST_EVENTS_PER_MINUTE for the endpoint (counted in
    the audit trail, which records every one of them)."""
    recent = AuditEntry.objects.filter(
        tenant=endpoint.tenant,
        at__gte=timezone.now() - timedelta(minutes=1),
        action=AuditEntry.Action.TEST_EVENT_SENT,
        target=f"endpoint {endpoint.pk}",
    )
    if recent.count() >= TEST_EVENTS_PER_MINUTE:
        raise TooManyTestEvents
    payload = {
        "type": TEST_EVENT_TYPE,
        "message": "A test event sent from the webhook portal.",
        "endpoint_id": endpoint.pk,
        "sent_at": timezone.now().isoformat(),
    }
    with transaction.atomic():
        accepted = publish_to_endpoint(endpoint, TEST_EVENT_TYPE, payload)
        _audit(
            endpoint,
            actor,
            AuditEntry.Action.TEST_EVENT_SENT,
            via=via,
            event_id=accepted.event.id,
        )
    return accepted

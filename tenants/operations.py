"""Operator and tenant-admin acts on tenants and endpoints that their owners must be able to
trace: each one changes the row and writes the audit trail (tenants.models.AuditEntry)."""

from django.db import transaction

from tenants import audit
from tenants.models import AuditEntry, Endpoint, Tenant


def set_active(tenant: Tenant, active: bool, *, actor, via: str) -> None:
    """Pause or resume a tenant's delivery (its admins see who did)."""
    with transaction.atomic():
        tenant.is_active = active
        tenant.save(update_fields=["is_active"])  # save(), so the scheduler hears of it
        audit.record(
            actor=actor,
            action=AuditEntry.Action.TENANT_RESUMED if active else AuditEntry.Action.TENANT_PAUSED,
            via=via,
            tenant=tenant,
            target=f"tenant {tenant.key}",
        )


def enable_endpoint(endpoint: Endpoint, *, actor, via: str) -> int:
    """Re-enable an endpoint; its held deliveries resume in order. Returns how many
    resumed. Audited only if it was disabled (enabling an enabled one changes nothing)."""
    was = {"enabled": endpoint.enabled, "disabled_reason": endpoint.disabled_reason}
    with transaction.atomic():
        resumed = endpoint.enable()
        if not was["enabled"]:
            audit.record(
                actor=actor,
                action=AuditEntry.Action.ENDPOINT_ENABLED,
                via=via,
                tenant=endpoint.tenant,
                target=f"endpoint {endpoint.pk}",
                old=was,
                new={"enabled": True},
                resumed=resumed,
            )
    return resumed

"""Writing the audit trail (tenants.models.AuditEntry): one call per deliberate act."""

from typing import Any

from tenants.models import AuditEntry, Tenant


def record(
    *,
    actor,
    action: AuditEntry.Action | str,
    via: AuditEntry.Via | str,
    tenant: Tenant | None,
    target: str = "",
    **detail: Any,
) -> AuditEntry:
    """Record that `actor` (a user, or None for the platform itself) did `action`.

    `detail` is stored as JSON: counts, filters, old and new values. Never pass a secret:
    the trail is shown to every admin of the tenant.
    """
    user = actor if actor is not None and actor.is_authenticated else None
    return AuditEntry.objects.create(
        actor=user,
        actor_name=user.get_username() if user is not None else "platform",
        action=action,
        via=via,
        tenant=tenant,
        target=target[:200],
        detail=detail,
    )

"""Writing the audit trail (tenants.models.AuditEntry): one call per deliberate act."""

from typing import Any

from tenants.models import AuditEntry, Tenant


def actor_name(actor) -> str:
    """Who to name for `actor`: a signed-in user's name, an API token's `audit_name`, or
    "platform" for the platform's own acts."""
    if actor is None:
        return "platform"
    if actor.is_authenticated:
        return actor.get_username()
    return getattr(actor, "audit_name", "platform")


def record(
    *,
    actor,
    action: AuditEntry.Action | str,
    via: AuditEntry.Via | str,
    tenant: Tenant | None,
    target: str = "",
    **detail: Any,
) -> AuditEntry:
    """Record that `actor` (a user, an API token, or None for the platform itself) did
    `action`.

    `detail` is stored as JSON: counts, filters, old and new values. Never pass a secret:
    the trail is shown to every admin of the tenant.
    """
    user = actor if actor is not None and actor.is_authenticated else None
    return AuditEntry.objects.create(
        actor=user,
        actor_name=actor_name(actor),
        action=action,
        via=via,
        tenant=tenant,
        target=target[:200],
        detail=detail,
    )

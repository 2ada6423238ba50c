"""What the API keeps of its own: the answers to POSTs sent with an Idempotency-Key, and
portal links (one-use sign-ins to a tenant's portal)."""

from django.conf import settings
from django.db import models
from django.utils import timezone

from tenants.models import Membership, Tenant
from webhooks.models import ApiToken


class IdempotentRequest(models.Model):
    """A POST made with an Idempotency-Key, and the answer it got: the same key from the
    same token within API_IDEMPOTENCY_HOURS gets that answer again, not a second act."""

    token = models.ForeignKey(ApiToken, on_delete=models.CASCADE, related_name="+")
    key = models.CharField(max_length=255)
    fingerprint = models.CharField(max_length=64, help_text="sha256 of method, path and body.")
    status_code = models.PositiveSmallIntegerField(
        null=True, blank=True, help_text="Empty while the first request is still running."
    )
    response = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["token", "key"], name="idempotent_request_per_token")
        ]
        indexes = [models.Index(fields=["created_at"], name="idempotent_request_age_idx")]

    def __str__(self) -> str:
        return f"{self.key} ({self.status_code or 'running'})"


class PortalLink(models.Model):
    """A short-lived, single-use sign-in to one tenant's portal; only the hash of its
    secret is stored."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    role = models.CharField(max_length=10, choices=Membership.ROLE_CHOICES)
    visitor = models.CharField(
        max_length=150, help_text="Who the operator's app says the visitor is (audit trail)."
    )
    token_hash = models.CharField(max_length=64, unique=True)
    created_by = models.ForeignKey(ApiToken, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField()
    used_at = models.DateTimeField(null=True, blank=True)
    used_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        indexes = [models.Index(fields=["expires_at"], name="portal_link_expiry_idx")]

    def __str__(self) -> str:
        return f"portal link to {self.tenant} ({self.role})"

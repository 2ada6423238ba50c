"""Tenants (whose turns the scheduler shares out), their endpoints and who may see them."""

import base64
import secrets
from decimal import Decimal

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils import timezone

from core import operational
from core.adaptive_modes import ADAPT_ALL, ADAPT_NONE
from core.signatures import standard_webhooks_key
from tenants import signals

WEIGHT_CHOICES = [(1, "1 - standard"), (2, "2 - double"), (4, "4 - quadruple"), (8, "8 - octuple")]


class Tenant(models.Model):
    """One customer whose events get their own lane and their own turns."""

    key = models.CharField(
        max_length=255,
        unique=True,
        help_text="The fairness-key value that identifies this tenant in traffic, e.g. a shop domain.",
    )
    name = models.CharField(max_length=200, blank=True)
    weight = models.PositiveSmallIntegerField(
        default=1,
        choices=WEIGHT_CHOICES,
        help_text="Turns per lap of the scheduler. Keep tiers coarse: 1, 2, 4, 8.",
    )
    is_active = models.BooleanField(
        default=True,
        help_text="Unticked pauses delivery: events are still accepted and wait, nothing is lost.",
    )
    rate_limit_per_second = models.DecimalField(
        max_digits=9,
        decimal_places=3,
        null=True,
        blank=True,
        validators=[MinValueValidator(Decimal(0)), MaxValueValidator(Decimal(10_000))],
        help_text="Delivery rate: at most this many requests per second for this tenant, over "
        "all its endpoints, even when workers are idle (other tenants get the spare turns). "
        "Empty: the platform default (TENANT_DEFAULT_RATE_PER_SECOND); 0: unlimited. The "
        "weight sets its share only while tenants compete; a rate bounds its pace always.",
    )
    auto_registered = models.BooleanField(
        default=False, help_text="Created automatically when an unknown key arrived at ingest."
    )
    registered_by = models.ForeignKey(
        "webhooks.Source",
        null=True,
        blank=True,
        editable=False,
        on_delete=models.SET_NULL,
        related_name="registered_tenants",
        help_text="The source whose traffic registered this tenant automatically.",
    )
    created_at = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        ordering = ["key"]
        # The fairness-key guard counts a source's registrations in the last window.
        indexes = [
            models.Index(
                fields=["registered_by", "created_at"], name="tenant_registered_recent_idx"
            )
        ]

    def __str__(self) -> str:
        return self.name or self.key

    def effective_rate_per_second(self) -> float | None:
        """What the scheduler enforces: its own rate, else the platform default (read
        now); None = unlimited."""
        rate = self.rate_limit_per_second
        if rate is None:
            rate = getattr(settings, "TENANT_DEFAULT_RATE_PER_SECOND", 0) or 0
        return float(rate) or None


def generate_signing_secret() -> str:
    """A Standard Webhooks secret: `whsec_` and base64 of 24 random bytes."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()


def mask_secret(secret: str) -> str:
    """Enough to tell secrets apart, never enough to use one."""
    prefix, _, body = secret.rpartition("_")
    shown = body[:4]
    return f"{prefix + '_' if prefix else ''}{shown}…({len(secret)} chars)"


class EndpointManager(models.Manager):
    # On the manager itself: a QuerySet's override is not copied onto its manager
    # (as_manager copies only the methods a manager lacks, and it has bulk_create).
    def bulk_create(self, objs, *args, **kwargs) -> list["Endpoint"]:
        """bulk_create skips save(): the signing endpoints it makes get their secrets here,
        so that no way of creating endpoints leaves them unsigned."""
        made = super().bulk_create(objs, *args, **kwargs)
        signing = [endpoint for endpoint in made if endpoint.sign_requests and endpoint.pk]
        if kwargs.get("ignore_conflicts") or kwargs.get("update_conflicts"):
            # Rows that already existed come back too: give secrets only to those without.
            with_secret = set(
                EndpointSecret.objects.filter(endpoint__in=signing).values_list(
                    "endpoint_id", flat=True
                )
            )
            signing = [endpoint for endpoint in signing if endpoint.pk not in with_secret]
        rows = EndpointSecret.objects.bulk_create(
            [EndpointSecret(endpoint=endpoint) for endpoint in signing]
        )
        for endpoint, row in zip(signing, rows, strict=True):
            endpoint.generated_secret = row.secret
        return made


class Endpoint(models.Model):
    """A URL we deliver to. With no tenant it is a shared gateway destination."""

    tenant = models.ForeignKey(
        Tenant,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="endpoints",
        help_text="Empty for a shared destination that receives every tenant's events (gateway mode).",
    )
    url = models.URLField(max_length=2000)
    description = models.CharField(max_length=200, blank=True)
    event_types = models.TextField(
        blank=True,
        help_text="Event types to deliver, separated by commas or new lines. Empty means all.",
    )
    max_in_flight = models.PositiveSmallIntegerField(
        null=True,
        blank=True,
        default=None,
        validators=[MinValueValidator(1), MaxValueValidator(1000)],
        help_text="Concurrency cap: at most this many requests open to this endpoint at once. "
        "It bounds the workers a slow endpoint can hold. Empty: the platform finds its "
        "pace, a limit that adapts to how it answers under the platform's ceiling "
        "(DELIVERY_ADAPTIVE_CEILING), or where limits do not adapt the platform's cap "
        "(DELIVERY_MAX_IN_FLIGHT). A cap set here is fixed, unless the platform adapts "
        "every endpoint (DELIVERY_ADAPTIVE_CONCURRENCY=all): then it is the ceiling.",
    )
    fixed_max_in_flight = models.BooleanField(
        "fixed cap",
        default=False,
        db_default=False,  # rows written by the code before it (a rolling upgrade)
        help_text="Never adapt this endpoint's limit to how it answers: its cap, or with "
        "none the platform's fixed cap (DELIVERY_MAX_IN_FLIGHT), is its limit. For a "
        "receiver whose capacity is known.",
    )
    rate_limit_per_second = models.DecimalField(
        max_digits=9,
        decimal_places=3,
        null=True,
        blank=True,
        validators=[MinValueValidator(Decimal("0.001")), MaxValueValidator(Decimal(10_000))],
        help_text="Rate limit: at most this many requests started per second (after a quiet "
        "spell, a burst of up to one second's worth). Empty: no rate limit. A rate bounds "
        "requests per second; the cap above bounds requests open at once.",
    )
    retry_max_in_flight = models.PositiveSmallIntegerField(
        default=1,
        validators=[MinValueValidator(1), MaxValueValidator(1000)],
        help_text="Cap for retries alone, so a recovering endpoint drains at a pace it survives.",
    )
    timeout_seconds = models.PositiveSmallIntegerField(
        default=30,
        validators=[MinValueValidator(1), MaxValueValidator(120)],
        help_text="Total deadline for one request, connection to last byte.",
    )
    sign_requests = models.BooleanField(
        "sign requests",
        default=True,
        help_text="Sign every request with the endpoint's secret (Standard Webhooks "
        "webhook-signature). A new endpoint gets a generated secret. Turn off only for a "
        "receiver that cannot verify: its requests then go out unsigned, and it cannot tell "
        "them from forgeries.",
    )
    send_trace_context = models.BooleanField(
        "send trace context",
        default=False,
        db_default=False,  # rows written by the code before it (a rolling upgrade)
        help_text="Send the W3C traceparent header of the delivery's trace (when the "
        "platform traces), so the receiver's own spans join the event's trace. Off: the "
        "receiver learns nothing of the platform's tracing.",
    )
    operational_events = models.CharField(
        max_length=500,
        blank=True,
        default="",
        db_default="",  # rows written by the code before it (a rolling upgrade)
        help_text="Operational events this endpoint receives instead of its tenant's "
        f"events (comma-separated, or * for all): {', '.join(operational.TYPES)}. A "
        "tenant's endpoint gets those about its own tenant; one without a tenant (the "
        "operator's) those about every tenant and the platform. Empty: none.",
    )
    enabled = models.BooleanField(default=True)
    disabled_reason = models.CharField(max_length=500, blank=True)
    disabled_at = models.DateTimeField(null=True, blank=True)
    consecutive_failures = models.PositiveIntegerField(default=0)
    failing_since = models.DateTimeField(null=True, blank=True)
    last_success_at = models.DateTimeField(null=True, blank=True)
    last_failure_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now, editable=False)

    objects = EndpointManager()

    # Set when this instance created its secret (save, bulk_create), for its creator to
    # show once; never stored in plain anywhere else.
    generated_secret: str | None = None

    class Meta:
        ordering = ["tenant__key", "url"]
        permissions = [
            ("reveal_endpoint_secret", "Can reveal an endpoint's signing secret in full"),
        ]
        indexes = [models.Index(fields=["enabled"], name="endpoint_enabled_idx")]

    def __str__(self) -> str:
        owner = self.tenant.key if self.tenant_id else "shared"
        return f"{owner} → {self.url}"

    def save(self, *args, **kwargs) -> None:
        """A new signing endpoint gets a secret at once, whoever creates it (admin, demo,
        portal, shell): no endpoint delivers unsigned unless told to. The plain value is
        left on `generated_secret` for the creator to show once."""
        creating = self._state.adding
        super().save(*args, **kwargs)
        self.generated_secret = None
        if creating and self.sign_requests:
            self.generated_secret = EndpointSecret.objects.create(endpoint=self).secret

    @property
    def in_flight_cap(self) -> int:
        """The most requests open to it at once: its own cap, or else the platform's (the
        adaptive limit's ceiling where its limit adapts)."""
        return self.cap_for(self.max_in_flight, fixed=self.fixed_max_in_flight)

    @property
    def adapts_concurrency(self) -> bool:
        """Whether its in-flight limit adapts under its cap (the platform's setting, unless
        an operator fixed this endpoint's cap)."""
        return self.adapts_with(self.max_in_flight, fixed=self.fixed_max_in_flight)

    @staticmethod
    def adapts_with(max_in_flight: int | None, *, fixed: bool) -> bool:
        """adapts_concurrency for these values of max_in_flight and fixed_max_in_flight."""
        mode = settings.DELIVERY_ADAPTIVE_CONCURRENCY
        if fixed or mode == ADAPT_NONE:
            return False
        return mode == ADAPT_ALL or not max_in_flight

    @classmethod
    def cap_for(cls, max_in_flight: int | None, *, fixed: bool) -> int:
        """in_flight_cap for these values of max_in_flight and fixed_max_in_flight."""
        if max_in_flight:
            return max_in_flight
        if cls.adapts_with(None, fixed=fixed):
            return settings.DELIVERY_ADAPTIVE_CEILING
        return settings.DELIVERY_MAX_IN_FLIGHT

    @classmethod
    def retry_cap_error(
        cls, retry_cap: int | None, max_in_flight: int | None, *, fixed: bool
    ) -> str:
        """Why this retry cap cannot go with these caps ("" when it can): retries open at
        once cannot exceed the requests open at once."""
        cap = cls.cap_for(max_in_flight, fixed=fixed)
        if retry_cap and retry_cap > cap:
            return f"Cannot exceed the endpoint's cap ({cap})."
        return ""

    def effective_rate_per_second(self) -> float | None:
        """What the scheduler enforces; None = no rate limit."""
        rate = self.rate_limit_per_second
        return float(rate) if rate else None

    def enable(self) -> int:
        """Re-enable with a clean failure streak, then let the apps above resume what was
        held (tenants.signals.endpoint_enabled); returns how many deliveries resumed."""
        Endpoint.objects.filter(pk=self.pk).update(
            enabled=True,
            disabled_reason="",
            disabled_at=None,
            consecutive_failures=0,
            failing_since=None,
        )
        self.enabled, self.disabled_reason, self.disabled_at = True, "", None
        self.consecutive_failures, self.failing_since = 0, None
        answers = signals.endpoint_enabled.send(sender=Endpoint, endpoint=self)
        return sum(resumed for _, resumed in answers if isinstance(resumed, int))

    def event_type_filter(self) -> list[str]:
        return [
            item.strip() for item in self.event_types.replace("\n", ",").split(",") if item.strip()
        ]

    def accepts(self, event_type: str) -> bool:
        """Whether the tenant's own events of this type come here (an endpoint for
        operational events gets none of them)."""
        if self.operational_events:
            return False
        wanted = self.event_type_filter()
        return not wanted or event_type in wanted

    def operational_filter(self) -> list[str]:
        return [item.strip() for item in self.operational_events.split(",") if item.strip()]

    def receives_operational(self, event_type: str) -> bool:
        wanted = self.operational_filter()
        return "*" in wanted or event_type in wanted


class EndpointSecret(models.Model):
    """A signing secret; several are active while a rotation is in progress."""

    endpoint = models.ForeignKey(Endpoint, on_delete=models.CASCADE, related_name="secrets")
    secret = models.CharField(max_length=200, default=generate_signing_secret)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    expires_at = models.DateTimeField(
        null=True, blank=True, help_text="Set during a rotation; empty means it never expires."
    )

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return mask_secret(self.secret)

    def is_active(self) -> bool:
        return self.expires_at is None or self.expires_at > timezone.now()

    def clean(self) -> None:
        validate_standard_webhooks_secret(self.secret)


def validate_standard_webhooks_secret(secret: str) -> None:
    """A secret we sign with must decode, or every delivery to the endpoint would fail."""
    try:
        standard_webhooks_key(secret)
    except ValueError as exc:
        raise ValidationError(
            {"secret": "Not a Standard Webhooks secret: expected whsec_ followed by base64."}
        ) from exc


class Membership(models.Model):
    """A Django user's access to one tenant's dashboard."""

    VIEWER = "viewer"
    ADMIN = "admin"
    ROLE_CHOICES = [(VIEWER, "Viewer"), (ADMIN, "Admin")]

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships"
    )
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=10, choices=ROLE_CHOICES, default=VIEWER)
    created_at = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        ordering = ["tenant__key", "user__username"]
        constraints = [
            models.UniqueConstraint(
                fields=["user", "tenant"], name="one_membership_per_user_tenant"
            )
        ]

    def __str__(self) -> str:
        return f"{self.user} ({self.role}) of {self.tenant}"


class AuditEntry(models.Model):
    """Who did what to a tenant's endpoints and deliveries, and when: resends, replays,
    endpoint changes, secrets revealed or rotated. Operators read it in the admin, a
    tenant's admins on their portal. Rows are written once and never changed."""

    class Action(models.TextChoices):
        ENDPOINT_CREATED = "endpoint.created", "Endpoint created"
        ENDPOINT_CHANGED = "endpoint.changed", "Endpoint changed"
        ENDPOINT_DISABLED = "endpoint.disabled", "Endpoint disabled"
        ENDPOINT_ENABLED = "endpoint.enabled", "Endpoint enabled"
        SECRET_REVEALED = "secret.revealed", "Signing secret revealed"
        SECRET_ROTATED = "secret.rotated", "Signing secret rotated"
        TEST_EVENT_SENT = "test_event.sent", "Test event sent"
        DELIVERY_RESENT = "delivery.resent", "Delivery resent"
        DELIVERY_RETRIED = "delivery.retried", "Delivery retried now"
        REPLAY_STARTED = "replay.started", "Replay started"
        REPLAY_CANCELLED = "replay.cancelled", "Replay cancelled"
        DEAD_LETTERS_REPLAYED = "dead_letters.replayed", "Dead letters replayed"
        TENANT_PAUSED = "tenant.paused", "Delivery paused"
        TENANT_RESUMED = "tenant.resumed", "Delivery resumed"
        TENANT_WEIGHT_CHANGED = "tenant.weight_changed", "Weight changed"
        TENANT_CREATED = "tenant.created", "Tenant created"
        TENANT_CHANGED = "tenant.changed", "Tenant changed"
        ENDPOINT_DELETED = "endpoint.deleted", "Endpoint deleted"
        PORTAL_LINK_CREATED = "portal_link.created", "Portal link created"
        PORTAL_LINK_USED = "portal_link.used", "Portal link used"
        EVENT_TYPE_CREATED = "event_type.created", "Event type created"
        EVENT_TYPE_CHANGED = "event_type.changed", "Event type changed"
        EVENT_TYPE_ARCHIVED = "event_type.archived", "Event type archived"

    class Via(models.TextChoices):
        ADMIN = "admin", "Admin"
        PORTAL = "portal", "Tenant portal"
        API = "api", "API"

    at = models.DateTimeField(default=timezone.now, editable=False)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    # Kept beside the foreign key so the record still names who it was once the user
    # is deleted.
    actor_name = models.CharField(max_length=150)
    tenant = models.ForeignKey(
        Tenant, null=True, blank=True, on_delete=models.CASCADE, related_name="audit_entries"
    )
    action = models.CharField(max_length=32, choices=Action.choices)
    via = models.CharField(max_length=10, choices=Via.choices)
    target = models.CharField(max_length=200, blank=True, help_text="e.g. 'endpoint 12'")
    detail = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-at", "-id"]
        verbose_name_plural = "audit entries"
        indexes = [models.Index(fields=["tenant", "-at"], name="audit_tenant_at_idx")]

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.actor_name} {self.action} {self.target}"

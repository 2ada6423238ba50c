"""The inbound side: sources that post to us, and the events we accepted."""

import hashlib
import secrets

from django.core.exceptions import ValidationError
from django.db import models
from django.utils import timezone

from core.ids import new_ulid
from tenants.models import Endpoint, Tenant, mask_secret, validate_standard_webhooks_secret
from webhooks.event_schemas import SchemaProblem, compile_schema, first_error
from webhooks.fairness_key import validate_location


class Source(models.Model):
    """A provider posting to /ingest/<slug>/, with how to verify it and where its key is."""

    NONE = "none"
    SHOPIFY = "shopify"
    GITHUB = "github"
    STRIPE = "stripe"
    STANDARD_WEBHOOKS = "standard-webhooks"
    HMAC_SHA256 = "hmac-sha256"
    SCHEME_CHOICES = [
        (NONE, "None (no signature; only for trusted networks)"),
        (SHOPIFY, "Shopify (X-Shopify-Hmac-Sha256)"),
        (GITHUB, "GitHub (X-Hub-Signature-256)"),
        (STRIPE, "Stripe (Stripe-Signature)"),
        (STANDARD_WEBHOOKS, "Standard Webhooks (webhook-signature)"),
        (HMAC_SHA256, "Generic HMAC-SHA256"),
    ]

    slug = models.SlugField(max_length=100, unique=True)
    name = models.CharField(max_length=200, blank=True)
    scheme = models.CharField(max_length=32, choices=SCHEME_CHOICES, default=HMAC_SHA256)
    hmac_header = models.CharField(
        max_length=100,
        blank=True,
        default="X-Signature",
        help_text="Generic HMAC only: the header holding the signature.",
    )
    hmac_encoding = models.CharField(
        max_length=10,
        choices=[("hex", "hex"), ("base64", "base64")],
        default="hex",
        help_text="Generic HMAC only.",
    )
    hmac_prefix = models.CharField(
        max_length=30, blank=True, help_text="Generic HMAC only: e.g. 'sha256=' before the digest."
    )
    fairness_key = models.CharField(
        max_length=200,
        blank=True,
        validators=[validate_location],
        help_text="Where the tenant key is: body.shop_id, body.shop.id, header:X-Shopify-Shop-Domain, "
        "query:shop or path:0. Empty sends every event to the fallback lane.",
    )
    auto_register_tenants = models.BooleanField(
        default=False,
        help_text="Create a tenant for an unknown key (default weight) instead of using the fallback lane.",
    )
    auto_register_limit = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Guard against a key that is not a tenant (e.g. an order id): at most this many "
        "tenants registered per window (AUTO_REGISTER_WINDOW_SECONDS, an hour by default); "
        "beyond it auto-registration is suspended and new keys use the fallback lane. "
        "Empty: the platform default (AUTO_REGISTER_LIMIT).",
    )
    auto_register_suspended_at = models.DateTimeField(
        null=True,
        blank=True,
        editable=False,
        help_text="Set when the guard suspended auto-registration: the key looked unbounded.",
    )
    auto_register_suspended_reason = models.CharField(max_length=200, blank=True, editable=False)
    auto_register_resumed_at = models.DateTimeField(
        null=True,
        blank=True,
        editable=False,
        help_text="The guard counts registrations from here (or one window back, if later).",
    )
    destinations = models.ManyToManyField(
        Endpoint,
        blank=True,
        related_name="sources",
        help_text="Where this source's events are delivered (gateway mode).",
    )
    is_active = models.BooleanField(default=True)
    fallback_count = models.PositiveBigIntegerField(
        default=0, editable=False, help_text="Events that arrived without a usable tenant key."
    )
    created_at = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.name or self.slug


class SourceSecret(models.Model):
    """A secret the provider signs with; several are accepted during a rotation."""

    source = models.ForeignKey(Source, on_delete=models.CASCADE, related_name="secrets")
    secret = models.CharField(max_length=500)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    expires_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return mask_secret(self.secret)

    def clean(self) -> None:
        if self.source_id and self.source.scheme == Source.STANDARD_WEBHOOKS:
            validate_standard_webhooks_secret(self.secret)


class Event(models.Model):
    """One accepted webhook (ingested) or published event: the payload lives here, not in Redis."""

    id = models.CharField(primary_key=True, max_length=26, default=new_ulid, editable=False)
    source = models.ForeignKey(
        Source, null=True, blank=True, on_delete=models.PROTECT, related_name="events"
    )
    # No index of its own: event_tenant_recent_idx and event_tenant_type_idx lead with it.
    tenant = models.ForeignKey(
        Tenant,
        null=True,
        blank=True,
        db_index=False,
        on_delete=models.PROTECT,
        related_name="events",
        help_text="Empty: the key was missing and the event went to the fallback lane.",
    )
    event_type = models.CharField(max_length=200, blank=True)
    headers = models.JSONField(default=dict, blank=True)
    content_type = models.CharField(max_length=200, blank=True, default="application/json")
    payload = models.BinaryField()
    # Set when retention (delivery.upkeep.retention) emptied `payload` after PAYLOAD_RETENTION_DAYS:
    # the row and its metadata stay, and pages say the payload was removed, not that it
    # was empty.
    payload_pruned_at = models.DateTimeField(null=True, blank=True, editable=False)
    received_at = models.DateTimeField(default=timezone.now, db_index=True)
    # NULL, not "": the unique constraints must ignore events that carry no key.
    idempotency_key = models.CharField(max_length=255, null=True, blank=True)  # noqa: DJ001
    fallback_reason = models.CharField(max_length=200, blank=True)
    # The W3C traceparent of the span that accepted the event, while tracing is on: each
    # delivery attempt's span is its child, across the queue (core.tracing).
    # db_default: the processes still running the code before this column (a rolling
    # upgrade) insert events without it.
    trace_parent = models.CharField(
        max_length=55, blank=True, default="", db_default="", editable=False
    )

    class Meta:
        ordering = ["-received_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["source", "idempotency_key"],
                condition=models.Q(source__isnull=False, idempotency_key__isnull=False),
                name="event_idempotent_per_source",
            ),
            models.UniqueConstraint(
                fields=["tenant", "idempotency_key"],
                condition=models.Q(source__isnull=True, idempotency_key__isnull=False),
                name="published_event_idempotent_per_tenant",
            ),
        ]
        indexes = [
            models.Index(fields=["tenant", "-received_at"], name="event_tenant_recent_idx"),
            # The tenant portal's message log filtered by event type, newest first (one
            # more entry per event written; the log would otherwise scan a tenant's whole
            # history for a rare type).
            models.Index(
                fields=["tenant", "event_type", "-received_at"], name="event_tenant_type_idx"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.event_type or 'event'} {self.id}"


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class ApiToken(models.Model):
    """A bearer token for the API; only its hash is stored. Operator-wide (no tenant) or
    bound to one tenant; `access` says what it may do."""

    class Access(models.TextChoices):
        # Tokens made before the management API existed: they publish and nothing else.
        PUBLISH = "publish", "Publish events only"
        READ = "read", "Read-only (management API)"
        WRITE = "write", "Read-write (management API and publishing)"

    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=12, editable=False)
    token_hash = models.CharField(max_length=64, unique=True, editable=False)
    tenant = models.ForeignKey(
        Tenant,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="api_tokens",
        help_text="Restrict the token to one tenant. Empty: an operator token, for every tenant.",
    )
    access = models.CharField(
        max_length=10,
        choices=Access.choices,
        default=Access.WRITE,
        help_text="Read-only tokens list and read; read-write tokens also change, resend, "
        "replay and publish; publish-only tokens publish events and nothing else.",
    )
    is_active = models.BooleanField(default=True)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)

    # The audit trail and the API's own checks read a token like a user; it is never one.
    is_authenticated = False

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @property
    def audit_name(self) -> str:
        """How the audit trail names what this token did: never the token itself."""
        return f"API token {self.name} ({self.prefix}…)"[:150]

    def get_username(self) -> str:
        return self.audit_name

    @property
    def is_operator(self) -> bool:
        return self.tenant_id is None

    @property
    def may_publish(self) -> bool:
        return self.access in (self.Access.PUBLISH, self.Access.WRITE)

    @classmethod
    def issue(
        cls, name: str, tenant: Tenant | None = None, access: str = Access.WRITE
    ) -> tuple["ApiToken", str]:
        """Create a token; the plain value is returned once and never stored."""
        plain = "whp_" + secrets.token_urlsafe(32)
        token = cls.objects.create(
            name=name, prefix=plain[:8], token_hash=hash_token(plain), tenant=tenant, access=access
        )
        return token, plain


def validate_event_type_name(value: str) -> None:
    """A name publishers can send and endpoints can filter on: publishing strips the
    type, so surrounding spaces would never match, and endpoints' filters are lists
    separated by commas."""
    if not value or value != value.strip() or not value.isprintable() or "," in value:
        raise ValidationError("Printable text without commas and without spaces at either end.")


class EventType(models.Model):
    """An entry of the event type catalogue, platform-wide: a type publishers send, what
    it means and, optionally, the JSON Schema of its payloads (webhooks.event_schemas).

    Publishing keeps each schema's compiled validator for as long as `updated_at` is
    unchanged (ingest.catalogue): change rows with save(), as the admin and the API do,
    not with QuerySet.update(), which leaves `updated_at` as it was."""

    name = models.CharField(max_length=200, unique=True, validators=[validate_event_type_name])
    description = models.TextField(blank=True)
    schema = models.JSONField(
        null=True,
        blank=True,
        help_text="A JSON Schema (Draft 2020-12 unless its $schema says otherwise) that "
        "payloads of this type follow. Empty: no schema.",
    )
    example = models.JSONField(
        null=True, blank=True, help_text="An example payload; it must match the schema."
    )
    enforce_schema = models.BooleanField(
        default=False,
        help_text="Refuse (422) a published payload that does not match the schema.",
    )
    archived = models.BooleanField(
        default=False,
        help_text="No longer in use. With EVENT_TYPES_REQUIRE_CATALOGUE, no longer publishable.",
    )
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        errors: dict[str, str] = {}
        if self.schema is not None:
            try:
                validator = compile_schema(self.schema)
            except SchemaProblem as exc:
                errors["schema"] = f"Not a usable JSON Schema: {exc}"
            else:
                problem = None if self.example is None else first_error(validator, self.example)
                if problem is not None:
                    errors["example"] = f"Does not match the schema: {problem}"
        elif self.enforce_schema:
            errors["enforce_schema"] = "There is no schema to enforce."
        if errors:
            raise ValidationError(errors)

"""Operators manage tenants, endpoints and memberships here. A secret is shown in full only
once, to whoever made it, and again only by the logged "reveal" action."""

import logging

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html

from core import operational
from core.admin_cells import changelist_link, clipped
from core.admin_readonly import EvidenceAdmin
from core.netguard import validate_destination_url
from tenants import audit, share
from tenants.models import (
    AuditEntry,
    Endpoint,
    EndpointSecret,
    Membership,
    Tenant,
    mask_secret,
)
from tenants.operations import enable_endpoint, set_active

logger = logging.getLogger(__name__)


class MaskedSecretForm(forms.ModelForm):
    """A secret is typed once and never rendered back; empty keeps the stored one."""

    secret = forms.CharField(
        required=False,
        widget=forms.PasswordInput(render_value=False),
        help_text="Type a secret, or leave it empty: a stored secret stays as it is, and a "
        "new row gets a generated one where the model can make one (shown once, in full).",
    )
    generated = False  # True when clean_secret made the value: the admin shows it once

    def has_changed(self) -> bool:
        # Inlines have no blank extra rows, so a new row is one the operator added on
        # purpose: it is saved even left empty (Django skips unchanged new rows).
        return self.instance.pk is None or super().has_changed()

    def clean_secret(self) -> str:
        typed = self.cleaned_data.get("secret", "").strip()
        if typed:
            return typed
        if self.instance.pk:
            return self.instance.secret
        default = self._meta.model._meta.get_field("secret").default
        if callable(default):
            self.generated = True
            return default()
        raise forms.ValidationError("Enter the secret the provider signs with.")


class MaskedSecretInline(admin.TabularInline):
    """Existing secrets show masked; the plain value is never sent to the browser."""

    form = MaskedSecretForm
    extra = 0
    fields = ["masked", "secret", "created_at", "expires_at"]
    readonly_fields = ["masked", "created_at"]

    @admin.display(description="Stored secret")
    def masked(self, obj) -> str:
        return mask_secret(obj.secret) if obj.pk else "(new)"


class EndpointSecretInline(MaskedSecretInline):
    model = EndpointSecret


class EndpointForm(forms.ModelForm):
    url = forms.URLField(max_length=2000, assume_scheme="https")

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # Says what clean_url enforces on this deployment, not what it usually does.
        self.fields["url"].help_text = "Where events are POSTed. " + (
            "This platform allows private and loopback addresses (ALLOW_PRIVATE_DESTINATIONS)."
            if settings.ALLOW_PRIVATE_DESTINATIONS
            else "Private and loopback addresses are refused."
        )

    class Meta:
        model = Endpoint
        fields = [
            "tenant",
            "url",
            "description",
            "event_types",
            "max_in_flight",
            "fixed_max_in_flight",
            "retry_max_in_flight",
            "rate_limit_per_second",
            "timeout_seconds",
            "sign_requests",
            "send_trace_context",
            "operational_events",
            "enabled",
            "disabled_reason",
        ]

    def clean_url(self) -> str:
        url = self.cleaned_data["url"]
        validate_destination_url(url, allow_private=settings.ALLOW_PRIVATE_DESTINATIONS)
        return url

    def clean(self):
        cleaned = super().clean()
        error = Endpoint.retry_cap_error(
            cleaned.get("retry_max_in_flight"),
            cleaned.get("max_in_flight"),
            fixed=cleaned.get("fixed_max_in_flight", False),
        )
        if error:
            self.add_error("retry_max_in_flight", error)
        return cleaned


def _announce_disabled(endpoint: Endpoint, operator) -> None:
    """endpoint.disabled for a disable made in this form (the workers' and the portal's
    go through delivery.pipeline.endpoint_health), published if the save commits."""
    reason = endpoint.disabled_reason or f"Disabled in the admin by {operator.get_username()}"
    data = {
        "reason": reason[:500],
        "disabled_at": (endpoint.disabled_at or timezone.now()).isoformat(),
    }
    operational.announce_endpoint(operational.ENDPOINT_DISABLED, endpoint, data)


@admin.register(Endpoint)
class EndpointAdmin(admin.ModelAdmin):
    form = EndpointForm
    list_display = [
        clipped("url", 48),
        "tenant",
        "enabled",
        "cap",
        "retry_max_in_flight",
        "sign_requests",
        "consecutive_failures",
        "disabled_reason",
    ]
    list_filter = ["enabled", "sign_requests"]
    search_fields = ["url", "tenant__key", "tenant__name", "description"]
    list_select_related = ["tenant"]
    autocomplete_fields = ["tenant"]
    readonly_fields = [
        "deliveries_link",
        "consecutive_failures",
        "failing_since",
        "last_success_at",
        "last_failure_at",
        "disabled_at",
        "created_at",
    ]
    inlines = [EndpointSecretInline]
    actions = ["reenable_endpoints", "reveal_signing_secrets"]

    @admin.display(description="max in flight", ordering="max_in_flight")
    def cap(self, obj: Endpoint) -> str:
        adapts = " (adapts)" if obj.adapts_concurrency else ""
        if obj.max_in_flight:
            return f"{obj.max_in_flight}{adapts}"
        return f"{obj.in_flight_cap} (platform{', adapts' if adapts else ''})"

    @admin.display(description="Deliveries")
    def deliveries_link(self, obj: Endpoint) -> str:
        if not obj.pk:
            return "-"
        return changelist_link(
            "delivery.delivery", "this endpoint's deliveries", endpoint_id=obj.pk
        )

    def save_model(self, request, obj: Endpoint, form, change: bool) -> None:
        super().save_model(request, obj, form, change)
        if change and "enabled" in form.changed_data and not obj.enabled:
            _announce_disabled(obj, request.user)
        # The tenant's admins read the same trail as operators: an operator's change to
        # their endpoint is theirs to see too (values only; secrets are inline rows).
        fields = form.changed_data if change else [f for f in form.fields if f in form.cleaned_data]
        if change and not fields:
            return
        audit.record(
            actor=request.user,
            action=AuditEntry.Action.ENDPOINT_CHANGED
            if change
            else AuditEntry.Action.ENDPOINT_CREATED,
            via=AuditEntry.Via.ADMIN,
            tenant=obj.tenant,
            target=f"endpoint {obj.pk}",
            **({"old": _plain({f: form.initial.get(f) for f in fields})} if change else {}),
            new=_plain({f: form.cleaned_data.get(f) for f in fields}),
        )

    def save_related(self, request, form, formsets, change) -> None:
        super().save_related(request, form, formsets, change)
        endpoint = form.instance
        if not endpoint.generated_secret:  # set only by the save() that created it
            return
        rows_made = [
            row
            for formset in formsets
            for row in formset.forms
            if isinstance(row, MaskedSecretForm) and row.instance.pk
        ]
        if rows_made:
            # The add form carried its own secret rows: the one save() made is not needed.
            endpoint.secrets.filter(secret=endpoint.generated_secret).delete()
        else:
            self._show_once(request, endpoint, endpoint.generated_secret)

    def save_formset(self, request, form, formset, change) -> None:
        super().save_formset(request, form, formset, change)
        for row in formset.forms:
            if getattr(row, "generated", False) and row.instance.pk:
                self._show_once(request, form.instance, row.instance.secret)

    def _show_once(self, request, endpoint: Endpoint, secret: str) -> None:
        messages.warning(
            request,
            f"Signing secret for {endpoint.url}: {secret} (give it to the receiver now; "
            "it is not shown again except by the logged Reveal action).",
        )

    def has_reveal_secret_permission(self, request) -> bool:
        return request.user.has_perm("tenants.reveal_endpoint_secret")

    @admin.action(
        description="Reveal signing secrets of selected endpoints (logged)",
        permissions=["reveal_secret"],
    )
    def reveal_signing_secrets(self, request, queryset) -> None:
        # At most a page of them: revealing is a deliberate act on a few endpoints.
        for endpoint in queryset.prefetch_related("secrets")[:20]:
            active = [row for row in endpoint.secrets.all() if row.is_active()]
            shown = ", ".join(row.secret for row in active) or "none active"
            self.log_change(request, endpoint, "Revealed the signing secret in full.")
            audit.record(
                actor=request.user,
                action=AuditEntry.Action.SECRET_REVEALED,
                via=AuditEntry.Via.ADMIN,
                tenant=endpoint.tenant,
                target=f"endpoint {endpoint.pk}",
                url=endpoint.url,
            )
            logger.warning(
                "user %s revealed the signing secret of endpoint %s", request.user, endpoint.pk
            )
            messages.warning(request, f"Signing secrets of {endpoint.url}: {shown}")

    @admin.action(description="Re-enable selected endpoints (held deliveries resume in order)")
    def reenable_endpoints(self, request, queryset) -> None:
        released = sum(
            enable_endpoint(endpoint, actor=request.user, via=AuditEntry.Via.ADMIN)
            for endpoint in queryset
        )
        messages.success(
            request, f"{queryset.count()} endpoints enabled; {released} held deliveries resumed."
        )


def _plain(values: dict) -> dict:
    """Form values as JSON can store them: related rows by id, decimals as text."""
    plain = {}
    for name, value in values.items():
        if hasattr(value, "pk"):
            value = value.pk
        elif value is not None and not isinstance(value, str | int | float | bool):
            value = str(value)
        plain[name] = value
    return plain


class EndpointInline(admin.TabularInline):
    model = Endpoint
    form = EndpointForm
    extra = 0
    fields = ["url", "enabled", "max_in_flight", "retry_max_in_flight", "timeout_seconds"]
    show_change_link = True


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    autocomplete_fields = ["user"]


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = [
        clipped("key", 40),
        "name",
        "weight",
        "is_active",
        "auto_registered",
        "created_at",
        "dashboard_link",
    ]
    list_filter = ["is_active", "weight", "auto_registered", "registered_by"]
    search_fields = ["key", "name"]
    readonly_fields = ["created_at", "registered_by", "dashboard_link", "history_links"]
    inlines = [EndpointInline, MembershipInline]
    actions = ["pause", "resume", "share_link"]

    @admin.display(description="Dashboard")
    def dashboard_link(self, obj: Tenant) -> str:
        if not obj.pk:
            return "-"
        return format_html(
            '<a href="{}">dashboard</a>', reverse("tenants:dashboard", args=[obj.key])
        )

    @admin.display(description="History")
    def history_links(self, obj: Tenant) -> str:
        if not obj.pk:
            return "-"
        return format_html(
            "{} · {}",
            changelist_link("webhooks.event", "events", tenant_key=obj.key),
            changelist_link("delivery.delivery", "deliveries", tenant_key=obj.key),
        )

    @admin.action(
        description=f"Create a read-only dashboard share link (valid {share.DEFAULT_DAYS} days)"
    )
    def share_link(self, request, queryset) -> None:
        # The link is shown once, here; it is not stored anywhere to look up later.
        for tenant in queryset[:20]:
            url = request.build_absolute_uri(
                reverse("tenants:shared", args=[tenant.key, share.make_token(tenant)])
            )
            messages.success(
                request,
                format_html(
                    "Share link for {} (read-only, expires in {} days; copy it now, it is not "
                    'shown again): <a href="{}">{}</a>',
                    tenant.key,
                    share.DEFAULT_DAYS,
                    url,
                    url,
                ),
            )

    def _set_active(self, request, queryset, active: bool) -> int:
        changed = 0
        for tenant in queryset.filter(is_active=not active):
            set_active(tenant, active, actor=request.user, via=AuditEntry.Via.ADMIN)
            changed += 1
        return changed

    @admin.action(description="Pause delivery for selected tenants (events keep arriving and wait)")
    def pause(self, request, queryset) -> None:
        messages.success(request, f"{self._set_active(request, queryset, False)} tenants paused.")

    @admin.action(description="Resume delivery for selected tenants")
    def resume(self, request, queryset) -> None:
        messages.success(request, f"{self._set_active(request, queryset, True)} tenants resumed.")


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ["user", "tenant", "role", "created_at"]
    list_filter = ["role"]
    search_fields = ["user__username", "tenant__key"]
    autocomplete_fields = ["user", "tenant"]


@admin.register(AuditEntry)
class AuditEntryAdmin(EvidenceAdmin):
    """The trail is evidence: nobody adds, edits or deletes it here."""

    list_display = ["at", "actor_name", "action", "via", "tenant", "target"]
    list_filter = ["action", "via"]
    list_select_related = ["tenant"]
    search_fields = ["=tenant__key", "actor_name", "target"]
    date_hierarchy = "at"
    show_full_result_count = False

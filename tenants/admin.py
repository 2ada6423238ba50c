"""Operators manage tenants, endpoints and memberships here; secrets are never shown in full."""

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.urls import reverse
from django.utils.html import format_html

from core.admin_cells import clipped
from core.netguard import validate_destination_url
from tenants import share
from tenants.models import Endpoint, EndpointSecret, Membership, Tenant, mask_secret


class MaskedSecretForm(forms.ModelForm):
    """A secret is typed once and never rendered back; empty keeps the stored one."""

    secret = forms.CharField(
        required=False,
        widget=forms.PasswordInput(render_value=False),
        help_text="Empty keeps the stored secret (or generates one for a new endpoint secret).",
    )

    def clean_secret(self) -> str:
        typed = self.cleaned_data.get("secret", "").strip()
        if typed:
            return typed
        if self.instance.pk:
            return self.instance.secret
        default = self._meta.model._meta.get_field("secret").default
        if callable(default):
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

    class Meta:
        model = Endpoint
        fields = [
            "tenant",
            "url",
            "description",
            "event_types",
            "max_in_flight",
            "retry_max_in_flight",
            "rate_limit_per_second",
            "timeout_seconds",
            "enabled",
            "disabled_reason",
        ]

    def clean_url(self) -> str:
        url = self.cleaned_data["url"]
        validate_destination_url(url, allow_private=settings.ALLOW_PRIVATE_DESTINATIONS)
        return url

    def clean(self):
        cleaned = super().clean()
        cap, retry_cap = cleaned.get("max_in_flight"), cleaned.get("retry_max_in_flight")
        if cap and retry_cap and retry_cap > cap:
            self.add_error("retry_max_in_flight", "Cannot exceed the endpoint's max in flight.")
        return cleaned


@admin.register(Endpoint)
class EndpointAdmin(admin.ModelAdmin):
    form = EndpointForm
    list_display = [
        clipped("url", 48),
        "tenant",
        "enabled",
        "max_in_flight",
        "retry_max_in_flight",
        "consecutive_failures",
        "disabled_reason",
    ]
    list_filter = ["enabled"]
    search_fields = ["url", "tenant__key", "tenant__name", "description"]
    list_select_related = ["tenant"]
    autocomplete_fields = ["tenant"]
    readonly_fields = [
        "consecutive_failures",
        "failing_since",
        "last_success_at",
        "last_failure_at",
        "disabled_at",
        "created_at",
    ]
    inlines = [EndpointSecretInline]
    actions = ["reenable_endpoints"]

    @admin.action(description="Re-enable selected endpoints (held deliveries resume in order)")
    def reenable_endpoints(self, request, queryset) -> None:
        released = sum(endpoint.enable() for endpoint in queryset)
        messages.success(
            request, f"{queryset.count()} endpoints enabled; {released} held deliveries resumed."
        )


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
    readonly_fields = ["created_at", "registered_by", "dashboard_link"]
    inlines = [EndpointInline, MembershipInline]
    actions = ["pause", "resume", "share_link"]

    @admin.display(description="Dashboard")
    def dashboard_link(self, obj: Tenant) -> str:
        if not obj.pk:
            return "-"
        return format_html(
            '<a href="{}">dashboard</a>', reverse("tenants:dashboard", args=[obj.key])
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
            tenant.is_active = active
            tenant.save(update_fields=["is_active"])  # save(), so the scheduler hears of it
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

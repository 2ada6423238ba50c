"""Sources, events and API tokens in the admin. Events are evidence: read-only."""

from django.contrib import admin, messages
from django.utils.html import format_html

from tenants.admin import MaskedSecretInline
from webhooks.models import ApiToken, Event, Source, SourceSecret


class SourceSecretInline(MaskedSecretInline):
    model = SourceSecret


@admin.register(Source)
class SourceAdmin(admin.ModelAdmin):
    list_display = [
        "slug",
        "name",
        "scheme",
        "fairness_key",
        "auto_register_tenants",
        "is_active",
        "fallback_count",
        "ingest_url",
    ]
    list_filter = ["scheme", "is_active", "auto_register_tenants"]
    search_fields = ["slug", "name"]
    prepopulated_fields = {"slug": ["name"]}
    filter_horizontal = ["destinations"]
    readonly_fields = ["fallback_count", "created_at"]
    inlines = [SourceSecretInline]

    @admin.display(description="Ingest URL")
    def ingest_url(self, obj: Source) -> str:
        return f"/ingest/{obj.slug}/"


class ReadOnlyAdmin(admin.ModelAdmin):
    """Records of what happened: viewable and deletable, never editable."""

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Event)
class EventAdmin(ReadOnlyAdmin):
    list_display = ["id", "received_at", "source", "tenant", "event_type", "fallback_reason"]
    list_filter = ["source", "received_at"]
    search_fields = ["id", "event_type", "idempotency_key", "tenant__key"]
    list_select_related = ["source", "tenant"]
    date_hierarchy = "received_at"
    exclude = ["payload"]
    readonly_fields = ["payload_preview"]

    @admin.display(description="Payload (first 5,000 bytes)")
    def payload_preview(self, obj: Event) -> str:
        text = bytes(obj.payload[:5000]).decode("utf-8", errors="replace")
        return format_html("<pre style='white-space:pre-wrap'>{}</pre>", text)


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    """Tokens are shown once, at creation, in a message; only a hash is stored."""

    list_display = ["name", "prefix", "tenant", "is_active", "created_at", "last_used_at"]
    list_filter = ["is_active"]
    search_fields = ["name", "prefix"]
    fields = ["name", "tenant", "is_active", "prefix", "created_at", "last_used_at"]
    readonly_fields = ["prefix", "created_at", "last_used_at"]

    def save_model(self, request, obj: ApiToken, form, change: bool) -> None:
        if change:
            super().save_model(request, obj, form, change)
            return
        token, plain = ApiToken.issue(obj.name, tenant=obj.tenant)
        obj.pk, obj.prefix, obj.token_hash = token.pk, token.prefix, token.token_hash
        messages.warning(request, f"Copy this token now, it will not be shown again: {plain}")

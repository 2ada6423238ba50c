"""Deliveries and attempts: operators' view of what was sent, read-only."""

from django.contrib import admin

from delivery.models import Attempt, Delivery
from webhooks.admin import ReadOnlyAdmin


class AttemptInline(admin.TabularInline):
    model = Attempt
    extra = 0
    can_delete = False
    fields = ["number", "started_at", "duration_ms", "status_code", "outcome", "error"]
    readonly_fields = fields

    def has_add_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Delivery)
class DeliveryAdmin(ReadOnlyAdmin):
    list_display = [
        "id", "tenant", "endpoint", "status", "lane", "attempts", "enqueued_at",
        "next_attempt_at", "delivered_at",
    ]
    list_filter = ["status", "lane"]
    search_fields = ["id", "event__id", "tenant__key", "endpoint__url"]
    list_select_related = ["tenant", "endpoint"]
    date_hierarchy = "enqueued_at"
    inlines = [AttemptInline]


@admin.register(Attempt)
class AttemptAdmin(ReadOnlyAdmin):
    list_display = ["delivery", "number", "started_at", "duration_ms", "status_code", "outcome"]
    list_filter = ["outcome", "status_code"]
    search_fields = ["delivery__id"]
    date_hierarchy = "started_at"

"""Deliveries and attempts: operators' view of what was sent, read-only."""

from django.contrib import admin, messages
from django.db.models import Q
from django.utils.html import format_html

from core.admin_cells import clipped, clipped_tail, timed
from core.admin_paging import EstimatedCountPaginator
from core.admin_readonly import ReadOnlyAdmin
from core.ids import looks_like_ulid
from delivery.admin.page import DeliveryPageMixin
from delivery.admin.replay import replay_window_action
from delivery.models import Attempt, Delivery
from delivery.replays.resend import replay
from tenants.admin_filters import AttemptTenantKeyFilter, EndpointIdFilter, TenantKeyFilter
from tenants.models import AuditEntry


class AttemptInline(admin.TabularInline):
    """Every attempt on the delivery's own page: what we sent, what came back."""

    model = Attempt
    extra = 0
    can_delete = False
    fields = [
        "number",
        "started_at",
        "duration_ms",
        "status_code",
        "outcome",
        "error",
        "sent_headers",
        "response",
    ]
    readonly_fields = fields

    @admin.display(description="Request headers we sent")
    def sent_headers(self, obj: Attempt) -> str:
        lines = "\n".join(f"{name}: {value}" for name, value in (obj.request_headers or {}).items())
        return format_html('<pre class="wrapped">{}</pre>', lines)

    @admin.display(description="Response (excerpt)")
    def response(self, obj: Attempt) -> str:
        return format_html('<pre class="wrapped">{}</pre>', obj.response_excerpt[:1000])

    def has_add_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Delivery)
class DeliveryAdmin(DeliveryPageMixin, ReadOnlyAdmin):
    # Clipped ids, keys and URLs and compact times: the whole list fits a laptop's window.
    list_display = [
        clipped("id", 11, keep_end=True),
        clipped("tenant", 24),
        clipped("endpoint__url", 32, description="endpoint"),
        "status",
        "lane",
        "attempts",
        timed("enqueued_at", description="enqueued"),
        timed("next_attempt_at", description="next attempt"),
        timed("delivered_at", description="delivered"),
    ]
    # Tenant and endpoint are boxes for an exact key or id, not Django's select of every
    # tenant (thousands of links on each list view); see tenants/admin_filters.py.
    list_filter = ["status", "lane", TenantKeyFilter, EndpointIdFilter]
    # Exact ids and keys (an index each, fast on a big table), a URL by any part of it.
    search_fields = ["=id", "=event__id", "=tenant__key", "endpoint__url"]
    list_select_related = ["tenant", "endpoint"]
    # Newest first by id (its event's time): the primary key's index in each day's
    # partition, where "-enqueued_at" sorted the whole table for every page. No
    # date_hierarchy: its year links are a DISTINCT over every row (bench/history.py).
    ordering = ["-id"]
    show_full_result_count = False  # no COUNT(*) of the whole table beside a filtered list
    paginator = EstimatedCountPaginator
    inlines = [AttemptInline]
    actions = ["replay_dead_letters", replay_window_action]
    # Shown in words by schedule_state: a read-only boolean is Django's red ✗ icon, which
    # reads like an error where "no" is the usual, healthy answer.
    exclude = ["needs_schedule"]

    def get_search_results(self, request, queryset, search_term):
        term = search_term.strip().upper()
        if looks_like_ulid(term):
            # A delivery's or its event's id: an index each. Django's OR over every search
            # field joins tenants and endpoints and reads the whole table.
            return queryset.filter(Q(pk=term) | Q(event_id=term)), False
        tail = clipped_tail(search_term)
        if tail is not None:  # the id as this list shows it, pasted back
            return queryset.filter(pk__endswith=tail), False
        return super().get_search_results(request, queryset, search_term)

    @admin.action(description="Replay selected dead letters (paced through the tenant's lane)")
    def replay_dead_letters(self, request, queryset) -> None:
        count = replay(
            queryset.filter(status=Delivery.Status.DEAD).select_related("tenant"),
            actor=request.user,
            via=AuditEntry.Via.ADMIN,
        )
        messages.success(request, f"{count} dead deliveries put back in their tenants' lanes.")

    def has_change_permission(self, request, obj=None) -> bool:
        # The list's actions need change permission; a delivery's own page is view-only
        # for everyone (no Save, no Delete, a POST is refused): its buttons are in
        # DeliveryPageMixin, each with its own URL and permission check.
        return obj is None and request.user.has_perm("delivery.change_delivery")

    def has_delete_permission(self, request, obj=None) -> bool:
        return obj is None and super().has_delete_permission(request)

    def get_readonly_fields(self, request, obj=None):
        return [
            "schedule_state" if field.name == "needs_schedule" else field.name
            for field in self.model._meta.fields
        ]

    @admin.display(description="Needs schedule")
    def schedule_state(self, obj: Delivery) -> str:
        if obj.needs_schedule:
            return (
                "yes: saved while Redis was unreachable, so it is not in the schedule yet; "
                "the maintenance sweep puts it there"
            )
        return "no"


@admin.register(Attempt)
class AttemptAdmin(ReadOnlyAdmin):
    list_display = [
        clipped("delivery_id", 11, keep_end=True, description="delivery"),
        "number",
        timed("started_at", description="started"),
        "duration_ms",
        "status_code",
        "outcome",
    ]
    # No filter on status codes: Django's lists the codes seen (a DISTINCT over every
    # attempt ever made, on each page view) and no index could serve it. Failed attempts
    # are one partial index (attempt_failed_idx).
    list_filter = ["outcome", AttemptTenantKeyFilter]
    # Newest first by id (a sequence): the primary key's index; see DeliveryAdmin.
    ordering = ["-id"]
    show_full_result_count = False
    paginator = EstimatedCountPaginator
    search_fields = [
        "=delivery__id",
        "=delivery__event__id",
        "=delivery__tenant__key",
        "delivery__endpoint__url",
    ]
    # The operations overview links to one tenant's attempts; a list filter over every
    # tenant would be a select of thousands, so these lookups are allowed by name instead.
    TENANT_LOOKUPS = ("delivery__tenant__id__exact", "delivery__tenant__isnull")

    def lookup_allowed(self, lookup, value, request=None) -> bool:
        return lookup in self.TENANT_LOOKUPS or super().lookup_allowed(lookup, value, request)

    def get_search_results(self, request, queryset, search_term):
        term = search_term.strip().upper()
        if looks_like_ulid(term):
            # A delivery's id, or an event's (its deliveries' ids first, so that the
            # attempts are found by their own index in their day's partitions).
            deliveries = [
                term,
                *Delivery.objects.filter(event_id=term).values_list("pk", flat=True),
            ]
            return queryset.filter(delivery_id__in=deliveries), False
        tail = clipped_tail(search_term)
        if tail is not None:  # a delivery id as this list shows it, pasted back
            ids = Delivery.objects.filter(pk__endswith=tail).values_list("pk", flat=True)
            return queryset.filter(delivery_id__in=list(ids[:100])), False
        return super().get_search_results(request, queryset, search_term)

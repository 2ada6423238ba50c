"""Sources, events, API tokens and the event type catalogue in the admin. Events are
evidence: read-only."""

from django.conf import settings
from django.contrib import admin, messages
from django.utils import timezone
from django.utils.html import format_html

from core.admin_cells import changelist_link, clipped, clipped_tail, timed
from core.admin_paging import EstimatedCountPaginator
from core.admin_readonly import ReadOnlyAdmin
from core.ids import looks_like_ulid
from tenants.admin import MaskedSecretInline
from tenants.admin_filters import TenantKeyFilter
from webhooks import key_hygiene
from webhooks.admin_payload import PayloadFilter, search_payload
from webhooks.models import ApiToken, Event, EventType, Source, SourceSecret


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
        "key_guard",
        "is_active",
        "fallback_count",
        "ingest_url",
    ]
    list_filter = ["scheme", "is_active", "auto_register_tenants"]
    search_fields = ["slug", "name"]
    prepopulated_fields = {"slug": ["name"]}
    filter_horizontal = ["destinations"]
    readonly_fields = ["key_guard_detail", "fallback_count", "created_at"]
    inlines = [SourceSecretInline]
    actions = ["resume_auto_registration"]

    @admin.display(description="Ingest URL")
    def ingest_url(self, obj: Source) -> str:
        return f"/ingest/{obj.slug}/"

    @admin.display(description="Key guard")
    def key_guard(self, obj: Source) -> str:
        if obj.auto_register_suspended_at:
            return format_html(
                '<strong class="warning-text">auto-registration suspended</strong>'
                "<br><small>{}</small>",
                obj.auto_register_suspended_reason,
            )
        return "ok"

    @admin.display(description="Fairness-key guard")
    def key_guard_detail(self, obj: Source) -> str:
        if not obj.pk:
            return "-"
        numbers = key_hygiene.counts([obj])[obj.pk]
        unknown = "unavailable (Redis)" if numbers.unknown is None else f"{numbers.unknown:,}"
        seen = "unavailable (Redis)" if numbers.seen is None else f"{numbers.seen:,}"
        state = (
            format_html(
                '<strong class="warning-text">Auto-registration suspended since {}:</strong> '
                "{}. New keys use the fallback lane (their events are still delivered). It "
                "resumes by itself after a quiet {}, when you save a new fairness key "
                'below, or with the action "Resume auto-registration".<br>',
                obj.auto_register_suspended_at.strftime("%Y-%m-%d %H:%M %Z"),
                obj.auto_register_suspended_reason,
                key_hygiene.window_phrase(),
            )
            if obj.auto_register_suspended_at
            else ""
        )
        return format_html(
            "{}In the last {}: {} distinct keys seen, {} of them unknown; {} tenants "
            "registered (limit {}).",
            state,
            key_hygiene.window_phrase(),
            seen,
            unknown,
            f"{numbers.registered:,}",
            f"{numbers.limit:,}",
        )

    @admin.action(description="Resume auto-registration (after fixing the fairness key)")
    def resume_auto_registration(self, request, queryset) -> None:
        resumed = 0
        for source in queryset.exclude(auto_register_suspended_at=None):
            key_hygiene.resume(source, by=f"operator {request.user}")
            resumed += 1
        messages.info(request, f"Auto-registration resumed for {resumed} source(s).")

    def save_model(self, request, obj: Source, form, change: bool) -> None:
        super().save_model(request, obj, form, change)
        # A new key location is the usual fix for an unbounded key: count afresh from it.
        if change and "fairness_key" in form.changed_data and obj.auto_register_suspended_at:
            key_hygiene.resume(obj, by=f"operator {request.user} (fairness key changed)")
            messages.info(request, "Auto-registration resumed: the fairness key changed.")

    def changelist_view(self, request, extra_context=None):
        # On GET only: after an action's POST the redirect would show them twice.
        for source in key_hygiene.suspended_sources() if request.method == "GET" else ():
            messages.warning(
                request,
                f"Source {source.slug}: auto-registration suspended "
                f"({source.auto_register_suspended_reason}). Its new keys use the fallback lane.",
            )
        return super().changelist_view(request, extra_context)


@admin.register(Event)
class EventAdmin(ReadOnlyAdmin):
    list_display = [
        clipped("id", 11, keep_end=True),
        timed("received_at", description="received"),
        "source",
        clipped("tenant", 28),
        clipped("event_type", 32, description="event type"),
        clipped("fallback_reason", 32, description="fallback reason"),
    ]
    list_filter = ["source", "received_at", TenantKeyFilter, PayloadFilter]
    search_fields = ["id", "event_type", "idempotency_key", "tenant__key"]
    list_select_related = ["source", "tenant"]
    # No date_hierarchy: its year links are a DISTINCT over every row; the "received"
    # filter's ranges are the received_at index's (bench/history.py).
    show_full_result_count = False  # no COUNT(*) of the whole table beside a filtered list
    paginator = EstimatedCountPaginator
    exclude = ["payload"]
    readonly_fields = ["deliveries_link", "payload_preview", "payload_pruned_at"]

    def get_search_results(self, request, queryset, search_term):
        # After every filter (Django applies the search last): the payload search sees the
        # narrowed list, which bounds what it reads (see webhooks/admin_payload.py).
        term = search_term.strip().upper()
        tail = clipped_tail(search_term)
        if looks_like_ulid(term):
            # An event id: its day's primary key, not a substring match of every field.
            queryset, duplicates = queryset.filter(pk=term), False
        elif tail is not None:  # an event id as this list shows it, pasted back
            queryset, duplicates = queryset.filter(pk__endswith=tail), False
        else:
            queryset, duplicates = super().get_search_results(request, queryset, search_term)
        return search_payload(request, queryset), duplicates

    @admin.display(description="Deliveries")
    def deliveries_link(self, obj: Event) -> str:
        count = obj.deliveries.count()
        return changelist_link(
            "delivery.delivery",
            f"{count} deliver{'y' if count == 1 else 'ies'}",
            event__id__exact=obj.pk,
        )

    @admin.display(description="Payload (first 5,000 bytes)")
    def payload_preview(self, obj: Event) -> str:
        if obj.payload_pruned_at is not None:
            days = min(settings.PAYLOAD_RETENTION_DAYS, settings.RETENTION_DAYS)
            when = timezone.localtime(obj.payload_pruned_at)
            return f"Payload removed after {days} days (retention), on {when:%Y-%m-%d %H:%M:%S}."
        text = bytes(obj.payload[:5000]).decode("utf-8", errors="replace")
        return format_html('<pre class="wrapped">{}</pre>', text)


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    """Tokens are shown once, at creation, in a message; only a hash is stored."""

    list_display = [
        "name",
        "prefix",
        "tenant",
        "access",
        "is_active",
        "created_at",
        "last_used_at",
    ]
    list_filter = ["is_active", "access"]
    search_fields = ["name", "prefix"]
    fields = ["name", "tenant", "access", "is_active", "prefix", "created_at", "last_used_at"]
    readonly_fields = ["prefix", "created_at", "last_used_at"]
    actions = ["revoke"]

    @admin.action(description="Revoke the selected tokens", permissions=["change"])
    def revoke(self, request, queryset) -> None:
        count = queryset.filter(is_active=True).update(is_active=False)
        messages.success(request, f"{count} token{'s' if count != 1 else ''} revoked.")

    def save_model(self, request, obj: ApiToken, form, change: bool) -> None:
        if change:
            super().save_model(request, obj, form, change)
            return
        token, plain = ApiToken.issue(obj.name, tenant=obj.tenant, access=obj.access)
        obj.pk, obj.prefix, obj.token_hash = token.pk, token.prefix, token.token_hash
        messages.warning(request, f"Copy this token now, it will not be shown again: {plain}")


@admin.register(EventType)
class EventTypeAdmin(admin.ModelAdmin):
    """The model's clean() checks the schema and the example; archive a type rather than
    delete it, so that the catalogue still says what old events meant."""

    list_display = ["name", "enforce_schema", "archived", "updated_at"]
    list_filter = ["archived", "enforce_schema"]
    search_fields = ["name", "description"]
    fields = [
        "name",
        "description",
        "schema",
        "example",
        "enforce_schema",
        "archived",
        "created_at",
        "updated_at",
    ]
    readonly_fields = ["created_at", "updated_at"]

    def get_readonly_fields(self, request, obj: EventType | None = None) -> list[str]:
        # Publishers send the name: renaming would refuse (or stop checking) their events.
        return [*self.readonly_fields, "name"] if obj is not None else self.readonly_fields

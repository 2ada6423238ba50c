"""Finding events by a string in their payload, in the events admin, bounded.

The payload is bytes (BinaryField) and has no index a substring could use, so each
search reads payloads row by row. It is therefore refused unless the list is narrowed
to a tenant or a time range first, and even then reads at most the newest SCAN_LIMIT
events of that selection (found through the (tenant, received_at) or received_at index),
and says so on the page.
"""

from django.contrib import messages
from django.db.models import BinaryField, BooleanField, Func, QuerySet, Value
from django.http import HttpRequest

from core.admin_filters import InputFilter

SCAN_LIMIT = 20_000
MAX_NEEDLE = 200
PARAMETER = "payload"
# What narrows the event list enough to search it: a tenant (its link from a tenant's
# page, or the tenant box) or a time range (the date drill-down or the "received" filter).
NARROWING = ("tenant__id__exact", "tenant_key", "received_at__gte", "received_at__year")


class BytesContain(Func):
    """True where the bytes of the first expression contain those of the second, exactly
    (case-sensitive, byte for byte), on SQLite and PostgreSQL."""

    output_field = BooleanField()
    arity = 2

    def as_sqlite(self, compiler, connection, **extra):
        # instr() on two BLOBs compares bytes, not text.
        return self.as_sql(compiler, connection, template="(instr(%(expressions)s) > 0)")

    def as_postgresql(self, compiler, connection, **extra):
        haystack, needle = (compiler.compile(part) for part in self.get_source_expressions())
        return f"(position({needle[0]} in {haystack[0]}) > 0)", [*needle[1], *haystack[1]]


class PayloadFilter(InputFilter):
    """The box; the search itself runs in search_payload, after the other filters, so
    that it sees (and is bounded by) the narrowed list."""

    title = "payload contains"
    parameter_name = PARAMETER
    placeholder = '"order_id": 1234'
    help_text = (
        f"Exact text, case-sensitive. Pick a tenant or a time range first; the newest "
        f"{SCAN_LIMIT:,} events of that selection are searched."
    )

    def queryset(self, request, queryset):
        return queryset


def search_payload(request: HttpRequest, queryset: QuerySet) -> QuerySet:
    """`queryset` (the narrowed event list) limited to payloads containing the typed text;
    unchanged without one; empty, with an error message, if the search is unbounded."""
    needle = request.GET.get(PARAMETER, "").strip()
    if not needle:
        return queryset
    if len(needle) > MAX_NEEDLE:
        messages.error(request, f"Payload search: at most {MAX_NEEDLE} characters.")
        return queryset.none()
    if not any(request.GET.get(key) for key in NARROWING):
        messages.error(
            request,
            "Payload search needs a tenant or a time range first (the tenant box, a "
            "tenant's “events” link, the date drill-down or the “received” filter): "
            "searching every payload would read the whole table.",
        )
        return queryset.none()
    newest = queryset.order_by("-received_at", "-id").values("pk")[:SCAN_LIMIT]
    if newest.count() >= SCAN_LIMIT:  # a bounded count: at most SCAN_LIMIT index entries
        messages.warning(
            request,
            f"Payload search read only the newest {SCAN_LIMIT:,} events of this selection; "
            "narrow the time range to search older ones.",
        )
    return queryset.filter(pk__in=newest).filter(
        BytesContain("payload", Value(needle.encode(), output_field=BinaryField()))
    )

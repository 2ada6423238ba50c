"""The tenant portal's message log: which events a tenant sent, filtered and paged.

Queries only. Every one starts from the tenant (`Event.tenant`, `Delivery.tenant`), so an
id typed into a URL or a filter never reaches another tenant's rows. Pages walk the
(tenant, received_at) index by keyset: a cursor is the last row's (received_at, id), so
a page costs the same on the first day and after a hundred million events, and nothing
counts the whole table.
"""

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime

from django import forms
from django.db.models import Exists, OuterRef, Q, QuerySet

from delivery.models import UNFINISHED, Delivery
from tenants.models import Endpoint, Tenant
from webhooks.models import Event

PAGE_SIZE = 50
# Crockford base32, as core.ids makes them; anything else cannot be an event id.
ULID_RE = re.compile(r"^[0-9A-HJKMNP-TV-Z]{26}$")
CURSOR_RE = re.compile(r"^(?P<micros>\d{1,20})-(?P<id>[0-9A-HJKMNP-TV-Z]{26})$")

# The words the portal uses for a delivery's status, and the row status each means.
STATUS_FILTERS: dict[str, str] = {
    "delivered": Delivery.Status.DELIVERED,
    "pending": Delivery.Status.PENDING,
    "retrying": Delivery.Status.RETRY_SCHEDULED,
    "held": Delivery.Status.HELD,
    "dead": Delivery.Status.DEAD,
}
# Statuses a small fraction of a tenant's deliveries have (see filtered_events).
SPARSE_STATUSES = (Delivery.Status.DEAD, Delivery.Status.RETRY_SCHEDULED)
STATUS_WORDS: dict[str, str] = {status: word for word, status in STATUS_FILTERS.items()}

DATETIME_FORMATS = ["%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H:%M", "%Y-%m-%d %H:%M:%S", "%Y-%m-%d"]
TIME_INPUT = forms.DateTimeInput(
    attrs={"type": "datetime-local", "step": "1"}, format="%Y-%m-%dT%H:%M:%S"
)


class BadCursor(ValueError):
    """A pagination cursor that we did not write (edited by hand, cut short)."""


class EndpointChoice(forms.ModelChoiceField):
    def label_from_instance(self, obj: Endpoint) -> str:
        return obj.description or obj.url


class LogFilter(forms.Form):
    """The log's filters. The endpoint choices are the tenant's own endpoints only, so
    another tenant's endpoint id is an invalid choice (400), not an empty page."""

    event_type = forms.CharField(required=False, max_length=200, label="Event type")
    status = forms.ChoiceField(
        required=False,
        choices=[("", "any"), *[(word, word) for word in STATUS_FILTERS]],
        label="Delivery status",
    )
    endpoint = EndpointChoice(
        required=False,
        queryset=Endpoint.objects.none(),
        empty_label="any",
        error_messages={"invalid_choice": "Not one of your endpoints."},
    )
    # Read in the viewer's time zone (django.utils.timezone's current one), to the second.
    since = forms.DateTimeField(
        required=False, input_formats=DATETIME_FORMATS, label="From", widget=TIME_INPUT
    )
    until = forms.DateTimeField(
        required=False, input_formats=DATETIME_FORMATS, label="To", widget=TIME_INPUT
    )
    event_id = forms.CharField(
        required=False,
        max_length=26,
        label="Event id",
        widget=forms.TextInput(attrs={"placeholder": "01J…", "spellcheck": "false"}),
    )

    def __init__(self, *args: object, tenant: Tenant, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.fields["endpoint"].queryset = Endpoint.objects.filter(tenant=tenant).order_by("url")

    def clean_event_id(self) -> str:
        value = self.cleaned_data["event_id"].strip().upper()
        if value and not ULID_RE.match(value):
            raise forms.ValidationError("An event id is 26 letters and digits, e.g. 01J…")
        return value

    def clean_event_type(self) -> str:
        return self.cleaned_data["event_type"].strip()

    def clean(self) -> dict:
        cleaned = super().clean()
        since, until = cleaned.get("since"), cleaned.get("until")
        if since and until and since > until:
            raise forms.ValidationError("“From” must be before “To”.")
        return cleaned


def filtered_events(tenant: Tenant, filters: dict) -> QuerySet[Event]:
    """The tenant's events matching the cleaned `filters` (LogFilter.cleaned_data)."""
    events = Event.objects.filter(tenant=tenant)
    if filters.get("event_id"):
        events = events.filter(pk=filters["event_id"])
    if filters.get("event_type"):
        events = events.filter(event_type=filters["event_type"])
    if filters.get("since"):
        events = events.filter(received_at__gte=filters["since"])
    if filters.get("until"):
        events = events.filter(received_at__lte=filters["until"])
    wanted = Q()
    status = STATUS_FILTERS.get(filters.get("status") or "")
    if status:
        wanted &= Q(status=status)
    if filters.get("endpoint"):
        wanted &= Q(endpoint=filters["endpoint"])
    if not wanted:
        return events
    # One delivery must match both (a dead delivery *to that endpoint*).
    matching = Delivery.objects.filter(wanted, tenant=tenant)
    if status in SPARSE_STATUSES:
        # Few rows, all in the (tenant, status) partial index of unfinished work: start
        # from them, then fetch their events by primary key.
        # UNFINISHED is implied by the status; spelled out so that SQLite's planner, which
        # cannot prove it, uses the partial index too (PostgreSQL's can).
        return events.filter(pk__in=matching.filter(UNFINISHED).values("event_id"))
    # Delivered, pending and held match most recent events (a backlog is new events), and
    # an endpoint is one of few of its tenant's: walk the events newest first and probe
    # Delivery's event index for each.
    return events.filter(ProbedPerRow(matching.filter(event=OuterRef("pk"))))


class ProbedPerRow(Exists):
    """EXISTS that PostgreSQL runs for each outer row, in the outer row's order, and never
    turns into a join: an OFFSET keeps the planner from pulling the subquery up. Pulled
    up, a filter whose rows it underestimates (tenant and endpoint, which it takes for
    independent; a day partition not yet analyzed) became a scan of every partition of
    deliveries to hash, where walking the newest events and probing each reads a few
    index pages (docs/BENCHMARKS.md)."""

    template = "EXISTS(%(subquery)s OFFSET 0)"


# --- keyset pagination ---------------------------------------------------------------------


def make_cursor(event: Event) -> str:
    when = event.received_at.astimezone(UTC)
    micros = int(when.timestamp()) * 1_000_000 + when.microsecond
    return f"{micros}-{event.pk}"


def read_cursor(cursor: str) -> tuple[datetime, str]:
    found = CURSOR_RE.match(cursor)
    if found is None:
        raise BadCursor("That page link is not valid; start again from the newest events.")
    micros = int(found["micros"])
    try:
        when = datetime.fromtimestamp(micros // 1_000_000, tz=UTC).replace(
            microsecond=micros % 1_000_000
        )
    except (OverflowError, OSError, ValueError) as exc:
        raise BadCursor("That page link is not valid; start again from the newest events.") from exc
    return when, found["id"]


@dataclass
class Page:
    events: list[Event]
    older: str | None = None  # cursor for the next (older) page
    newer: str | None = None  # cursor for the previous (newer) page
    deliveries: dict[str, list[Delivery]] = field(default_factory=dict)


def page(
    events: QuerySet[Event],
    *,
    before: str | None = None,
    after: str | None = None,
    size: int = PAGE_SIZE,
) -> Page:
    """One page of `events`, newest first. `before` walks to older rows, `after` back to
    newer ones; each fetches one row more than it shows to know whether more exist."""
    if before and after:
        raise BadCursor("Give either an older or a newer page, not both.")
    if after:
        when, pk = read_cursor(after)
        rows = list(
            events.filter(Q(received_at__gt=when) | Q(received_at=when, pk__gt=pk)).order_by(
                "received_at", "pk"
            )[: size + 1]
        )
        more_newer = len(rows) > size
        rows = rows[:size][::-1]
        return Page(
            rows,
            older=make_cursor(rows[-1]) if rows else None,
            newer=make_cursor(rows[0]) if rows and more_newer else None,
        )
    query = events
    if before:
        when, pk = read_cursor(before)
        query = events.filter(Q(received_at__lt=when) | Q(received_at=when, pk__lt=pk))
    rows = list(query.order_by("-received_at", "-pk")[: size + 1])
    more_older = len(rows) > size
    rows = rows[:size]
    return Page(
        rows,
        older=make_cursor(rows[-1]) if rows and more_older else None,
        # Having come from a newer page, there is one to go back to.
        newer=make_cursor(rows[0]) if rows and before else None,
    )


def attach_deliveries(tenant: Tenant, shown: Page) -> None:
    """Each shown event's deliveries (its status chips), in one indexed query."""
    ids = [event.pk for event in shown.events]
    for delivery in (
        Delivery.objects.filter(event_id__in=ids, tenant=tenant)
        .select_related("endpoint")
        .order_by("id")
    ):
        shown.deliveries.setdefault(delivery.event_id, []).append(delivery)

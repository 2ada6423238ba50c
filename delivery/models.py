"""Delivery records: one row per (event, endpoint), one Attempt row per HTTP request."""

from django.conf import settings
from django.db import models
from django.utils import timezone

from core.ids import new_ulid
from tenants.models import Endpoint, Tenant
from webhooks.models import Event

# The rows the indexes of work still to do hold. Nearly every row ends up delivered, and
# every query that filters by status asks for the others (pending, retrying, held, dead):
# a delivered row is in none of the status indexes, so marking a row delivered (once per
# webhook, the hottest UPDATE there is) writes three fewer index entries, and the indexes
# stay the size of the work, not of the history.
UNFINISHED = ~models.Q(status="delivered")


class Delivery(models.Model):
    """One event to one endpoint. The database row is the truth; Redis only holds its id."""

    class Status(models.TextChoices):
        PENDING = "pending", "Pending"
        DELIVERED = "delivered", "Delivered"
        RETRY_SCHEDULED = "retry_scheduled", "Retry scheduled"
        HELD = "held", "Held (endpoint disabled)"
        DEAD = "dead", "Dead (retries exhausted)"

    # Statuses whose delivery must be somewhere in the schedule (queued, delayed or leased).
    # "In flight" is not a row status: the scheduler's leases know it without a write
    # per delivery, and a crashed worker's lease expiring is all the recovery it needs.
    OPEN_STATUSES = (Status.PENDING, Status.RETRY_SCHEDULED)
    # All the others (a test checks the two partition the choices): finished or set
    # aside, so a late attempt's outcome must not change the row.
    CLOSED_STATUSES = (Status.DELIVERED, Status.HELD, Status.DEAD)

    class Lane(models.TextChoices):
        """The lane a delivery waits in. The scheduler has its own words for them
        (delivery.scheduler.FRESH/RETRY); delivery.pipeline.enqueueing maps one to the other."""

        FRESH = "fresh", "Fresh"
        RETRY = "retry", "Retry"

    id = models.CharField(primary_key=True, max_length=26, default=new_ulid, editable=False)
    event = models.ForeignKey(Event, on_delete=models.CASCADE, related_name="deliveries")
    # No single-column indexes on endpoint and tenant: the (endpoint, status) and (tenant,
    # status) indexes below lead with them and serve the same lookups, and every index is
    # written again on each status change (docs/BENCHMARKS.md).
    endpoint = models.ForeignKey(
        Endpoint, on_delete=models.CASCADE, related_name="deliveries", db_index=False
    )
    tenant = models.ForeignKey(
        Tenant,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="deliveries",
        db_index=False,
        help_text="Copied from the event: the lane it waits in. Empty is the fallback lane.",
    )
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.PENDING)
    lane = models.CharField(max_length=10, choices=Lane.choices, default=Lane.FRESH)
    attempts = models.PositiveIntegerField(
        "attempts since last sent",
        default=0,
        help_text="Attempts since it was first sent or last sent again (resend, replay): the "
        "retry schedule counts these. Every attempt ever made is listed with the delivery.",
    )
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    enqueued_at = models.DateTimeField(default=timezone.now)
    delivered_at = models.DateTimeField(null=True, blank=True)
    last_error = models.CharField(max_length=500, blank=True)
    needs_schedule = models.BooleanField(
        default=False,
        help_text="Committed while Redis was unreachable: the sweeper puts it in the schedule.",
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-enqueued_at"]
        verbose_name_plural = "deliveries"
        indexes = [
            models.Index(
                fields=["status", "next_attempt_at"],
                condition=UNFINISHED,
                name="delivery_status_due_idx",
            ),
            models.Index(
                fields=["tenant", "status"], condition=UNFINISHED, name="delivery_tenant_status_idx"
            ),
            models.Index(
                fields=["endpoint", "status"],
                condition=UNFINISHED,
                name="delivery_endpoint_status_idx",
            ),
            models.Index(
                fields=["needs_schedule"],
                condition=models.Q(needs_schedule=True),
                name="delivery_needs_schedule_idx",
            ),
            # Delivery rates: per tenant (a dashboard's last minute) and for everyone (the
            # sampler's interval). Partial, so rows still waiting cost the index nothing.
            models.Index(
                fields=["tenant", "delivered_at"],
                condition=models.Q(delivered_at__isnull=False),
                name="delivery_tenant_delivered_idx",
            ),
            models.Index(
                fields=["delivered_at"],
                condition=models.Q(delivered_at__isnull=False),
                name="delivery_delivered_at_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.id} ({self.status})"


class Attempt(models.Model):
    """One HTTP request for a delivery. A deferral (endpoint at its cap) is never an Attempt."""

    class Outcome(models.TextChoices):
        DELIVERED = "delivered", "Delivered"
        RETRY = "retry", "Will retry"
        FAILED = "failed", "Failed for good"

    # Indexed by (delivery, number) below, which serves lookups by delivery too.
    delivery = models.ForeignKey(
        Delivery, on_delete=models.CASCADE, related_name="attempt_set", db_index=False
    )
    # Copied from the delivery when the attempt is written, so an endpoint's recent
    # attempts (the portal's health numbers) are one index range, not a join over every
    # attempt of the period. Empty on rows written before the column existed.
    endpoint = models.ForeignKey(
        Endpoint,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="+",
        db_index=False,
    )
    number = models.PositiveIntegerField()
    started_at = models.DateTimeField(default=timezone.now)
    duration_ms = models.PositiveIntegerField(default=0)
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    outcome = models.CharField(max_length=12, choices=Outcome.choices)
    error = models.CharField(max_length=500, blank=True)
    response_excerpt = models.TextField(blank=True)
    request_headers = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-started_at"]
        indexes = [
            models.Index(fields=["delivery", "number"], name="attempt_delivery_number_idx"),
            # An endpoint's attempts of the last hour or day (dashboards.endpoint_health).
            models.Index(fields=["endpoint", "started_at"], name="attempt_endpoint_started_idx"),
            # The admin's "outcome" filter for failures, newest first: only failed attempts
            # are in it, so the many that delivered cost it nothing.
            models.Index(
                fields=["-id"],
                condition=~models.Q(outcome="delivered"),
                name="attempt_failed_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"attempt {self.number} of {self.delivery_id}: {self.outcome}"


class TenantSample(models.Model):
    """One tenant's backlog and throughput at one sampling instant: the dashboards' history.

    Written by `delivery.upkeep.sampling.sample()` from the maintenance sweep, only for tenants
    that were backlogged or busy, and pruned after HISTORY_RETENTION_HOURS. Charts read
    these rows instead of recounting attempts on every page view.
    """

    tenant = models.ForeignKey(
        Tenant,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="+",
        help_text="Empty: the fallback lane.",
    )
    at = models.DateTimeField()
    interval_seconds = models.FloatField(help_text="Seconds since the previous sample.")
    backlog_age_seconds = models.FloatField(default=0)
    queued = models.PositiveIntegerField(default=0, help_text="Fresh and retry lanes.")
    delayed = models.PositiveIntegerField(default=0)
    in_flight = models.PositiveIntegerField(default=0)
    received = models.PositiveIntegerField(default=0, help_text="Events accepted in the interval.")
    delivered = models.PositiveIntegerField(default=0, help_text="Deliveries made in the interval.")

    class Meta:
        ordering = ["at"]
        indexes = [
            models.Index(fields=["tenant", "at"], name="sample_tenant_at_idx"),
            models.Index(fields=["at"], name="sample_at_idx"),
        ]

    def __str__(self) -> str:
        return f"sample of tenant {self.tenant_id} at {self.at:%H:%M:%S}"


class ReplayJob(models.Model):
    """A window of one tenant's finished deliveries sent again, fed into its lane a chunk
    at a time by the maintenance sweep (delivery.replays.window). Deliveries get no column
    for it (a hot table): the job keeps a keyset cursor and the ids of its last chunk."""

    class State(models.TextChoices):
        RUNNING = "running", "Running"
        FINISHED = "finished", "Finished"
        CANCELLED = "cancelled", "Cancelled"

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="replay_jobs")
    filters = models.JSONField(
        default=dict,
        help_text="endpoint (id or null), statuses, event_type, from and to (ISO times).",
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # Kept beside the foreign key so the job still names its author once the user is gone.
    created_by_name = models.CharField(max_length=150)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    state = models.CharField(max_length=10, choices=State.choices, default=State.RUNNING)
    matched = models.PositiveIntegerField(default=0, help_text="Counted at confirmation.")
    matched_capped = models.BooleanField(
        default=False, help_text="The count stopped at its cap: more than `matched` matched."
    )
    fed = models.PositiveIntegerField(default=0, help_text="Sent again so far.")
    cursor = models.CharField(
        max_length=26, blank=True, help_text="The last delivery id fed (keyset pagination)."
    )
    last_chunk = models.JSONField(default=list, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    cancelled_by_name = models.CharField(max_length=150, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["tenant", "-created_at"], name="replay_tenant_created_idx"),
            # The sweep reads running jobs only; finished ones pile up and cost it nothing.
            models.Index(
                fields=["state"],
                condition=models.Q(state="running"),
                name="replay_running_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"replay {self.pk} of {self.tenant}"

    @property
    def matched_text(self) -> str:
        return f"more than {self.matched:,}" if self.matched_capped else f"{self.matched:,}"

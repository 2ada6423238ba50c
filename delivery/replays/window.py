"""Replaying a window of one tenant's finished deliveries, paced.

A job (delivery.models.ReplayJob) names a window: the tenant, optionally one endpoint and
an event type, the statuses to send again (dead, delivered) and a time range. Enqueuing
100,000 deliveries at once would put the tenant's fresh events behind all of them, so the
maintenance sweep calls `feed_replays()`, which feeds each tenant's oldest running job
one chunk (REPLAY_CHUNK_SIZE) at a time: the next chunk only once none of the previous
one is still pending or retrying. Fresh events that arrive meanwhile queue behind at most
one chunk. Cancelling stops the feeding; a chunk already in the lane still goes out.

The window walks deliveries by id (keyset pagination): ids are ULIDs, time-ordered, so the
time range is a primary-key range, and a delivery sent again keeps its id and is never
fed twice by the same job.
"""

import logging
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F, QuerySet
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from core import operational
from core.ids import ulid_floor
from core.operational import Announcement
from delivery.models import Delivery, ReplayJob
from delivery.replays.resend import RESENDABLE, resend
from tenants import audit
from tenants.models import AuditEntry, Tenant

logger = logging.getLogger(__name__)
# Held deliveries wait for their endpoint and open ones are on their way: a window
# replays only finished ones (delivery.replays.resend.RESENDABLE).
STATUSES = tuple(str(status) for status in RESENDABLE)
# Jobs looked at per sweep: one per tenant, oldest tenants' jobs first.
JOBS_PER_SWEEP = 500


@dataclass(frozen=True)
class Window:
    """What a replay sends again. `start` is inclusive, `end` exclusive, both by when the
    delivery was made (its id's time, which is when its event arrived)."""

    start: datetime
    end: datetime
    statuses: tuple[str, ...] = STATUSES
    endpoint_id: int | None = None
    event_type: str = ""

    def to_json(self) -> dict:
        return {
            "endpoint": self.endpoint_id,
            "statuses": list(self.statuses),
            "event_type": self.event_type,
            "from": self.start.isoformat(),
            "to": self.end.isoformat(),
        }

    @classmethod
    def from_json(cls, data: dict) -> "Window":
        return cls(
            start=parse_datetime(data["from"]),
            end=parse_datetime(data["to"]),
            statuses=tuple(data["statuses"]),
            endpoint_id=data.get("endpoint"),
            event_type=data.get("event_type") or "",
        )


def _ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def deliveries_in(tenant: Tenant, window: Window) -> QuerySet:
    """The tenant's finished deliveries in the window. Served by the primary key's range;
    open and held deliveries never match, whatever `statuses` says."""
    statuses = [status for status in window.statuses if status in STATUSES]
    queryset = Delivery.objects.filter(
        tenant=tenant,
        status__in=statuses,
        id__gte=ulid_floor(_ms(window.start)),
        id__lt=ulid_floor(_ms(window.end)),
    )
    if window.endpoint_id is not None:
        queryset = queryset.filter(endpoint_id=window.endpoint_id)
    if window.event_type:
        queryset = queryset.filter(event__event_type=window.event_type)
    return queryset


def count_bounded(tenant: Tenant, window: Window) -> tuple[int, bool]:
    """How many match, counting no further than REPLAY_COUNT_LIMIT; (count, capped)."""
    limit = settings.REPLAY_COUNT_LIMIT
    count = deliveries_in(tenant, window).order_by()[: limit + 1].count()
    return min(count, limit), count > limit


def start(tenant: Tenant, window: Window, *, user, via: str) -> ReplayJob:
    """Create a running job; the next sweep feeds its first chunk. A window reaching into
    the future ends now: deliveries made later (fresh events, this replay's own
    successes) are not the data the receiver lost."""
    # The window's end is exclusive, to the millisecond: up to and including this one,
    # so a delivery made in the very millisecond the replay starts is not left out.
    window = replace(window, end=min(window.end, timezone.now() + timedelta(milliseconds=1)))
    matched, capped = count_bounded(tenant, window)
    author = user if user is not None and user.is_authenticated else None
    with transaction.atomic():
        job = ReplayJob.objects.create(
            tenant=tenant,
            filters=window.to_json(),
            created_by=author,
            created_by_name=audit.actor_name(user),
            matched=matched,
            matched_capped=capped,
        )
        audit.record(
            actor=user,
            action=AuditEntry.Action.REPLAY_STARTED,
            via=via,
            tenant=tenant,
            target=f"replay {job.pk}",
            filters=job.filters,
            matched=matched,
            matched_capped=capped,
        )
    return job


def cancel(job: ReplayJob, *, user, via: str) -> bool:
    """Stop feeding. The chunk already in the lane still goes out (its deliveries are
    ordinary pending ones now). False if the job was no longer running."""
    name = audit.actor_name(user)
    with transaction.atomic():
        changed = ReplayJob.objects.filter(pk=job.pk, state=ReplayJob.State.RUNNING).update(
            state=ReplayJob.State.CANCELLED, finished_at=timezone.now(), cancelled_by_name=name
        )
        job.refresh_from_db()
        if changed:
            audit.record(
                actor=user,
                action=AuditEntry.Action.REPLAY_CANCELLED,
                via=via,
                tenant=job.tenant,
                target=f"replay {job.pk}",
                fed=job.fed,
                matched=job.matched,
            )
    return bool(changed)


def chunk_open(job: ReplayJob) -> bool:
    """Whether any delivery of the job's last chunk is still in the lane."""
    return (
        bool(job.last_chunk)
        and Delivery.objects.filter(
            id__in=job.last_chunk, status__in=Delivery.OPEN_STATUSES
        ).exists()
    )


def feed(job: ReplayJob) -> int:
    """Feed the job's next chunk if its last one has left the lane; returns how many were
    sent again (0 while waiting). Marks the job finished when the window is exhausted."""
    if job.state != ReplayJob.State.RUNNING or chunk_open(job):
        return 0
    window = Window.from_json(job.filters)
    ids = list(
        deliveries_in(job.tenant, window)
        .filter(id__gt=job.cursor)
        .order_by("id")
        .values_list("id", flat=True)[: settings.REPLAY_CHUNK_SIZE]
    )
    with transaction.atomic():
        claim = ReplayJob.objects.filter(
            pk=job.pk, state=ReplayJob.State.RUNNING, cursor=job.cursor
        )
        if not ids:
            finished_at = timezone.now()
            if claim.update(state=ReplayJob.State.FINISHED, finished_at=finished_at, last_chunk=[]):
                _announce_finished(job, finished_at)
            return 0
        # Claimed by moving the cursor: two sweeps racing feed a chunk once; the loser
        # changes nothing (a cancel in between wins too).
        if not claim.update(cursor=ids[-1], last_chunk=ids):
            return 0
        sent = resend(Delivery.objects.filter(id__in=ids))
        ReplayJob.objects.filter(pk=job.pk).update(fed=F("fed") + sent)
    return sent


def _announce_finished(job: ReplayJob, finished_at: datetime) -> None:
    data = {
        "replay_id": job.pk,
        "filters": job.filters,
        "matched": job.matched,
        "sent_again": job.fed,
        "created_by": job.created_by_name,
        "finished_at": finished_at.isoformat(),
    }
    operational.announce([Announcement(operational.REPLAY_FINISHED, job.tenant_id, data)])


def feed_replays() -> dict[str, int]:
    """The sweep's step: each tenant's oldest running job gets its next chunk if due.
    One job per tenant at a time, so a tenant never has two replay chunks in its lane."""
    jobs = ReplayJob.objects.filter(state=ReplayJob.State.RUNNING).select_related("tenant")
    seen: set[int] = set()
    fed = 0
    for job in jobs.order_by("created_at", "id")[:JOBS_PER_SWEEP]:
        if job.tenant_id in seen:
            continue
        seen.add(job.tenant_id)
        try:
            fed += feed(job)
        except Exception:
            # One bad job must not stop the sweep's other work; it is tried again next time.
            logger.exception("replay job %s could not be fed", job.pk)
    return {"replay_jobs": len(seen), "replay_fed": fed}

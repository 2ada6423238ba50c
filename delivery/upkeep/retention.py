"""Retention: finished history is removed in bounded batches, open work never.

What goes and when (docs/RELIABILITY.md, "What is kept and for how long"):

* a delivered delivery RETENTION_DAYS after its `delivered_at`, with its attempts. By
  `delivered_at`, not by its id's time: a delivery that waited three weeks on a disabled
  endpoint is still there for a month after it finally went out, and the partial index on
  `delivered_at` (delivery_delivered_at_idx) holds exactly the delivered rows, oldest
  first, so each batch is one index range with nothing to skip;
* a dead delivery DEAD_LETTER_RETENTION_DAYS after it was made (its id's time: dead rows
  have no "died at" column, and the id is the primary key's range), with its attempts;
* an event once it has no deliveries left and its id is older than RETENTION_DAYS;
* an event's payload after PAYLOAD_RETENTION_DAYS once none of its deliveries is open,
  held or dead (a dead letter may still be replayed, and a replay sends the payload):
  the row and its metadata stay, `payload_pruned_at` records it;
* audit entries after AUDIT_RETENTION_DAYS, finished or cancelled replay jobs after
  RETENTION_DAYS.

Pending, retrying and held deliveries are never touched, whatever their age, and so
neither are their events. A running replay job is not waited for: deliveries of its
window that retention removed are simply not sent again.

Every statement reads or writes at most RETENTION_BATCH_SIZE rows and commits on its own,
so the recorder's UPDATEs never wait long behind a prune; a run stops after
RETENTION_SWEEP_SECONDS and the next sweep goes on. Walks over primary-key ranges keep
their position in Redis, so rows that must stay (old held work, events whose dead letters
are still kept) are read once per pass, not once per sweep.

On PostgreSQL, events, deliveries and attempts live in day partitions (delivery.upkeep.partitions):
a day past RETENTION_DAYS is dropped whole first, after what these rules keep of it is put
back (it lands in the default partitions). The batches below then find only those rows,
payloads, and the small tables. What goes is the same either way; only the cost differs.
"""

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import redis
from django.conf import settings
from django.db import transaction
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from core import redis_connection
from core.ids import ulid_floor
from delivery.models import Attempt, Delivery, ReplayJob
from delivery.scheduler import get_scheduler
from delivery.upkeep import partitions
from tenants.models import AuditEntry
from webhooks.models import Event

logger = logging.getLogger(__name__)

CURSOR_KEY = redis_connection.KEY_PREFIX + "retention:cursor:"
# After a walk's full pass, the sweep starts the next one this much later. What a walk
# finds is what the delivery batches did not settle at once (events that matched no
# endpoint, payloads whose open work finished since): minutes late is fine, and rows that
# must stay (e.g. the events of a million dead letters still kept) are not re-read by
# every sweep.
WALK_REST_SECONDS = 600
# Statuses whose deliveries keep their event's payload: work still to do, and dead
# letters that may be replayed.
KEEPS_PAYLOAD = (
    Delivery.Status.PENDING,
    Delivery.Status.RETRY_SCHEDULED,
    Delivery.Status.HELD,
    Delivery.Status.DEAD,
)
COUNTS = (
    "partition_days",
    "deliveries",
    "dead",
    "attempts",
    "events",
    "payloads",
    "audit",
    "replay_jobs",
)


@dataclass(frozen=True)
class Policy:
    """The cut-off instants of one run, computed once so every step agrees."""

    now: datetime
    retention_days: int
    dead_days: int
    payload_days: int
    audit_days: int

    @classmethod
    def from_settings(cls, now: datetime | None = None) -> "Policy":
        return cls(
            now=now or timezone.now(),
            retention_days=settings.RETENTION_DAYS,
            dead_days=settings.DEAD_LETTER_RETENTION_DAYS,
            # Never longer than the event itself is kept (settings refuses it at start-up;
            # a test overriding one setting gets the same rule).
            payload_days=min(settings.PAYLOAD_RETENTION_DAYS, settings.RETENTION_DAYS),
            audit_days=settings.AUDIT_RETENTION_DAYS,
        )

    def before(self, days: int) -> datetime:
        return self.now - timedelta(days=days)

    def id_floor(self, days: int) -> str:
        """Ids made before `days` ago sort below this one (ULIDs start with their time)."""
        return ulid_floor(int(self.before(days).timestamp() * 1000))


@dataclass
class Result:
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTS, 0))
    done: bool = True  # False: the time budget ran out with work left

    def add(self, name: str, n: int) -> None:
        self.counts[name] += n

    @property
    def total(self) -> int:
        return sum(self.counts.values())


class _Budget:
    """Time left in a run. Each step does at least one batch, however little is left, so
    every step makes progress even when an earlier one used the whole budget."""

    def __init__(self, seconds: float | None, *, rest: bool = True) -> None:
        self.deadline = None if seconds is None else time.monotonic() + seconds
        # Whether a walk that finished a pass lately waits WALK_REST_SECONDS before the
        # next (the sweep); the command walks at once.
        self.rest = rest

    def left(self) -> bool:
        return self.deadline is None or time.monotonic() < self.deadline


class _Cursor:
    """Where a primary-key walk stopped, in Redis so the next sweep goes on from there.
    Without Redis every run starts at the beginning: slower, never wrong."""

    def __init__(self, name: str) -> None:
        self.key = CURSOR_KEY + name

    def get(self) -> str:
        try:
            value = get_scheduler().connection.get(self.key)
        except redis.RedisError:
            return ""
        return value.decode() if isinstance(value, bytes) else (value or "")

    def set(self, value: str) -> None:
        try:
            get_scheduler().connection.set(self.key, value)
        except redis.RedisError as exc:
            logger.warning("retention cursor not saved: %s", exc)

    def resting(self) -> bool:
        try:
            return bool(get_scheduler().connection.exists(self.key + ":rest"))
        except redis.RedisError:
            return False

    def rest(self) -> None:
        try:
            get_scheduler().connection.set(self.key + ":rest", "1", ex=WALK_REST_SECONDS)
        except redis.RedisError as exc:
            logger.warning("retention walk rest not saved: %s", exc)


def _delete_deliveries(ids: list[str], rule: Q) -> tuple[int, int, set[str]]:
    """Delete the deliveries among `ids` still matching `rule`, attempts first; one short
    transaction. The rule is checked again inside it: a delivery resent since it was
    picked is pending now and stays. Returns (deliveries, attempts, their event ids)."""
    with transaction.atomic():
        # PostgreSQL: lock them, so a resend waits instead of racing the DELETEs. SQLite
        # has no row locks; its first write below takes the database's write lock, and
        # both statements re-check the rule under it.
        locked = list(
            Delivery.objects.select_for_update()
            .filter(rule, id__in=ids)
            .order_by()
            .values_list("id", "event_id")
        )
        if not locked:
            return 0, 0, set()
        still = Delivery.objects.filter(rule, id__in=[pk for pk, _ in locked])
        attempts, _ = Attempt.objects.filter(delivery_id__in=still.values("id")).delete()
        deleted, _ = still.only("id").delete()
    return deleted, attempts, {event_id for _, event_id in locked}


def _prune_deliveries(
    policy: Policy, ids: list[str], rule: Q, result: Result, name: str, *, dry_run: bool
) -> None:
    """One batch of deliveries, then their events at once (an event whose last delivery
    just went is past retention too), rather than on the event walk's next pass."""
    if dry_run:
        matching = Delivery.objects.filter(rule, id__in=ids)
        result.add(name, matching.count())
        result.add(
            "attempts", Attempt.objects.filter(delivery_id__in=matching.values("id")).count()
        )
        return  # their events are counted by the event walk, which knows what would go
    deliveries, attempts, event_ids = _delete_deliveries(ids, rule)
    result.add(name, deliveries)
    result.add("attempts", attempts)
    if event_ids:
        settle_events(policy, sorted(event_ids), result, dry_run=False)


def prune_delivered(policy: Policy, budget: _Budget, result: Result, *, dry_run: bool) -> bool:
    """Delivered deliveries past RETENTION_DAYS by delivered_at; True when none is left."""
    cutoff = policy.before(policy.retention_days)
    rule = Q(status=Delivery.Status.DELIVERED, delivered_at__lt=cutoff)
    after: tuple[datetime, str] | None = None
    while True:
        batch = Delivery.objects.filter(rule)
        if after is not None:
            # Keyset paging: dry runs delete nothing, and a row resent meanwhile stays.
            # The plain `>=` keeps it an index range; the OR only settles ties.
            batch = batch.filter(delivered_at__gte=after[0]).filter(
                Q(delivered_at__gt=after[0]) | Q(id__gt=after[1])
            )
        rows = list(
            batch.order_by("delivered_at", "id").values_list("delivered_at", "id")[
                : settings.RETENTION_BATCH_SIZE
            ]
        )
        if not rows:
            return True
        ids = [pk for _, pk in rows]
        _prune_deliveries(policy, ids, rule, result, "deliveries", dry_run=dry_run)
        after = rows[-1]
        if len(rows) < settings.RETENTION_BATCH_SIZE:
            return True
        if not budget.left():
            return False


def _walk(
    name: str,
    model,
    below: str,
    budget: _Budget,
    step: Callable[[list[str]], None],
    *,
    dry_run: bool,
) -> bool:
    """Call `step` with successive batches of `model`'s ids below `below`, each one read
    from the primary key's index alone (at most RETENTION_BATCH_SIZE entries), from where
    the last run stopped. True when the walk reached `below` (and starts over next time)."""
    cursor = _Cursor(name)
    position = "" if dry_run else cursor.get()
    if not position and not dry_run and budget.rest and cursor.resting():
        return True
    while True:
        ids = list(
            model.objects.filter(pk__gt=position, pk__lt=below)
            .order_by("pk")
            .values_list("pk", flat=True)[: settings.RETENTION_BATCH_SIZE]
        )
        if ids:
            step(ids)
            position = ids[-1]
        if len(ids) < settings.RETENTION_BATCH_SIZE:
            if not dry_run:
                cursor.set("")
                cursor.rest()
            return True
        if not budget.left():
            if not dry_run:
                cursor.set(position)
            return False


def prune_dead(policy: Policy, budget: _Budget, result: Result, *, dry_run: bool) -> bool:
    """Dead deliveries made more than DEAD_LETTER_RETENTION_DAYS ago, with their attempts."""
    rule = Q(status=Delivery.Status.DEAD)

    def step(ids: list[str]) -> None:
        _prune_deliveries(policy, ids, rule, result, "dead", dry_run=dry_run)

    below = policy.id_floor(policy.dead_days)
    return _walk("dead", Delivery, below, budget, step, dry_run=dry_run)


def prunable_deliveries(policy: Policy) -> Q:
    """The deliveries this run removes (for a dry run's count of the events they free)."""
    return Q(
        status=Delivery.Status.DELIVERED, delivered_at__lt=policy.before(policy.retention_days)
    ) | Q(status=Delivery.Status.DEAD, id__lt=policy.id_floor(policy.dead_days))


def settle_events(policy: Policy, ids: list[str], result: Result, *, dry_run: bool) -> None:
    """Of the events `ids`: delete those past RETENTION_DAYS with no delivery left; empty
    the payload of those past PAYLOAD_RETENTION_DAYS with none open, held or dead."""
    any_delivery = Delivery.objects.filter(event_id=OuterRef("pk"))
    if dry_run:  # nothing was deleted: count as if it had been
        any_delivery = any_delivery.exclude(prunable_deliveries(policy))
    keeping = any_delivery.filter(status__in=KEEPS_PAYLOAD)
    # Only ids and EXISTS probes (the delivery event_id index): payloads stay unread.
    gone = Event.objects.filter(id__in=ids, id__lt=policy.id_floor(policy.retention_days)).filter(
        ~Exists(any_delivery)
    )
    strip = Event.objects.filter(
        id__in=ids,
        id__lt=policy.id_floor(policy.payload_days),
        payload_pruned_at__isnull=True,
    ).filter(~Exists(keeping))
    if dry_run:
        result.add("events", gone.count())
        result.add("payloads", strip.exclude(id__in=gone.values("id")).count())
        return
    with transaction.atomic():
        deleted, _ = gone.only("id").delete()
    result.add("events", deleted)
    with transaction.atomic():
        stripped = strip.update(payload=b"", payload_pruned_at=policy.now)
    result.add("payloads", stripped)


def prune_events(policy: Policy, budget: _Budget, result: Result, *, dry_run: bool) -> bool:
    """The walk over events older than PAYLOAD_RETENTION_DAYS (a primary-key range): finds
    what the deliveries' batches did not settle, e.g. events that matched no endpoint, or
    whose open work finished after their deliveries' last look."""

    def step(ids: list[str]) -> None:
        settle_events(policy, ids, result, dry_run=dry_run)

    below = policy.id_floor(policy.payload_days)
    return _walk("events", Event, below, budget, step, dry_run=dry_run)


# The deliveries of a dropped day that stay (the complement of `prunable_deliveries`, as
# SQL over the detached partition): open, held and dead ones still kept, and deliveries
# delivered within RETENTION_DAYS (late ones: their event's day is older than they are).
_KEEP_SQL = (
    "(status <> 'delivered' AND NOT (status = 'dead' AND id < %s))"
    " OR (status = 'delivered' AND (delivered_at IS NULL OR delivered_at >= %s))"
)


def drop_partitions(policy: Policy, result: Result, *, dry_run: bool) -> bool:
    """PostgreSQL: drop the days wholly past RETENTION_DAYS. A dry run leaves this to the
    batches, which count the same rows."""
    if dry_run or not partitions.in_use():
        return True
    dropped = partitions.drop_expired(
        policy.id_floor(policy.retention_days),
        _KEEP_SQL,
        [policy.id_floor(policy.dead_days), policy.before(policy.retention_days)],
    )
    result.add("partition_days", len(dropped))
    return True


def _prune_simple(queryset, name: str, budget: _Budget, result: Result, *, dry_run: bool) -> bool:
    """Small tables whose primary key follows time (autoincrement): the oldest rows are
    first in the key's order, so each batch reads about as many rows as it deletes."""
    if dry_run:
        result.add(name, queryset.count())
        return True
    while True:
        ids = list(
            queryset.order_by("pk").values_list("pk", flat=True)[: settings.RETENTION_BATCH_SIZE]
        )
        if ids:
            with transaction.atomic():
                deleted, _ = queryset.model.objects.filter(pk__in=ids).delete()
            result.add(name, deleted)
        if len(ids) < settings.RETENTION_BATCH_SIZE:
            return True
        if not budget.left():
            return False


def prune(
    *,
    seconds: float | None = None,
    until_done: bool = False,
    rest: bool = True,
    now: datetime | None = None,
    dry_run: bool = False,
) -> Result:
    """One run of at most `seconds` (default RETENTION_SWEEP_SECONDS), or `until_done`.
    A dry run counts what a full run would remove; it should be `until_done`, since it
    removes nothing and a second run would count the same rows again. `rest=False`
    starts the primary-key walks' next pass at once (see WALK_REST_SECONDS)."""
    policy = Policy.from_settings(now)
    limit = settings.RETENTION_SWEEP_SECONDS if seconds is None else seconds
    budget = _Budget(None if until_done else limit, rest=rest)
    result = Result()
    # Whole days first; then deliveries, so their events can go in the same run.
    steps = (
        lambda: drop_partitions(policy, result, dry_run=dry_run),
        lambda: prune_delivered(policy, budget, result, dry_run=dry_run),
        lambda: prune_dead(policy, budget, result, dry_run=dry_run),
        lambda: prune_events(policy, budget, result, dry_run=dry_run),
        lambda: _prune_simple(
            AuditEntry.objects.filter(at__lt=policy.before(policy.audit_days)),
            "audit",
            budget,
            result,
            dry_run=dry_run,
        ),
        lambda: _prune_simple(
            ReplayJob.objects.exclude(state=ReplayJob.State.RUNNING).filter(
                Q(finished_at__lt=policy.before(policy.retention_days))
                | Q(finished_at__isnull=True, created_at__lt=policy.before(policy.retention_days))
            ),
            "replay_jobs",
            budget,
            result,
            dry_run=dry_run,
        ),
    )
    for run in steps:
        if not run():
            result.done = False
    return result


def prune_quietly() -> dict[str, int]:
    """For the sweep: pruning is housekeeping and must never stop the schedule's repair."""
    try:
        result = prune()
    except Exception:
        logger.exception("retention prune failed")
        return {}
    if result.total:
        logger.info(
            "retention pruned %s%s",
            ", ".join(f"{n} {name}" for name, n in result.counts.items() if n),
            "" if result.done else " (more left for the next sweep)",
        )
    return {f"pruned_{name}": n for name, n in result.counts.items()}

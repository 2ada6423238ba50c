"""One run after another: empty the stores, set the scenario up, start real workers,
send the traffic, watch until it is delivered, collect what the receiver saw.

This runs in the child process that `simulate` starts with the simulation's own
DATABASE_URL and REDIS_URL (see simulation/management/commands/simulate.py), so the
platform code it calls (accept, enqueue on commit, the scheduler) uses them unchanged.
"""

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.core.management import call_command
from django.db import connection
from django.test import override_settings

from core.adaptive_modes import ADAPT_ALL, ADAPT_NONE
from core.redis_cost import NOT_MEASURED, ServerWork, per_delivery, server_work
from delivery.models import Attempt
from delivery.pipeline.engine import UNRECORDED_AHEAD
from delivery.scheduler import Scheduler, ShardedScheduler, get_scheduler, reset_scheduler
from simulation.environment import RedisDatabase, Workers, child_env, schedule_env
from simulation.receiver import Receiver
from simulation.report import SPLIT, Observed, summarize
from simulation.scenarios import BUILDERS, RunSpec, Setup
from simulation.traffic import Publisher
from tenants.models import Tenant
from webhooks.models import Event, Source

MARKER_SOURCE = "simulate-marker"  # a database holding this source is the simulation's
POLL_SECONDS = 0.25
# No delivery for this long while work waits: the workers are broken, not slow. Stop
# with their log rather than wait for --timeout (every scenario delivers every second).
STALL_SECONDS = 60


def prepare_database() -> None:
    """Migrate, and refuse a database that holds someone else's tenants or events."""
    call_command("migrate", verbosity=0)
    ours = Source.objects.filter(slug=MARKER_SOURCE).exists()
    if not ours and (Tenant.objects.exists() or Event.objects.exists()):
        raise RuntimeError(
            f"{connection.settings_dict['NAME']} holds tenants or events the simulation did "
            "not create; refusing to empty it. Use an empty database."
        )


def _empty_database() -> None:
    call_command("flush", interactive=False, verbosity=0)
    Source.objects.create(slug=MARKER_SOURCE, name="simulation marker", is_active=False)


class Progress:
    """One live line (redrawn on a terminal, a line every 5 s otherwise)."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.tty = sys.stdout.isatty()
        self.last_print = 0.0
        self.last = (time.monotonic(), 0)
        self.rate = 0.0

    def show(
        self, elapsed: float, published: int, planned: int, ok: int, expected: int, extra: str
    ) -> None:
        now = time.monotonic()
        if now - self.last[0] >= 1.0:
            self.rate = (ok - self.last[1]) / (now - self.last[0])
            self.last = (now, ok)
        if not self.tty and now - self.last_print < 5:
            return
        self.last_print = now
        line = (
            f"[{self.label}] {elapsed:6.1f}s  sent {published}/{planned}  "
            f"delivered {ok}/{expected} ({self.rate:.0f}/s)  {extra}"
        )
        sys.stdout.write(f"\r{line:<110}" if self.tty else line + "\n")
        sys.stdout.flush()

    def end(self) -> None:
        if self.tty:
            sys.stdout.write("\n")


def execute(
    scenario: str,
    spec: RunSpec,
    options: dict[str, Any],
    receiver: Receiver,
    redis_db: RedisDatabase,
    database_url: str,
    workdir: Path,
    title: str = "",
) -> dict[str, Any]:
    """One run of `scenario` as `spec`; returns report.summarize's figures. `title`
    names it on the progress line (default: its label)."""
    with override_settings(
        SCHEDULER_MODE=spec.mode,
        SCHEDULER_SHARDS=spec.shards,
        DELIVERY_ADAPTIVE_CONCURRENCY=adaptive_setting(spec),
    ):
        reset_scheduler()  # the publisher's enqueue must use the workers' mode and shards
        _empty_database()
        redis_db.flush()
        if options.get("scheduler_redis_url"):
            claim_schedule(get_scheduler())
        get_scheduler().start_epoch()  # else the sweeper takes the empty db for a lost schedule
        receiver.reset()
        setup = BUILDERS[scenario](spec, receiver, options)
        env = child_env(
            database_url, redis_db.url, workdir, **worker_settings(spec, options, setup)
        )
        workers = Workers(options["workers"], env, workdir, spec.label)
        try:
            workers.wait_registered(redis_db.client)
            before = server_work(redis_db.client)
            result = _drive(scenario, spec, setup, options, receiver, redis_db, workers, title)
            result.update(_redis_cost(before, redis_db, options, result["delivered"]))
            return result
        finally:
            workers.stop()
            reset_scheduler()


def _redis_cost(
    before: ServerWork, redis_db: RedisDatabase, options: dict[str, Any], delivered: int
) -> dict[str, float | None]:
    """The Redis server's CPU and commands per delivery over the run: everything the
    workers, RQ and the publisher sent it (other clients of a shared server too: a
    private --redis-url makes it the platform's alone). None when the schedule lives on
    another server (--scheduler-redis-url), which this reading would miss."""
    if options.get("scheduler_redis_url"):
        return dict(NOT_MEASURED)
    return per_delivery(before, server_work(redis_db.client), delivered)


def claim_schedule(scheduler: Scheduler | ShardedScheduler) -> None:
    """Empty the run's schedule on --scheduler-redis-url, a Redis the simulation does not
    own: only its own shards' keys, and only a shard the simulation wrote before (its
    marker) or that holds nothing; else refuse rather than delete somebody's schedule."""
    shards = scheduler.shards if isinstance(scheduler, ShardedScheduler) else [scheduler]
    for shard in shards:
        marker = f"wh-simulate:{{{shard.shard}}}"  # the shard's hash tag: its slot
        held = shard.connection.exists(shard.keys.stats, shard.keys.epoch, shard.keys.vt)
        if held and not shard.connection.exists(marker):
            raise RuntimeError(
                f"the schedule Redis holds a schedule under {shard.keys.prefix} that the "
                "simulation did not write; refusing to clear it"
            )
        shard.connection.set(marker, "1")
        shard.clear()


def adaptive_setting(spec: RunSpec) -> str:
    """A run's DELIVERY_ADAPTIVE_CONCURRENCY: every endpoint's limit adapts, or none does
    (what each scenario's endpoints are for is stated by its builder, cap or none)."""
    return ADAPT_ALL if spec.adaptive else ADAPT_NONE


def worker_settings(spec: RunSpec, options: dict[str, Any], setup: Setup) -> dict[str, str]:
    """The settings a run's workers get on top of the simulation's stores: the same
    mode and shards as the publisher in this process, else they would pick from keys
    nobody enqueues to."""
    return {
        "SCHEDULER_MODE": spec.mode,
        "SCHEDULER_SHARDS": str(spec.shards),
        "DELIVERY_ADAPTIVE_CONCURRENCY": adaptive_setting(spec),
        "DELIVERY_CONCURRENCY": str(options["slots"]),
        **schedule_env(options),
        **setup.worker_env,
    }


def _drive(
    scenario: str,
    spec: RunSpec,
    setup: Setup,
    options: dict[str, Any],
    receiver: Receiver,
    redis_db: RedisDatabase,
    workers: Workers,
    title: str,
) -> dict[str, Any]:
    publisher = Publisher(setup.plan)
    progress = Progress(title or spec.label)
    sample = _sampler(setup)
    hung_max, outage_set, timed_out = 0, False, False
    # The engine leases at most its concurrency + UNRECORDED_AHEAD per worker; at that
    # bound its feeder waits for its recorder (the database write), whatever is queued.
    lease_limit = (options["slots"] + UNRECORDED_AHEAD) * options["workers"]
    backlogged = at_limit = 0
    progress_at, last_ok = time.monotonic(), 0
    changes = list(setup.capacity_changes)
    changed_at: list[tuple[float, int]] = []  # when each capacity change was made
    if changes:
        receiver.set_capacity(changes.pop(0)[1])
    publisher.start()
    if setup.capacity_changes:
        changed_at.append((0.0, setup.capacity_changes[0][1]))
    try:
        while True:
            time.sleep(POLL_SECONDS)
            elapsed = time.time() - publisher.started_at
            workers.check_alive()
            redis_db.keep_alive()
            if publisher.error is not None:
                raise RuntimeError("publishing failed") from publisher.error
            if setup.outage and not outage_set and elapsed >= setup.outage[0]:
                receiver.down_until(
                    publisher.started_at + setup.outage[1], retry_after=options["retry_after"]
                )
                outage_set = True
            while changes and elapsed >= changes[0][0]:
                receiver.set_capacity(changes[0][1])
                changed_at.append((round(time.time() - publisher.started_at, 3), changes[0][1]))
                changes.pop(0)
            stats = receiver.stats()
            ok = stats["statuses"].get("200", 0)
            hung, in_flight, backlog, extra = sample()
            hung_max = max(hung_max, hung)
            if backlog and not setup.hung_endpoints:
                backlogged += 1
                at_limit += in_flight >= lease_limit
            progress.show(elapsed, publisher.published, len(setup.plan), ok, setup.expected, extra)
            if publisher.done and ok >= setup.expected:
                break
            if setup.stop_after is not None and elapsed >= setup.stop_after:
                break  # the measured window is over; what is queued stays queued
            if ok != last_ok:
                progress_at, last_ok = time.monotonic(), ok
            elif time.monotonic() - progress_at > STALL_SECONDS:
                raise RuntimeError(
                    f"nothing delivered for {STALL_SECONDS} s; a worker's log ends with:\n"
                    + workers.log_tail()
                )
            if elapsed > options["timeout"]:
                timed_out = True
                break
    finally:
        publisher.stop()
        progress.end()
    time.sleep(0.5)  # a last duplicate or two may still be on its way
    stats = receiver.stats()
    split = [event for event, seen in publisher.accepted.items() if seen.group in SPLIT]
    return summarize(
        Observed(
            scenario=scenario,
            label=spec.label,
            started_at=publisher.started_at,
            accepted=publisher.accepted,
            records=receiver.records(),
            hung_in_flight_max=hung_max,
            lease_limit_share=round(at_limit / backlogged, 2) if backlogged else None,
            receiver_open_max=stats["open_max"],
            outage=setup.outage,
            capacity_changes=changed_at,
            bounds=setup.bounds,
            timed_out=timed_out,
            sent_at=_sent_at(split),
        )
    )


def _sent_at(event_ids: list[str]) -> dict[str, float]:
    """When the successful POST of each event began, from the workers' Attempt rows."""
    found: dict[str, float] = {}
    for start in range(0, len(event_ids), 500):
        rows = Attempt.objects.filter(
            outcome=Attempt.Outcome.DELIVERED, delivery__event_id__in=event_ids[start : start + 500]
        ).values_list("delivery__event_id", "started_at")
        found.update((event_id, started.timestamp()) for event_id, started in rows)
    return found


def _sampler(setup: Setup) -> Callable[[], tuple[int, int, int, str]]:
    """Reads the schedule: (slots the hung endpoints hold, i.e. their leases; leases in
    all; deliveries queued; the live line's text)."""
    scheduler = get_scheduler()
    watched = set(setup.hung_endpoints)

    def sample() -> tuple[int, int, int, str]:
        # Every endpoint, not just the top few: a hung one must not hide behind busier ones.
        snap = scheduler.snapshot(top_n=1000 if watched else 0, age_buckets=())
        backlog = snap.fresh_depth + snap.retry_depth
        extra = f"queued {backlog}  delayed {snap.delayed_depth}  in flight {snap.in_flight}"
        if not watched:
            return 0, snap.in_flight, backlog, extra
        hung = sum(row.in_flight for row in snap.endpoints if row.endpoint_id in watched)
        return hung, snap.in_flight, backlog, extra + f"  hung hold {hung}"

    return sample

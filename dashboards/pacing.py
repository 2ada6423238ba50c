"""Why a tenant's events wait, in words and with its own numbers. Pure: no database, no
Redis, no clock (a Snapshot is plain data); dashboards.status gathers the facts, judges
the steady reasons over a window, and is what every surface calls.

A tenant whose events are paced on purpose, with nothing saying why, opens an incident.
So every status here comes with a plain explanation a customer can read, and the same
status (a short label) is what operators see in the admin overview.
"""

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, tzinfo
from enum import StrEnum

from django.contrib.humanize.templatetags.humanize import intcomma, intword
from django.template.defaultfilters import pluralize

from delivery.scheduler import EndpointRow, Snapshot


class Status(StrEnum):
    """Ordered by precedence: the first that applies explains the wait best."""

    PAUSED = "paused"
    DISABLED = "disabled"
    ENDPOINT_WAIT = "endpoint_wait"
    FAILING = "failing"
    AT_CAP = "at_cap"
    RATE_LIMITED = "rate_limited"
    PACED = "paced"
    ON_PACE = "on_pace"


STATUS_LABELS = {
    Status.PAUSED: "tenant paused",
    Status.DISABLED: "endpoint disabled (held)",
    Status.ENDPOINT_WAIT: "endpoint asked us to wait (Retry-After)",
    Status.FAILING: "endpoint failing (retrying)",
    Status.AT_CAP: "endpoint at its concurrency cap",
    Status.RATE_LIMITED: "at its delivery rate limit",
    Status.PACED: "paced",
    Status.ON_PACE: "on pace",
}

# A tenant delivering at this fraction of its rate limit (or more) is held back by it,
# whatever the snapshot's momentary token state says.
AT_RATE_FRACTION = 0.8

# Below this backlog age a tenant that shares turns is not "paced" in any way a customer
# would notice: one lap of the scheduler is well under it. Above it, we explain.
PACED_AFTER_SECONDS = 10.0
RECEIVED_WINDOW_MINUTES = 10


@dataclass(frozen=True)
class EndpointFacts:
    """One endpoint the tenant's events go to, as the scheduler and the database see it."""

    label: str  # what the tenant may read: its own URL, or "the shared destination"
    enabled: bool = True
    in_flight: int = 0
    max_in_flight: int = 0
    # Requests it may have open at once now: its cap, or its adaptive limit under it
    # (0: the schedule holds nothing of it, so its cap)
    limit: int = 0
    adaptive: bool = False  # the limit adapts to how it answers (DELIVERY_ADAPTIVE_CONCURRENCY)
    parked_lanes: int = 0  # lanes waiting for a free slot: the cap is what holds them
    consecutive_failures: int = 0
    held: int = 0  # this tenant's deliveries kept while the endpoint is disabled
    disabled_reason: str = ""
    failing_since: datetime | None = None
    last_error: str = ""  # e.g. "HTTP 503" or "timed out"
    next_retry_at: datetime | None = None  # the next retry still to fall due
    retries_due: int = 0  # retries whose time has come, waiting for a turn and a slot
    rate_per_second: float | None = None  # its rate limit; None = none
    paused_until: datetime | None = None  # from its Retry-After
    rate_limited: bool = False  # no request may start now: no token ready, or paused

    @property
    def waiting_for_retry_after(self) -> bool:
        return self.enabled and self.paused_until is not None and self.parked_lanes > 0

    @property
    def at_rate(self) -> bool:
        """Its rate limit is what holds work back: no token now, and work parked on it."""
        return (
            self.enabled
            and self.rate_per_second is not None
            and self.rate_limited
            and self.paused_until is None
            and self.parked_lanes > 0
        )

    @property
    def in_flight_limit(self) -> int:
        return self.limit or self.max_in_flight

    @property
    def at_cap(self) -> bool:
        """Full (at its cap or its adaptive limit), and work is parked behind it (a
        momentarily full endpoint with nothing waiting holds nobody up)."""
        return (
            self.enabled
            and self.in_flight_limit > 0
            and self.in_flight >= self.in_flight_limit
            and self.parked_lanes > 0
        )

    @property
    def failing(self) -> bool:
        return self.enabled and self.consecutive_failures > 0


@dataclass(frozen=True)
class TenantFacts:
    weight: int = 1
    paused: bool = False
    fresh: int = 0
    retry: int = 0
    delayed: int = 0  # retries waiting for their due time
    in_flight: int = 0
    held: int = 0
    oldest_age_seconds: float = 0.0
    delivered_last_minute: int = 0
    # The current pace, when the caller knows better than the last minute's average (see
    # `recent_rate`); None: delivered_last_minute / 60.
    rate_per_second: float | None = None
    received_recently: int = 0  # events accepted in the last RECEIVED_WINDOW_MINUTES
    dead: int = 0  # deliveries that exhausted their retries (kept, replayable)
    endpoints: tuple[EndpointFacts, ...] = ()
    rate_limit_per_second: float | None = None  # its delivery rate; None = unlimited
    rate_limited: bool = False  # the scheduler found no token for it just now

    @property
    def at_rate_limit(self) -> bool:
        """Queued work, and its own delivery rate is what sets the pace."""
        limit = self.rate_limit_per_second
        if self.queued == 0 or limit is None:
            return False
        return self.rate_limited or self.rate >= AT_RATE_FRACTION * limit

    @property
    def rate(self) -> float:
        if self.rate_per_second is not None:
            return self.rate_per_second
        return self.delivered_last_minute / 60

    @property
    def queued(self) -> int:
        return self.fresh + self.retry

    @property
    def waiting(self) -> int:
        """Everything not delivered yet: queued, in flight, due later or held."""
        return self.fresh + self.retry + self.delayed + self.in_flight + self.held


@dataclass(frozen=True)
class PlatformFacts:
    """What is true of everyone else, as counts only: a tenant never sees who."""

    backlogged_tenants: int = 0  # tenants with queued work, this one included if it has some
    backlogged_weight: int = 0  # their summed weights (paused ones left out)


@dataclass(frozen=True)
class Pacing:
    status: Status
    label: str  # the operator's one-liner, e.g. "paced (sharing turns with 3 other ...)"
    headline: str  # the tenant's one-liner
    explanation: str  # the tenant's paragraph, with their numbers
    share_of_turns: float  # weight / summed weights of backlogged tenants
    other_backlogged: int
    rate_per_second: float
    drain_seconds: float | None  # None: nothing to drain, or no rate to estimate from
    clears_at: datetime | None
    reasons: list[Status] = field(default_factory=list)  # every status that applies


def platform_facts(snapshot: Snapshot | None) -> PlatformFacts:
    """Backlogged tenants that take turns (paused ones don't) and their summed weight,
    from a scheduler snapshot (plain data). Tenants beyond its top-N count at weight 1:
    an estimate. No snapshot (Redis away): nobody is known to be waiting."""
    if snapshot is None:
        return PlatformFacts()
    paused = sum(1 for row in snapshot.tenants if row.paused)
    unseen = max(0, snapshot.backlogged_tenants - len(snapshot.tenants))
    return PlatformFacts(
        backlogged_tenants=snapshot.backlogged_tenants - paused,
        backlogged_weight=sum(row.weight for row in snapshot.tenants if not row.paused) + unseen,
    )


RECENT_WINDOW_SECONDS = 15
RECENT_ENOUGH = 30  # deliveries in the short window for its rate to be more than noise


def recent_rate(last_minute: int, last_window: int) -> float:
    """Deliveries per second now. The last minute's average lags: a flood that started 10 s
    ago would look six times slower than it is, and a tenant whose share just halved
    would look twice as fast. So the last RECENT_WINDOW_SECONDS count when they hold
    enough deliveries to mean something."""
    if last_window >= RECENT_ENOUGH:
        return last_window / RECENT_WINDOW_SECONDS
    return last_minute / 60


def share_of_turns(facts: TenantFacts, platform: PlatformFacts) -> float:
    """The fraction of turns this tenant gets while everyone backlogged stays backlogged.
    A tenant without a backlog is counted as if it joined: what it would get now."""
    if facts.paused:
        return 0.0
    total = platform.backlogged_weight + (0 if facts.queued else facts.weight)
    return min(1.0, facts.weight / total) if total > 0 else 1.0


def drain_seconds(facts: TenantFacts) -> float | None:
    """Queued and in-flight work over the recent delivery rate. Delayed retries are left
    out (they wait for a due time, not a turn), and so is held work (nothing moves it)."""
    remaining = facts.queued + facts.in_flight
    rate = facts.rate
    if remaining == 0 or rate <= 0 or facts.paused:
        return None
    return remaining / rate


def _other_backlogged(facts: TenantFacts, platform: PlatformFacts) -> int:
    """Backlogged tenants besides this one."""
    return max(0, platform.backlogged_tenants - (1 if facts.queued else 0))


def _is_paused(facts: TenantFacts, platform: PlatformFacts) -> bool:
    return facts.paused


def _is_disabled(facts: TenantFacts, platform: PlatformFacts) -> bool:
    # Held work with no endpoint facts still names the status: the endpoint is just unnamed.
    held_by_one = any(not e.enabled and e.held > 0 for e in facts.endpoints)
    return held_by_one or (facts.held > 0 and not facts.endpoints)


def _is_endpoint_wait(facts: TenantFacts, platform: PlatformFacts) -> bool:
    return facts.queued > 0 and any(e.waiting_for_retry_after for e in facts.endpoints)


def _is_failing(facts: TenantFacts, platform: PlatformFacts) -> bool:
    return facts.retry + facts.delayed > 0 and any(e.failing for e in facts.endpoints)


def _is_at_cap(facts: TenantFacts, platform: PlatformFacts) -> bool:
    return facts.queued > 0 and any(e.at_cap for e in facts.endpoints)


def _is_rate_limited(facts: TenantFacts, platform: PlatformFacts) -> bool:
    return facts.at_rate_limit or (facts.queued > 0 and any(e.at_rate for e in facts.endpoints))


def _is_paced(facts: TenantFacts, platform: PlatformFacts) -> bool:
    return (
        facts.queued > 0
        and _other_backlogged(facts, platform) > 0
        and facts.oldest_age_seconds >= PACED_AFTER_SECONDS
    )


def _is_on_pace(facts: TenantFacts, platform: PlatformFacts) -> bool:
    return True  # the last word: always applies, so a status is always found


# When each status applies; `reasons` asks in Status's order, the order of precedence.
_APPLIES: dict[Status, Callable[[TenantFacts, PlatformFacts], bool]] = {
    Status.PAUSED: _is_paused,
    Status.DISABLED: _is_disabled,
    Status.ENDPOINT_WAIT: _is_endpoint_wait,
    Status.FAILING: _is_failing,
    Status.AT_CAP: _is_at_cap,
    Status.RATE_LIMITED: _is_rate_limited,
    Status.PACED: _is_paced,
    Status.ON_PACE: _is_on_pace,
}


def reasons(facts: TenantFacts, platform: PlatformFacts) -> list[Status]:
    """Every status that applies this instant, by precedence; ON_PACE always comes last."""
    return [status for status in Status if _APPLIES[status](facts, platform)]


def assess(
    facts: TenantFacts,
    platform: PlatformFacts,
    *,
    now: datetime,
    tz: tzinfo | None = None,
    found: list[Status] | None = None,
) -> Pacing:
    """The status that explains the wait best, and the tenant's explanation of it.
    `found`: the reasons as judged over a window (dashboards.status); by default the
    facts' own, this instant."""
    if found is None:
        found = reasons(facts, platform)
    status = found[0]
    share = share_of_turns(facts, platform)
    others = _other_backlogged(facts, platform)
    drain = drain_seconds(facts)
    clears_at = now + timedelta(seconds=drain) if drain is not None else None
    label = STATUS_LABELS[status]
    if status is Status.PACED:
        label = f"paced (sharing turns with {count_phrase(others, 'other backlogged tenant')})"
    headline, explanation = _explain(status, facts, share, others, drain, clears_at, now, tz)
    return Pacing(
        status=status,
        label=label,
        headline=headline,
        explanation=explanation,
        share_of_turns=share,
        other_backlogged=others,
        rate_per_second=facts.rate,
        drain_seconds=drain,
        clears_at=clears_at,
        reasons=found[:-1] if len(found) > 1 else found,
    )


@dataclass(frozen=True)
class _Said:
    """What an explanation may quote, each phrase formatted once for every status."""

    facts: TenantFacts
    share: float
    others: int
    rate: str  # the current pace, e.g. "1,400 per second"
    clears: str  # when the backlog should clear
    safe: str  # "Nothing is lost." or what ran out of retries
    now: datetime
    tz: tzinfo | None

    def clock(self, when: datetime) -> str:
        return clock(when, self.now, self.tz)

    @property
    def pace(self) -> str:
        """How fast the events go out, as the words after "go out": never "at about no
        deliveries" when nothing went out."""
        if self.facts.rate > 0:
            return f"at about {self.rate}"
        return "slowly: none went out in the last minute"


def _explain(
    status: Status,
    facts: TenantFacts,
    share: float,
    others: int,
    drain: float | None,
    clears_at: datetime | None,
    now: datetime,
    tz: tzinfo | None,
) -> tuple[str, str]:
    said = _Said(
        facts=facts,
        share=share,
        others=others,
        rate=rate_phrase(facts.rate),
        clears=_clears_phrase(drain, clears_at, now, tz),
        safe=_safe_phrase(facts),
        now=now,
        tz=tz,
    )
    return _WORDS[status](said)


# --- the tenant's words, (headline, explanation), one function per status ---------------


def _say_paused(said: _Said) -> tuple[str, str]:
    return (
        "Delivery is paused",
        f"Delivery of your events is paused by our operators. "
        f"{count_phrase(said.facts.waiting, 'event')} waiting; they go out in order "
        f"when delivery resumes. {said.safe}",
    )


def _say_disabled(said: _Said) -> tuple[str, str]:
    facts = said.facts
    disabled = next((e for e in facts.endpoints if not e.enabled and e.held > 0), None)
    if disabled is None:  # held work without endpoint facts: say so without a name
        held, name, why = facts.held, "An endpoint of yours", ""
    else:
        held, name = disabled.held, f"Your endpoint {disabled.label}"
        why = f" ({disabled.disabled_reason.rstrip('.')})" if disabled.disabled_reason else ""
    return (
        "An endpoint is disabled",
        f"{name} is disabled{why}. {count_phrase(held, 'event')} for it "
        f"{'is' if held == 1 else 'are'} held and will be delivered in order "
        f"once it is re-enabled. {said.safe}",
    )


def _say_endpoint_wait(said: _Said) -> tuple[str, str]:
    queued = said.facts.queued
    endpoint = next(e for e in said.facts.endpoints if e.waiting_for_retry_after)
    return (
        "Your endpoint asked us to wait",
        f"Your endpoint {endpoint.label} answered with Retry-After, so we send it nothing "
        f"until {said.clock(endpoint.paused_until)} instead of retrying sooner. "
        f"{count_phrase(queued, 'event')} "
        f"{'waits' if queued == 1 else 'wait'} and go out in order from then. {said.safe}",
    )


def _say_failing(said: _Said) -> tuple[str, str]:
    endpoint = next(e for e in said.facts.endpoints if e.failing)
    since = f" since {said.clock(endpoint.failing_since)}" if endpoint.failing_since else ""
    last = f" (last: {endpoint.last_error})" if endpoint.last_error else ""
    if endpoint.retries_due:
        due = endpoint.retries_due
        next_retry = (
            f" {human_count(due)} {'retry is' if due == 1 else 'retries are'} due now and "
            f"go out in your turns as the endpoint's slots free."
        )
    elif endpoint.next_retry_at:
        next_retry = f" The next retry is due at {said.clock(endpoint.next_retry_at)}."
    else:
        next_retry = ""
    going_out = (
        "New events keep going out as your endpoint accepts them."
        if said.facts.delivered_last_minute
        else "Nothing was delivered in the last minute."
    )
    return (
        "An endpoint is failing; we are retrying",
        f"Your endpoint {endpoint.label} has failed "
        f"{count_phrase(endpoint.consecutive_failures, 'time')} in a row{since}{last}. "
        f"We retry failed deliveries on a schedule that backs off, and retries take a "
        f"smaller share of turns so a recovering endpoint is not swamped."
        f"{next_retry} {going_out} {said.safe}",
    )


def _say_at_cap(said: _Said) -> tuple[str, str]:
    # Judged over a window: this instant its slots may happen to be free.
    endpoint = next((e for e in said.facts.endpoints if e.at_cap), None) or busiest(said.facts)
    if endpoint.adaptive and endpoint.in_flight_limit < endpoint.max_in_flight:
        return (
            "Your endpoint is at the pace it can take",
            f"Your endpoint {endpoint.label} takes "
            f"{count_phrase(endpoint.in_flight_limit, 'request')} at a time for now: a limit "
            f"we find from how it answers (under its cap of {endpoint.max_in_flight}), "
            f"lowered when its answers slow down or it says it is overloaded, raised while "
            f"they stay fast. The rest of your events wait for a free slot instead of "
            f"overloading it. They go out {said.pace}; {said.clears}. {said.safe}",
        )
    return (
        "Your endpoint is at its concurrency limit",
        f"Your endpoint {endpoint.label} takes at most "
        f"{count_phrase(endpoint.max_in_flight, 'request')} at a time, and all of them "
        f"have been in use most of the time, so the rest of your events wait for a free slot "
        f"instead of overloading it. They go out {said.pace}; {said.clears}. "
        f"{said.safe} If your endpoint can take more, ask us to raise its limit.",
    )


def _say_rate_limited(said: _Said) -> tuple[str, str]:
    facts = said.facts
    if facts.at_rate_limit:
        limit = rate_phrase(facts.rate_limit_per_second or 0)
        return (
            "Your delivery rate limit paces your events",
            f"Your plan delivers at most {limit} for you, over all your endpoints, so your "
            f"events go out at that pace even when we have spare capacity (it is your rate "
            f"limit, not other tenants, that sets it); they go out {said.pace}; "
            f"{said.clears}. {said.safe} To go faster, ask us about a higher rate.",
        )
    endpoint = next((e for e in facts.endpoints if e.at_rate), None) or next(
        (e for e in facts.endpoints if e.rate_per_second), busiest(facts)
    )
    return (
        "Your endpoint's rate limit paces your events",
        f"Your endpoint {endpoint.label} is limited to "
        f"{rate_phrase(endpoint.rate_per_second or 0)}, so events for it go out at that pace "
        f"({said.pace}); {said.clears}. {said.safe} If your endpoint can take more, "
        f"ask us to raise its rate limit.",
    )


def _say_paced(said: _Said) -> tuple[str, str]:
    facts, others, share = said.facts, said.others, said.share
    sent = (
        f"You sent {count_phrase(facts.received_recently, 'event')} in the last "
        f"{RECEIVED_WINDOW_MINUTES} minutes. "
        if facts.received_recently
        else f"You have {count_phrase(facts.queued, 'event')} waiting. "
    )
    weight = (
        f"your weight of {facts.weight} gives you {percent(share)} of the turns"
        if facts.weight > 1
        else f"you get {percent(share)} of the turns"
    )
    return (
        "Your events are being paced",
        f"{sent}We deliver every tenant's events in turn ({count_phrase(others, 'other tenant')} "
        f"{'has' if others == 1 else 'have'} events waiting too; {weight}), "
        f"so yours go out {said.pace}; {said.clears}. {said.safe}",
    )


def _say_on_pace(said: _Said) -> tuple[str, str]:
    moving = said.facts.queued + said.facts.in_flight
    if moving == 0:
        return (
            "On pace",
            "Nothing is waiting: your events are delivered as they arrive.",
        )
    return (
        "On pace",
        f"Your events go out as fast as your endpoints take them, {said.pace}; "
        f"{count_phrase(moving, 'event')} "
        f"{'is' if moving == 1 else 'are'} on the way and {said.clears}.",
    )


_WORDS: dict[Status, Callable[[_Said], tuple[str, str]]] = {
    Status.PAUSED: _say_paused,
    Status.DISABLED: _say_disabled,
    Status.ENDPOINT_WAIT: _say_endpoint_wait,
    Status.FAILING: _say_failing,
    Status.AT_CAP: _say_at_cap,
    Status.RATE_LIMITED: _say_rate_limited,
    Status.PACED: _say_paced,
    Status.ON_PACE: _say_on_pace,
}


def _safe_phrase(facts: TenantFacts) -> str:
    """ "Nothing is lost" only when it is true: dead letters are kept, but they were not
    delivered, and the tenant must hear about them."""
    if facts.dead == 0:
        return "Nothing is lost."
    one = facts.dead == 1
    return (
        f"{count_phrase(facts.dead, 'event')} ran out of retries and {'is' if one else 'are'} "
        f"kept as {'a dead letter' if one else 'dead letters'}, ready to be sent again; "
        f"nothing else is lost."
    )


def busiest(facts: TenantFacts) -> EndpointFacts:
    """The endpoint with the fullest slots (facts that name a cap have at least one)."""
    return max(
        facts.endpoints,
        key=lambda e: (e.in_flight / e.max_in_flight if e.max_in_flight else 0, e.parked_lanes),
        default=EndpointFacts(label="an endpoint"),
    )


def live_endpoint_fields(row: EndpointRow | None) -> dict:
    """The EndpointFacts fields a scheduler snapshot knows (in flight, parked lanes, its
    rate and pause); empty when the endpoint is not in the snapshot."""
    if row is None:
        return {}
    paused = row.paused_until
    return {
        "in_flight": row.in_flight,
        "limit": row.in_flight_limit,
        "adaptive": row.adaptive_limit is not None,
        "parked_lanes": row.parked_lanes,
        "rate_per_second": row.rate_per_second,
        "paused_until": datetime.fromtimestamp(paused, UTC) if paused else None,
        "rate_limited": row.rate_limited,
    }


def _clears_phrase(
    drain: float | None, clears_at: datetime | None, now: datetime, tz: tzinfo | None
) -> str:
    if drain is None or clears_at is None:
        return "we will estimate when the backlog clears once deliveries are flowing"
    if drain < 60:
        return "the backlog should clear within a minute"
    return f"the backlog should clear around {clock(clears_at, now, tz)}"


# --- numbers people read -------------------------------------------------------------


def human_count(n: float) -> str:
    """2,140,000 -> "2.1 million"; 14,230 -> "14,230"; 7 -> "7" (django.contrib.humanize)."""
    n = round(n)
    return str(intword(n)) if abs(n) >= 1_000_000 else intcomma(n)


def count_phrase(n: float, noun: str) -> str:
    """ "1 event", "2.1 million events"."""
    return f"{human_count(n)} {noun}{pluralize(round(n))}"


def _two_significant(x: float) -> float:
    if x >= 100:
        digits = len(str(int(x))) - 2
        return round(x, -digits)
    return round(x, 1) if x < 10 else round(x)


def rate_phrase(per_second: float) -> str:
    """1,412/s -> "1,400 per second"; 0.5/s -> "30 per minute"."""
    if per_second <= 0:
        return "no deliveries in the last minute"
    if per_second >= 1:
        value = _two_significant(per_second)
        text = f"{value:,.0f}" if value >= 10 else f"{value:g}"
        return f"{text} per second"
    per_minute = per_second * 60
    value = _two_significant(per_minute)
    text = f"{value:,.0f}" if value >= 10 else f"{value:g}"
    return f"{text} per minute"


def percent(fraction: float) -> str:
    value = fraction * 100
    if value >= 10 or value == 0:
        return f"{value:.0f}%"
    return f"{value:.1f}%".replace(".0%", "%")


def duration(seconds: float) -> str:
    """A short human duration: "45 s", "12 min", "3 h 20 min", "2 d 4 h"."""
    seconds = max(0.0, seconds)
    if seconds < 90:
        return f"{seconds:.0f} s"
    minutes = seconds / 60
    if minutes < 90:
        return f"{minutes:.0f} min"
    hours, rest = divmod(int(minutes), 60)
    if hours < 48:
        return f"{hours} h {rest} min" if rest else f"{hours} h"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h" if hours else f"{days} d"


def clock(when: datetime, now: datetime, tz: tzinfo | None = None) -> str:
    """ "14:20 UTC" on the same day as `now`, "3 Mar, 14:20 UTC" on another."""
    local = when.astimezone(tz) if tz else when
    local_now = now.astimezone(tz) if tz else now
    zone = local.tzname() or ""
    suffix = f" {zone}" if zone else ""
    if local.date() == local_now.date():
        return f"{local:%H:%M}{suffix}"
    return f"{local.day} {local:%b}, {local:%H:%M}{suffix}"

"""The values that cross the scheduler's face. Plain data: no Redis in here."""

import math
from dataclasses import dataclass, field

FRESH = "fresh"
RETRY = "retry"


@dataclass(frozen=True)
class Item:
    """One delivery to put in the schedule. Weight and caps ride along on purpose: the
    database is the source of truth, so each enqueue refreshes what Redis knows."""

    delivery_id: str  # a 26-char ULID; its first 10 chars are the enqueue time in ms
    tenant_id: int | None  # None = the fallback lane (the event had no tenant key)
    endpoint_id: int
    weight: int = 1
    max_in_flight: int = 2
    retry_max_in_flight: int = 1
    lane: str = FRESH
    due_at: float | None = None  # epoch seconds; later than now = delayed until then
    # Requests per second (None = unlimited): a rate bounds how many requests start per
    # second, where the caps above bound how many are open at once. See Scheduler.
    endpoint_rate: float | None = None
    tenant_rate: float | None = None
    # The endpoint's in-flight limit adapts between 1 and max_in_flight to how it answers
    # (Scheduler.answered's EndpointAnswers); False: max_in_flight, fixed.
    adaptive: bool = False


@dataclass(frozen=True)
class EndpointState:
    """One endpoint's concurrency as the schedule holds it now (Scheduler.endpoint_state).
    The adaptive fields are None unless its limit adapts; `backed_off_at` (epoch seconds)
    is None before its first backoff. `retry_budget`: the retry tokens it holds now, of
    `retry_budget_cap` (a retry takes one; see docs/SCHEDULER.md, "Retry budgets")."""

    in_flight: int
    max_in_flight: int
    retry_budget: float = 0.0
    retry_budget_cap: float = 0.0
    adaptive_limit: float | None = None
    latency_ms: float | None = None
    baseline_ms: float | None = None
    backed_off_at: float | None = None
    backed_off_from: float | None = None  # the limit before that backoff
    # The recent latency that was too slow then; None when an overload answer was why.
    backed_off_latency_ms: float | None = None

    @property
    def in_flight_limit(self) -> int:
        """The requests it may have open at once (see whole_limit)."""
        return whole_limit(self.max_in_flight, self.adaptive_limit)


def whole_limit(max_in_flight: int, adaptive_limit: float | None) -> int:
    """The requests an endpoint may have open at once: its cap, or its adaptive limit's
    whole part under it (lua/lib.lua's in_flight_limit)."""
    if adaptive_limit is None:
        return max_in_flight
    return min(max_in_flight, max(1, math.floor(adaptive_limit)))


# The fields of an adaptive limit and why it last moved, under the same names in
# EndpointState, EndpointRow and the Lua replies both come from (adaptive_values in
# lua/lib.lua).
ADAPTIVE_FIELDS = (
    "adaptive_limit",
    "latency_ms",
    "baseline_ms",
    "backed_off_at",
    "backed_off_from",
    "backed_off_latency_ms",
)


@dataclass(frozen=True)
class EndpointAnswers:
    """What one endpoint's answered requests said, summed over one `answered` call: the
    adaptive in-flight limit's signal. `overloaded` are answers that say the endpoint is
    past its capacity (429, 503, a timeout, a refused or reset connection); `ok` are the
    rest (any other answer), and `latency_ms` their summed durations."""

    endpoint_id: int
    ok: int = 0
    overloaded: int = 0
    latency_ms: float = 0.0


@dataclass(frozen=True)
class Lease:
    """A claim on one in-flight slot until `deadline` (extend it with renew)."""

    delivery_id: str
    tenant_id: int | None
    endpoint_id: int
    lane: str
    deadline: float
    # Tells this hand-out from a later one of the same delivery (after an expiry), so a
    # slow worker's ack can never release the slot of the worker that took over.
    token: str = field(default="", compare=True)


@dataclass(frozen=True)
class PickResult:
    leases: list[Lease]
    wait_seconds: float  # 0: more may be ready now; else how long a worker may sleep


@dataclass(frozen=True)
class TenantRow:
    tenant_id: int | None  # None = the fallback lane
    fresh: int
    retry: int
    delayed: int
    in_flight: int
    oldest_age_seconds: float
    weight: int
    paused: bool
    rate_per_second: float | None = None  # its delivery rate; None = unlimited
    # Its rate is what holds it back right now: no token ready, so it is out of the turn
    # order until the next one is due (the dashboard's "a rate limit is what paces you").
    rate_limited: bool = False


@dataclass(frozen=True)
class EndpointRow:
    endpoint_id: int
    in_flight: int
    max_in_flight: int
    retry_in_flight: int
    retry_max_in_flight: int
    parked_lanes: int  # tenant lanes waiting for a slot (or a token) on this endpoint
    rate_per_second: float | None = None  # None = no rate limit
    paused_until: float | None = None  # epoch seconds, from a Retry-After (pause_endpoint)
    # No request may start now: its rate has no token ready, or it is paused.
    rate_limited: bool = False
    # The adaptive in-flight limit (under max_in_flight; requests open at once are its
    # whole part), None when the endpoint's limit is its cap alone.
    adaptive_limit: float | None = None
    # Retries it may be sent before one more is accepted (whole part; docs/SCHEDULER.md,
    # "Retry budgets"); under one, its queued retries wait for a token.
    retry_budget: float | None = None
    # While its limit adapts: the latencies it moves on and its last backoff, as in
    # EndpointState.
    latency_ms: float | None = None
    baseline_ms: float | None = None
    backed_off_at: float | None = None
    backed_off_from: float | None = None
    backed_off_latency_ms: float | None = None

    @property
    def in_flight_limit(self) -> int:
        """The requests it may have open at once (see whole_limit)."""
        return whole_limit(self.max_in_flight, self.adaptive_limit)


@dataclass(frozen=True)
class Snapshot:
    """One consistent view of the schedule, read in one bounded script."""

    active_tenants: int  # tenants with anything queued, delayed or in flight
    backlogged_tenants: int  # tenants with queued (dispatchable or parked) work
    fresh_depth: int
    retry_depth: int
    delayed_depth: int
    in_flight: int
    fallback_enqueued_total: int
    fallback_depth: int
    deferrals_total: int
    oldest_age_seconds: float  # oldest queued delivery; 0 when nothing is queued
    tenants: list[TenantRow]  # the top-N oldest backlogged tenants, oldest first
    # The top-N endpoints by in-flight leases, then up to N more that are paused or wait
    # for a token (they may have nothing in flight).
    endpoints: list[EndpointRow]
    # Cumulative: bound (seconds) -> tenants whose oldest queued delivery is at most that
    # old; backlogged_tenants is the +Inf bucket. Fair mode only (FIFO keeps no ages).
    age_histogram: dict[float, int]
    # Times a lane parked, or a tenant left the turn order, to wait for a token (its rate
    # or a pause): like deferrals, never an attempt. Deferrals count the caps alone.
    rate_waits_total: int = 0

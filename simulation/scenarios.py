"""The scenarios: who sends what, when, to which endpoints, on how many workers.

Each `build_*` creates the tenants and endpoints of one run in the (just emptied)
database and returns the traffic plan with what the runner needs to know about it.
Sizes default to about a minute's work for a small machine's workers; docs/BENCHMARKS.md
("Simulation") gives the reasoning.
"""

import random
from dataclasses import dataclass, field, replace
from typing import Any

from django.conf import settings

from simulation.receiver import Receiver
from simulation.traffic import Planned, Sender
from tenants.models import Endpoint, Tenant
from webhooks.models import Source

SCENARIOS = ("flood", "slow-endpoints", "retry-storm", "fragile-endpoints")
NO_CAP = 1000  # the most Endpoint.max_in_flight allows: "no cap" for the baselines

# Per-scenario defaults of the knobs the command exposes (None on the command line).
DEFAULTS: dict[str, dict[str, Any]] = {
    "flood": {
        "workers": 2,
        "slots": 16,
        # The loud tenant sends for this long, faster than it drains. FIFO's quiet wait
        # grows with the backlog, hence with this; the fair wait does not (see
        # simulation/calibration.py): 40 s leaves the ratio a margin over its goal.
        "seconds": 40.0,
        # None: sized by simulation.calibration from a probe of this machine's workers,
        # so that the flood overloads them wherever it runs.
        "loud_events": None,
        "quiet_tenants": 200,
        "quiet_events": 3,
        "quiet_seconds": 45.0,  # quiet tenants send during this window from the start
        "cap": 64,  # generous: more than all slots, so the cap never paces the flood
    },
    "slow-endpoints": {
        "workers": 2,
        "slots": 100,  # 200 slots in all, as in the seed's arithmetic
        "seconds": 30.0,
        "endpoints": 200,
        "hung": 40,
        "endpoint_timeout": 3,  # the seed's 30 s, scaled down tenfold
        "rate": 1.0,  # events per second per endpoint
        "cap": 2,  # the platform's default max_in_flight
    },
    "retry-storm": {
        "workers": 2,
        "slots": 32,
        "seconds": 40.0,
        "tenants": 50,  # other tenants, each with its own healthy endpoint
        "rate": 1.0,  # events per second per other tenant
        "storm_rate": 40.0,  # events per second to the large endpoint
        "outage_start": 5.0,
        "outage_seconds": 20.0,
        "service_ms": 20.0,  # the large endpoint's time per request
        "cap": 4,
        "retry_cap": 1,  # the platform's default retry_max_in_flight
        # Backing off to every 4 s: during the outage the retries keep coming, more and
        # more of them, and the last ones are due within seconds of the recovery.
        "retry_schedule": "1,2,4,4,4,4,4,4,4,4,4,4",
    },
    "fragile-endpoints": {
        "workers": 2,
        "slots": 128,  # more than twice the capacity: room for the no-cap run to overload it
        "seconds": 30.0,  # the measured window; the run ends there, drained or not
        "capacity": 50,  # C at the start; it halves after a third, doubles after two
        "service_ms": 250.0,  # at up to C requests at once: capacity C / this per second
        "fragile_rate": 300.0,  # events/s to it: more than it can take at any C
        "tenants": 20,  # quiet tenants sharing the workers, each with its own endpoint
        "rate": 1.0,  # events per second per quiet tenant
        "cap": 4,  # the static run's max_in_flight: a platform default an operator kept
        "retry_cap": 1,  # the platform's default retry_max_in_flight
    },
}


@dataclass(frozen=True)
class RunSpec:
    """One run: `mode` is SCHEDULER_MODE; `caps` False raises every cap to NO_CAP;
    `hang` False makes the hung endpoints answer (the no-hang reference); `shards`
    splits the schedule (on the simulation's one Redis database); `adaptive` turns the
    endpoints' adaptive in-flight limits on."""

    label: str
    mode: str = "fair"
    caps: bool = True
    hang: bool = True
    shards: int = 1  # SCHEDULER_SHARDS of the run's workers and publisher
    adaptive: bool = False  # DELIVERY_ADAPTIVE_CONCURRENCY of the run


@dataclass
class Setup:
    plan: list[Planned]
    expected: int  # successful deliveries that end the run
    worker_env: dict[str, str] = field(default_factory=dict)
    hung_endpoints: list[int] = field(default_factory=list)  # in_flight sampled from Redis
    outage: tuple[float, float] | None = None  # storm: seconds after the start
    # fragile: (seconds after the start, C from then on), the first at 0
    capacity_changes: list[tuple[float, int]] = field(default_factory=list)
    stop_after: float | None = None  # end the run then, whatever is still queued
    bounds: dict[str, float] = field(default_factory=dict)  # caps the report checks against


def runs_for(
    scenario: str,
    scheduler: str,
    no_caps: bool,
    compare: bool,
    shards: int = 1,
    adaptive: bool = False,
) -> list[RunSpec]:
    """The runs of one round. `shards` applies to the fair-mode runs only: FIFO is the
    one-queue baseline of today, and a FIFO per shard would be no FIFO at all.
    `adaptive` to those of them with caps: a no-caps run whose limits adapted would no
    longer be the baseline without limits that it is there to show."""
    if not compare and scenario == "fragile-endpoints" and not no_caps:
        specs = [RunSpec("adaptive", scheduler, adaptive=True)]
    elif not compare:
        label = scheduler + ("+no-caps" if no_caps else "")
        specs = [RunSpec(label, scheduler, caps=not no_caps)]
    elif scenario == "flood":
        specs = [RunSpec("fair"), RunSpec("fifo", "fifo")]
    elif scenario == "slow-endpoints":
        specs = [RunSpec("fair"), RunSpec("no-caps", caps=False), RunSpec("no-hang", hang=False)]
    elif scenario == "fragile-endpoints":
        specs = [
            RunSpec("adaptive", adaptive=True),
            RunSpec("static"),
            RunSpec("no-caps", caps=False),
        ]
    else:
        specs = [RunSpec("fair"), RunSpec("no-caps", caps=False)]
    if adaptive:
        specs = [
            replace(spec, adaptive=True) if spec.mode == "fair" and spec.caps else spec
            for spec in specs
        ]
    return [replace(spec, shards=shards) if spec.mode == "fair" else spec for spec in specs]


def _platform_cap(spec: RunSpec, default: int) -> int | None:
    """The cap of endpoints that keep the platform's default: `default` where limits are
    fixed, none of their own (the platform's ceiling) where they adapt, NO_CAP for the
    no-caps baselines."""
    if not spec.caps:
        return NO_CAP
    return None if spec.adaptive else default


def _tenants(keys: list[str]) -> list[Tenant]:
    return Tenant.objects.bulk_create([Tenant(key=key, name=key) for key in keys])


def _endpoints(
    receiver: Receiver,
    tenants: list[Tenant],
    kinds: list[str],
    cap: int | None,
    retry_cap: int,
    **extra,
) -> list[Endpoint]:
    rows = [
        Endpoint(
            tenant=tenant,
            url=receiver.url(kind, tenant.key, "0"),
            max_in_flight=cap,
            retry_max_in_flight=retry_cap,
            **extra,
        )
        for tenant, kind in zip(tenants, kinds, strict=True)
    ]
    return Endpoint.objects.bulk_create(rows)


def _steady(sender: Sender, rate: float, seconds: float, rng: random.Random) -> list[Planned]:
    """`rate` events a second for `seconds`, evenly spaced from a random phase."""
    if rate <= 0:
        return []
    phase = rng.uniform(0, 1 / rate)
    return [Planned(phase + n / rate, sender) for n in range(int((seconds - phase) * rate) + 1)]


def build_flood(spec: RunSpec, receiver: Receiver, o: dict[str, Any]) -> Setup:
    """One loud tenant sends evenly over the flood; each quiet tenant sends a few events
    at random moments during it. One shared destination (the gateway case), or with
    own_endpoints each tenant's own."""
    rng = random.Random(o["seed"])
    cap = o["cap"] if spec.caps else NO_CAP
    tenants = _tenants(["loud", *(f"quiet-{n:04d}" for n in range(o["quiet_tenants"]))])
    if o["own_endpoints"]:
        _endpoints(receiver, tenants, ["ok"] * len(tenants), cap, cap)
        source = None
    else:
        shared = Endpoint.objects.create(
            tenant=None,
            url=receiver.url("ok", "shared", "0"),
            max_in_flight=cap,
            retry_max_in_flight=cap,
        )
        source = Source.objects.create(
            slug="simulate-gateway", scheme=Source.NONE, fairness_key="body.shop_id"
        )
        source.destinations.add(shared)
    loud = Sender(tenants[0], "loud", source)
    seconds, count = o["seconds"], o["loud_events"]
    plan = [Planned(seconds * n / count, loud) for n in range(count)]
    for tenant in tenants[1:]:
        quiet = Sender(tenant, "quiet", source)
        window = o["quiet_seconds"]
        plan += [Planned(rng.uniform(0, window), quiet) for _ in range(o["quiet_events"])]
    return Setup(plan, expected=len(plan))


def build_slow_endpoints(spec: RunSpec, receiver: Receiver, o: dict[str, Any]) -> Setup:
    """E tenants, one endpoint each; H of them hang until the endpoint's timeout (in the
    no-hang reference they answer like the rest). Every endpoint gets the same steady
    traffic, and the platform's own retry schedule applies."""
    rng = random.Random(o["seed"])
    cap = _platform_cap(spec, o["cap"])
    tenants = _tenants([f"shop-{n:04d}" for n in range(o["endpoints"])])
    hung = set(rng.sample(range(len(tenants)), o["hung"]))
    kinds = ["hang" if n in hung and spec.hang else "ok" for n in range(len(tenants))]
    retry_cap = 1 if spec.caps else NO_CAP  # the platform's default retry_max_in_flight
    endpoints = _endpoints(
        receiver, tenants, kinds, cap, retry_cap, timeout_seconds=o["endpoint_timeout"]
    )
    plan: list[Planned] = []
    expected = 0
    for n, tenant in enumerate(tenants):
        events = _steady(
            Sender(tenant, "hung" if n in hung else "healthy"), o["rate"], o["seconds"], rng
        )
        plan += events
        expected += len(events) if kinds[n] == "ok" else 0
    return Setup(
        plan,
        expected,
        hung_endpoints=[endpoints[n].pk for n in sorted(hung)] if spec.hang else [],
        bounds={"hung_slots": o["hung"] * (cap or settings.DELIVERY_ADAPTIVE_CEILING)}
        if spec.caps and spec.hang
        else {},
    )


def build_retry_storm(spec: RunSpec, receiver: Receiver, o: dict[str, Any]) -> Setup:
    """A large tenant's endpoint goes down (503) for a while and comes back; its failed
    deliveries pile up as retries. Other tenants keep sending to healthy endpoints.
    With retry_after the 503s carry a Retry-After naming the recovery (a maintenance
    page): the platform then holds the endpoint's work until then instead of retrying."""
    rng = random.Random(o["seed"])
    cap, retry_cap = (o["cap"], o["retry_cap"]) if spec.caps else (NO_CAP, NO_CAP)
    big, *others = _tenants(["large", *(f"shop-{n:04d}" for n in range(o["tenants"]))])
    _endpoints(receiver, [big], ["storm"], cap, retry_cap)
    other_cap = _platform_cap(spec, 2)
    _endpoints(receiver, others, ["ok"] * len(others), other_cap, 1 if spec.caps else NO_CAP)
    plan = _steady(Sender(big, "large"), o["storm_rate"], o["seconds"], rng)
    for tenant in others:
        plan += _steady(Sender(tenant, "other"), o["rate"], o["seconds"], rng)
    start = o["outage_start"]
    service = max(o["service_ms"], 1e-3) / 1000
    return Setup(
        plan,
        expected=len(plan),
        worker_env={
            "RETRY_SCHEDULE_SECONDS": o["retry_schedule"],
            # The endpoint must survive its outage: by default 100 straight failures
            # disable it, and its deliveries would be held rather than retried.
            "ENDPOINT_DISABLE_AFTER_FAILURES": "100000000",
        },
        outage=(start, start + o["outage_seconds"]),
        bounds={
            "max_in_flight": cap,
            "retry_max_in_flight": retry_cap,
            "rate_bound_per_s": cap / service,
            "retry_rate_bound_per_s": retry_cap / service,
        }
        if spec.caps
        else {},
    )


def build_fragile_endpoints(spec: RunSpec, receiver: Receiver, o: dict[str, Any]) -> Setup:
    """One tenant sends more than its endpoint can take to a receiver of capacity C that
    the platform is not told; C halves a third of the way through and doubles back at
    two thirds. Quiet tenants send steadily to healthy endpoints of their own, sharing
    the workers. The run is measured over its window and ends there: with a cap far
    under C, the backlog would take many times the window to drain. The adaptive run
    leaves the fragile endpoint without a cap of its own (the platform's ceiling only)."""
    rng = random.Random(o["seed"])
    cap, retry_cap = (o["cap"], o["retry_cap"]) if spec.caps else (NO_CAP, NO_CAP)
    if spec.adaptive:
        # No per-endpoint configuration: the limit finds the capacity under the
        # platform's ceiling (DELIVERY_ADAPTIVE_CEILING).
        cap = None
    fragile, *quiet = _tenants(["fragile", *(f"quiet-{n:04d}" for n in range(o["tenants"]))])
    _endpoints(receiver, [fragile], ["fragile"], cap, retry_cap)
    quiet_cap = _platform_cap(spec, 2)
    _endpoints(receiver, quiet, ["ok"] * len(quiet), quiet_cap, 1 if spec.caps else NO_CAP)
    seconds, capacity = o["seconds"], o["capacity"]
    plan = _steady(Sender(fragile, "fragile"), o["fragile_rate"], seconds, rng)
    for tenant in quiet:
        plan += _steady(Sender(tenant, "quiet"), o["rate"], seconds, rng)
    return Setup(
        plan,
        expected=len(plan),
        worker_env={
            # Overload answers come back as retries within the window (the platform's
            # own schedule waits minutes), and do not disable the endpoint.
            "RETRY_SCHEDULE_SECONDS": DEFAULTS["retry-storm"]["retry_schedule"],
            "ENDPOINT_DISABLE_AFTER_FAILURES": "100000000",
        },
        capacity_changes=[
            (0.0, capacity),
            (seconds / 3, max(1, capacity // 2)),
            (2 * seconds / 3, max(1, capacity // 2) * 2),
        ],
        stop_after=seconds,
        bounds={"service_s": max(o["service_ms"], 1e-3) / 1000, "window_s": seconds},
    )


BUILDERS = {
    "flood": build_flood,
    "slow-endpoints": build_slow_endpoints,
    "retry-storm": build_retry_storm,
    "fragile-endpoints": build_fragile_endpoints,
}

"""From what was accepted and what arrived to the figures, the table and the ratios.

Latency is acceptance (the commit, see traffic.py) to the first 2xx arrival of the
event at the receiver; a later 2xx of the same event is a duplicate (at-least-once).
Percentiles are nearest-rank over the events that arrived; events that never arrived
are counted apart (`missing`), never folded into a percentile.
"""

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from simulation.traffic import Accepted

# The figures --json promises for every run (None where a scenario has no such thing).
FIGURES = (
    "quiet_p99_ms",
    "quiet_max_ms",
    "loud_done_s",
    "deliveries_per_s",
    "hung_slots_max",
    "healthy_p99_ms",
)


def percentile(values: list[float], q: float) -> float | None:
    """Nearest rank: the smallest value with at least q% of the values at or below it."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1000, 1)


@dataclass
class Observed:
    """Everything one run produced, for `summarize`."""

    scenario: str
    label: str
    started_at: float  # Unix time the traffic started
    accepted: dict[str, Accepted]
    records: list[list]  # the receiver's [event id, path, arrival, status, retry]
    hung_in_flight_max: int = 0  # sampled from the scheduler's snapshot
    # Of the samples taken while deliveries were queued, the share in which the workers
    # held all the leases their engines allow (they waited on their own recorders).
    lease_limit_share: float | None = None
    receiver_open_max: dict[str, int] = field(default_factory=dict)
    outage: tuple[float, float] | None = None
    # fragile-endpoints: (seconds after the start, the capacity C from then on)
    capacity_changes: list[tuple[float, int]] = field(default_factory=list)
    bounds: dict[str, float] = field(default_factory=dict)
    timed_out: bool = False
    # Event id -> when the worker began the POST that succeeded (its Attempt row), for
    # the groups in SPLIT: splits their latency into before the POST and the POST itself.
    sent_at: dict[str, float] = field(default_factory=dict)


SPLIT = ("quiet", "healthy", "other")  # the groups whose wait is the question


def summarize(seen: Observed) -> dict[str, Any]:
    first_ok: dict[str, float] = {}
    duplicates = 0
    for event_id, _path, arrived, status, _retry in seen.records:
        if 200 <= status < 300:
            if event_id in first_ok:
                duplicates += 1
            else:
                first_ok[event_id] = arrived
    latencies: dict[str, list[float]] = {}
    last_arrival: dict[str, float] = {}
    missing: Counter[str] = Counter()
    for event_id, accepted in seen.accepted.items():
        arrived = first_ok.get(event_id)
        if arrived is None:
            missing[accepted.group] += 1
            continue
        latencies.setdefault(accepted.group, []).append(arrived - accepted.accepted_at)
        last_arrival[accepted.group] = max(last_arrival.get(accepted.group, 0.0), arrived)
    groups = {
        group: {
            "events": len(values) + missing[group],
            "delivered": len(values),
            "missing": missing[group],
            "p50_ms": _ms(percentile(values, 50)),
            "p99_ms": _ms(percentile(values, 99)),
            "max_ms": _ms(max(values)),
        }
        for group, values in latencies.items()
    }
    for group in SPLIT:
        if group in groups:
            groups[group].update(_split(seen, group, first_ok))
    for group, count in missing.items():
        groups.setdefault(group, {"events": count, "delivered": 0, "missing": count})
    first_accept = min((a.accepted_at for a in seen.accepted.values()), default=seen.started_at)
    end = max(first_ok.values(), default=first_accept)
    result: dict[str, Any] = dict.fromkeys(FIGURES)
    result.update(
        label=seen.label,
        groups=groups,
        delivered=len(first_ok),
        duplicates=duplicates,
        requests=len(seen.records),
        elapsed_s=round(end - first_accept, 2),
        deliveries_per_s=round(len(first_ok) / (end - first_accept), 1)
        if end > first_accept
        else None,
        timed_out=seen.timed_out,
        lease_limit_share=seen.lease_limit_share,
        latencies_ms={group: sorted(_ms(v) for v in values) for group, values in latencies.items()},
    )
    _scenario_figures(seen, result, groups, last_arrival, first_accept)
    return result


def _split(seen: Observed, group: str, first_ok: dict[str, float]) -> dict[str, float | None]:
    """p99 of acceptance -> POST started (schedule, pick, load, a free slot) and of POST
    started -> arrival (HTTP, the worker's threads and the receiver): where a tail is."""
    before, during = [], []
    for event_id, accepted in seen.accepted.items():
        sent, arrived = seen.sent_at.get(event_id), first_ok.get(event_id)
        if accepted.group == group and sent is not None and arrived is not None:
            before.append(sent - accepted.accepted_at)
            during.append(arrived - sent)
    return {
        "before_post_p99_ms": _ms(percentile(before, 99)),
        "post_p99_ms": _ms(percentile(during, 99)),
    }


def _scenario_figures(
    seen: Observed,
    result: dict[str, Any],
    groups: dict[str, dict],
    last_arrival: dict[str, float],
    first_accept: float,
) -> None:
    if seen.scenario == "flood":
        result["quiet_p99_ms"] = groups.get("quiet", {}).get("p99_ms")
        result["quiet_max_ms"] = groups.get("quiet", {}).get("max_ms")
        if "loud" in last_arrival:
            done = last_arrival["loud"] - first_accept
            result["loud_done_s"] = round(done, 2)
            result["loud_per_s"] = round(groups["loud"]["delivered"] / done, 1)
    elif seen.scenario == "slow-endpoints":
        result["healthy_p99_ms"] = groups.get("healthy", {}).get("p99_ms")
        if seen.hung_in_flight_max or seen.receiver_open_max.get("hang"):
            result["hung_slots_max"] = seen.hung_in_flight_max
            result["hung_open_requests_max"] = seen.receiver_open_max.get("hang", 0)
        result["hung_slots_bound"] = seen.bounds.get("hung_slots")
    elif seen.scenario == "retry-storm" and seen.outage is not None:
        result.update(_storm(seen))
    elif seen.scenario == "fragile-endpoints" and seen.capacity_changes:
        result["quiet_p99_ms"] = groups.get("quiet", {}).get("p99_ms")
        result.update(fragile(seen))


# A capacity change has been converged to once a window of this many seconds delivers
# at least GOODPUT_CONVERGED of the new capacity with at most OVERLOAD_CONVERGED of its
# requests answered 503.
CONVERGE_WINDOW_S = 2
GOODPUT_CONVERGED = 0.9
OVERLOAD_CONVERGED = 0.01


def fragile(seen: Observed) -> dict[str, Any]:
    """The fragile endpoint over the measured window: successful answers against what its
    capacity allowed (C / service time per second, phase by phase), the share of its
    requests answered 503 for overload, and how long after each capacity change the
    delivery rate first came within reach of the new capacity without overloading it."""
    base = seen.started_at
    window, service = seen.bounds["window_s"], seen.bounds["service_s"]
    seconds = math.ceil(window)
    ok, overload = [0] * seconds, [0] * seconds
    for _event_id, path, arrived, status, _retry in seen.records:
        at = arrived - base
        if path.startswith("/fragile/") and 0 <= at < window:
            (ok if 200 <= status < 300 else overload)[min(int(at), seconds - 1)] += 1
    phases = [
        (start, min(end, window), capacity / service)
        for (start, capacity), (end, _) in zip(
            seen.capacity_changes, [*seen.capacity_changes[1:], (window, 0)], strict=True
        )
        if start < window
    ]
    allowed = sum((end - start) * per_s for start, end, per_s in phases)
    converge = [_converged(ok, overload, start, end, per_s) for start, end, per_s in phases[1:]]
    requests = sum(ok) + sum(overload)
    return {
        "goodput_per_s": round(sum(ok) / window, 1),
        "capacity_per_s": round(allowed / window, 1),
        "goodput_to_capacity": round(sum(ok) / allowed, 3) if allowed else None,
        "overload_error_share": round(sum(overload) / requests, 4) if requests else None,
        "converge_s_by_change": converge,
        "converge_s": None if None in converge or not converge else max(converge),
        "fragile_open_max": seen.receiver_open_max.get("fragile", 0),
        "fragile_ok_per_s": ok,
        "fragile_overload_per_s": overload,
        "capacity_changes": [list(change) for change in seen.capacity_changes],
    }


def _converged(
    ok: list[int], overload: list[int], start: float, end: float, per_s: float
) -> float | None:
    """Seconds from a change at `start` to the end of the first whole-second window of
    CONVERGE_WINDOW_S within its phase that met the new capacity (`per_s`); None if none
    did before the phase ended at `end`."""
    first = math.ceil(start)
    for at in range(first, int(end) - CONVERGE_WINDOW_S + 1):
        good = sum(ok[at : at + CONVERGE_WINDOW_S])
        bad = sum(overload[at : at + CONVERGE_WINDOW_S])
        if good >= GOODPUT_CONVERGED * per_s * CONVERGE_WINDOW_S and bad <= OVERLOAD_CONVERGED * (
            good + bad
        ):
            return round(at + CONVERGE_WINDOW_S - start, 2)
    return None


def _storm(seen: Observed) -> dict[str, Any]:
    """Requests per second to the large endpoint after it came back, and how the other
    tenants fared before the outage and in the ten seconds after the recovery."""
    base = seen.started_at
    start, end = (base + offset for offset in seen.outage or (0.0, 0.0))
    per_second: Counter[int] = Counter()  # from the start, for the plot
    after: Counter[int] = Counter()  # whole seconds since the recovery
    after_retries: Counter[int] = Counter()
    other_arrivals: dict[str, float] = {}
    for event_id, path, arrived, status, retry in seen.records:
        if path.startswith("/storm/"):
            per_second[int(arrived - base)] += 1
            if arrived >= end:
                after[int(arrived - end)] += 1
                after_retries[int(arrived - end)] += retry
        elif 200 <= status < 300:
            other_arrivals.setdefault(event_id, arrived)
    other: dict[str, float | None] = {}
    for name, (low, high) in {"before": (base, start), "after_recovery": (end, end + 10)}.items():
        values = [
            other_arrivals[event_id] - accepted.accepted_at
            for event_id, accepted in seen.accepted.items()
            if accepted.group == "other"
            and low <= accepted.accepted_at < high
            and event_id in other_arrivals
        ]
        other[f"other_p99_ms_{name}"] = _ms(percentile(values, 99))
    retry_arrivals = [r[2] for r in seen.records if r[1].startswith("/storm/") and r[4]]
    return {
        "storm_peak_rps_after_recovery": max(after.values(), default=0),
        "storm_peak_retry_rps_after_recovery": max(after_retries.values(), default=0),
        "storm_requests_during_outage": sum(
            1 for r in seen.records if r[1].startswith("/storm/") and start <= r[2] < end
        ),
        "storm_open_max": seen.receiver_open_max.get("storm", 0),
        "storm_retry_open_max": seen.receiver_open_max.get("storm_retry", 0),
        # The last retry to reach it: when the backlog of the outage was worked off.
        "storm_retries_done_s_after_recovery": round(max(retry_arrivals, default=end) - end, 2),
        "storm_requests_per_s": [
            per_second.get(s, 0) for s in range(max(per_second, default=-1) + 1)
        ],
        "outage": [offset for offset in seen.outage or ()],
        **other,
        **{f"bound_{name}": value for name, value in seen.bounds.items()},
    }


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or denominator == 0:
        return None
    return round(numerator / denominator, 2)

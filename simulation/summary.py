"""The end of a simulation: the summary table, the goals and their verdicts.

With several rounds, every figure is the median over the rounds, and each goal's ratio
is the median of the rounds' own ratios (a ratio measured within one round, where the
machine's noise hit both runs alike), with every round's ratio listed beside it.
"""

import statistics
import sys
from typing import Any

from simulation.report import ratio

SCENARIO_ROWS: dict[str, list[tuple[str, str]]] = {
    "flood": [
        ("quiet tenants p50 (ms)", "groups.quiet.p50_ms"),
        ("quiet tenants p99 (ms)", "quiet_p99_ms"),
        ("quiet tenants max (ms)", "quiet_max_ms"),
        ("  p99 before the POST began (ms)", "groups.quiet.before_post_p99_ms"),
        ("  p99 of the POST itself (ms)", "groups.quiet.post_p99_ms"),
        ("loud tenant p50 (ms)", "groups.loud.p50_ms"),
        ("loud tenant p99 (ms)", "groups.loud.p99_ms"),
        ("loud tenant max (ms)", "groups.loud.max_ms"),
        ("loud tenant done after (s)", "loud_done_s"),
        ("loud tenant deliveries/s", "loud_per_s"),
        ("workers at their lease limit (share of samples)", "lease_limit_share"),
    ],
    "slow-endpoints": [
        ("healthy endpoints p50 (ms)", "groups.healthy.p50_ms"),
        ("healthy endpoints p99 (ms)", "healthy_p99_ms"),
        ("healthy endpoints max (ms)", "groups.healthy.max_ms"),
        ("  p99 before the POST began (ms)", "groups.healthy.before_post_p99_ms"),
        ("  p99 of the POST itself (ms)", "groups.healthy.post_p99_ms"),
        ("slots held by hung endpoints, max (scheduler)", "hung_slots_max"),
        ("open requests to hung endpoints, max (receiver)", "hung_open_requests_max"),
        ("bound: hung endpoints x cap", "hung_slots_bound"),
        ("events to hung endpoints (never answered)", "groups.hung.events"),
    ],
    "retry-storm": [
        ("large endpoint: requests while it was down", "storm_requests_during_outage"),
        ("large endpoint: peak requests/s after recovery", "storm_peak_rps_after_recovery"),
        ("  of which retries, peak/s", "storm_peak_retry_rps_after_recovery"),
        ("large endpoint: open requests, max", "storm_open_max"),
        ("  of which retries, max", "storm_retry_open_max"),
        ("bound: max_in_flight / service time (req/s)", "bound_rate_bound_per_s"),
        ("bound: retry cap / service time (req/s)", "bound_retry_rate_bound_per_s"),
        ("last retry arrived, after recovery (s)", "storm_retries_done_s_after_recovery"),
        ("other tenants p99 before the outage (ms)", "other_p99_ms_before"),
        ("other tenants p99, 10 s after recovery (ms)", "other_p99_ms_after_recovery"),
        ("large tenant p99 (ms)", "groups.large.p99_ms"),
    ],
    "fragile-endpoints": [
        ("fragile endpoint: capacity over the window (req/s)", "capacity_per_s"),
        ("fragile endpoint: 2xx answers/s (goodput)", "goodput_per_s"),
        ("goodput / capacity", "goodput_to_capacity"),
        ("overload answers (503) / requests", "overload_error_share"),
        ("open requests to it, max", "fragile_open_max"),
        ("converged after a change (s, the worse)", "converge_s"),
        ("quiet tenants p99 (ms)", "quiet_p99_ms"),
        ("quiet tenants max (ms)", "groups.quiet.max_ms"),
    ],
}
COMMON_ROWS = [
    ("deliveries/s (all)", "deliveries_per_s"),
    ("delivered / duplicates", "delivered_dupes"),
    ("never delivered (hung endpoints' aside)", "missing"),
    ("Redis: server CPU per delivery (µs)", "redis_cpu_us_per_delivery"),
    ("Redis: commands per delivery", "redis_commands_per_delivery"),
]


def lookup(result: dict[str, Any], path: str) -> Any:
    if path == "delivered_dupes":
        return f"{result['delivered']} / {result['duplicates']}"
    if path == "missing":
        return sum(g.get("missing", 0) for name, g in result["groups"].items() if name != "hung")
    value: Any = result
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.1f}" if value < 100 else f"{value:,.0f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


# (what, run and figure divided, by run and figure, comparison, goal): the goals of
# /work/shared/DESIGN.md, and the figures that show the baselines degrade.
GOALS: dict[str, list[tuple[str, str, str, str, str, str, float]]] = {
    "flood": [
        ("quiet p99, FIFO / fair", "fifo", "quiet_p99_ms", "fair", "quiet_p99_ms", ">=", 100),
        ("loud deliveries/s, fair / FIFO", "fair", "loud_per_s", "fifo", "loud_per_s", ">=", 0.9),
    ],
    "slow-endpoints": [
        (
            "healthy p99, fair / no-hang",
            "fair",
            "healthy_p99_ms",
            "no-hang",
            "healthy_p99_ms",
            "<=",
            1.5,
        ),
        (
            "healthy p99, no-caps / no-hang",
            "no-caps",
            "healthy_p99_ms",
            "no-hang",
            "healthy_p99_ms",
            ">",
            1.5,
        ),
        (
            "hung slots, fair / hung x cap",
            "fair",
            "hung_slots_max",
            "fair",
            "hung_slots_bound",
            "<=",
            1,
        ),
    ],
    "retry-storm": [
        (
            "retries open at once / retry cap",
            "fair",
            "storm_retry_open_max",
            "fair",
            "bound_retry_max_in_flight",
            "<=",
            1,
        ),
        (
            "requests open at once / max_in_flight",
            "fair",
            "storm_open_max",
            "fair",
            "bound_max_in_flight",
            "<=",
            1,
        ),
        (
            "peak req/s after recovery, no-caps / fair",
            "no-caps",
            "storm_peak_rps_after_recovery",
            "fair",
            "storm_peak_rps_after_recovery",
            ">",
            1,
        ),
    ],
    # A goal without a second run is the figure itself (docs/BENCHMARKS.md, "Fragile endpoints").
    "fragile-endpoints": [
        ("goodput / capacity, adaptive", "adaptive", "goodput_to_capacity", "", "", ">=", 0.9),
        ("503s / requests, adaptive", "adaptive", "overload_error_share", "", "", "<=", 0.01),
        ("converged after a change (s), adaptive", "adaptive", "converge_s", "", "", "<=", 30),
        (
            "quiet p99, adaptive / static",
            "adaptive",
            "quiet_p99_ms",
            "static",
            "quiet_p99_ms",
            "<=",
            1.1,
        ),
    ],
}

# fragile-endpoints' --json keys: (key, run, figure), the issue's names for its goals.
HEADLINES: dict[str, list[tuple[str, str, str]]] = {
    "fragile-endpoints": [
        ("goodput_to_capacity", "adaptive", "goodput_to_capacity"),
        ("goodput_to_capacity_static", "static", "goodput_to_capacity"),
        ("overload_error_share", "adaptive", "overload_error_share"),
        ("overload_error_share_nocap", "no-caps", "overload_error_share"),
        ("converge_s", "adaptive", "converge_s"),
    ],
}


def headline(scenario: str, runs: dict[str, dict], goal_list: list[dict]) -> dict[str, Any]:
    """The scenario's headline figures under the names its goals use (median runs), and
    the ratios of its two-run goals."""
    out: dict[str, Any] = {
        key: runs[run].get(figure)
        for key, run, figure in HEADLINES.get(scenario, [])
        if run in runs
    }
    if scenario == "fragile-endpoints":
        quiet = next((g for g in goal_list if g["what"].startswith("quiet p99")), None)
        if quiet is not None:
            out["quiet_p99_ratio"] = quiet["ratio"]
    return out


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}" if value < 10 else f"{value:,.0f}"


def goals(scenario: str, rounds: list[dict[str, dict]]) -> list[dict[str, Any]]:
    """The goals whose runs are present: the median ratio over the rounds, each round's
    ratio, and whether the median meets the goal."""
    out = []
    for what, top_run, top, bottom_run, bottom, op, goal in GOALS[scenario]:
        per_round = [
            ratio(runs[top_run].get(top), runs[bottom_run].get(bottom))
            if bottom_run
            else runs[top_run].get(top)
            for runs in rounds
            if top_run in runs and (not bottom_run or bottom_run in runs)
        ]
        if not per_round:
            continue
        known = [value for value in per_round if value is not None]
        value = round(statistics.median(known), 4) if known else None
        met = (
            None
            if value is None
            else {">=": value >= goal, "<=": value <= goal, ">": value > goal}[op]
        )
        out.append(
            {
                "what": what,
                "ratio": value,
                "rounds": per_round,
                "goal": f"{op} {goal:g}",
                "met": met,
            }
        )
    return out


def median_runs(rounds: list[dict[str, dict]]) -> dict[str, dict]:
    """Each run's figures, the median over the rounds (lists from the first round)."""
    return {label: _median([runs[label] for runs in rounds]) for label in rounds[0]}


def _median(values: list[Any]) -> Any:
    first = values[0]
    if isinstance(first, dict):
        return {key: _median([value.get(key) for value in values]) for key in first}
    if isinstance(first, bool):
        return any(values)
    numbers = [value for value in values if isinstance(value, int | float)]
    if isinstance(first, int | float) and numbers:
        if all(isinstance(value, int) for value in numbers):
            return statistics.median_low(numbers)  # counts stay whole
        return round(statistics.median(numbers), 4)
    return first


def print_table(scenario: str, rounds: list[dict[str, dict]], out=sys.stdout) -> None:
    runs = median_runs(rounds)
    labels = list(runs)
    if len(rounds) > 1:
        out.write(f"\nmedians of {len(rounds)} rounds (alternating the order of the runs)")
    rows = SCENARIO_ROWS[scenario] + COMMON_ROWS
    width = max(len(name) for name, _ in rows) + 2
    out.write("\n" + "".ljust(width) + "".join(f"{label:>14}" for label in labels) + "\n")
    out.write("-" * (width + 14 * len(labels)) + "\n")
    for name, path in rows:
        out.write(
            name.ljust(width)
            + "".join(f"{_cell(lookup(runs[label], path)):>14}" for label in labels)
            + "\n"
        )
    for goal in goals(scenario, rounds):
        verdict = {True: "met", False: "MISSED", None: "not measured"}[goal["met"]]
        each = f" (rounds: {', '.join(map(_ratio, goal['rounds']))})" if len(rounds) > 1 else ""
        out.write(
            f"{goal['what']}: {_ratio(goal['ratio'])}{each}  goal {goal['goal']}: {verdict}\n"
        )
    for label, result in runs.items():
        if result["timed_out"]:
            out.write(f"[{label}] stopped at --timeout before everything was delivered\n")

"""A whole `simulate` invocation inside the child process: every run, then the table,
the goals, --json and --plot.

Entry: `python -m simulation.session` with SIMULATE_OPTIONS (JSON) and the
simulation's DATABASE_URL/REDIS_URL in the environment; the command starts it.
"""

import json
import os
import platform
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any


def machine() -> dict[str, Any]:
    import redis
    from django.conf import settings
    from django.db import connection

    cpu = (
        next(
            (
                line.split(":", 1)[1].strip()
                for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")
            ),
            platform.processor(),
        )
        if Path("/proc/cpuinfo").exists()
        else platform.processor()
    )
    info = redis.Redis.from_url(settings.REDIS_URL).info("server")
    return {
        "cpus": os.cpu_count(),
        "cpu": cpu,
        "python": platform.python_version(),
        "redis": info.get("redis_version"),
        "database": connection.vendor,
        "load_average_at_start": os.getloadavg(),
        "commit": _git("rev-parse", "--short", "HEAD"),
        "uncommitted_changes": bool(_git("status", "--porcelain", "--untracked-files=no")),
    }


def _git(*args: str) -> str:
    """Which code was measured (read-only git calls; empty outside a checkout)."""
    try:
        done = subprocess.run(["git", *args], capture_output=True, text=True, timeout=30)
    except OSError:
        return ""
    return done.stdout.strip()


def main() -> int:
    import django

    django.setup()
    from simulation.calibration import calibrate, describe
    from simulation.environment import RedisDatabase
    from simulation.receiver import Receiver
    from simulation.runner import execute, prepare_database
    from simulation.scenarios import runs_for
    from simulation.summary import goals, headline, median_runs, print_table

    # A SIGTERM (the command forwards its own) stops like Ctrl-C: workers and receiver
    # are stopped on the way out rather than left running.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started in background
    options = json.loads(os.environ["SIMULATE_OPTIONS"])
    scenario = options["scenario"]
    workdir = Path(os.environ["SIMULATE_WORKDIR"])
    redis_db = RedisDatabase(os.environ["REDIS_URL"], os.environ["SIMULATE_REDIS_TOKEN"])
    prepare_database()
    about = machine()
    receiver = Receiver(options.get("service_ms") or 0.0)
    specs = runs_for(
        scenario,
        options["scheduler"],
        options["no_caps"],
        options["compare"],
        options["shards"],
        options.get("adaptive", False),
    )
    rounds: list[dict[str, dict]] = []
    try:
        if scenario == "flood" and options["loud_events"] is None:
            found = calibrate(options, receiver, redis_db, os.environ["DATABASE_URL"], workdir)
            options.update(loud_events=found["loud_events"], calibration=found)
            print(describe(options, found), flush=True)
        for number in range(options["rounds"]):
            # Every other round runs in reverse, so a drift in the machine's load does not
            # always favour the same run.
            order = specs if number % 2 == 0 else specs[::-1]
            done = {
                spec.label: execute(
                    scenario,
                    spec,
                    options,
                    receiver,
                    redis_db,
                    os.environ["DATABASE_URL"],
                    workdir,
                    f"{spec.label} {number + 1}/{options['rounds']}"
                    if options["rounds"] > 1
                    else "",
                )
                for spec in order
            }
            rounds.append({spec.label: done[spec.label] for spec in specs})
    finally:
        receiver.close()
    about["load_average_at_end"] = os.getloadavg()
    print_table(scenario, rounds)
    if options.get("json"):
        runs, goal_list = median_runs(rounds), goals(scenario, rounds)
        figures = {
            "scenario": scenario,
            **headline(scenario, runs, goal_list),
            "options": options,
            "machine": about,
            "runs": _lean(runs),
            "goals": goal_list,
            "rounds": [_lean(runs) for runs in rounds] if len(rounds) > 1 else [],
        }
        Path(options["json"]).write_text(json.dumps(figures, indent=1))
        print(f"figures written to {options['json']}")
    if options.get("plot"):
        from simulation.plot import write_plot

        write_plot(Path(options["plot"]), scenario, _pooled(rounds))
        print(f"plot written to {options['plot']}")
    return 0


def _pooled(rounds: list[dict[str, dict]]) -> dict[str, dict]:
    """For the plot: each run's latencies from every round together (the rest, such as
    the storm's request rates, from the first round)."""
    pooled = {}
    for label, first in rounds[0].items():
        groups = {group for runs in rounds for group in runs[label]["latencies_ms"]}
        latencies = {
            group: sorted(v for runs in rounds for v in runs[label]["latencies_ms"].get(group, []))
            for group in groups
        }
        pooled[label] = {**first, "latencies_ms": latencies, "rounds": len(rounds)}
    return pooled


def _lean(runs: dict[str, dict]) -> dict[str, dict]:
    """Without every event's latency: that is for the plot; the file keeps the figures."""
    return {
        label: {k: v for k, v in run.items() if k != "latencies_ms"} for label, run in runs.items()
    }


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("\ninterrupted; workers and receiver stopped", file=sys.stderr)
        sys.exit(130)

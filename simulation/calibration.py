"""Sizing the flood from what this machine's workers deliver.

A fixed flood overloads one machine and not the next: a size chosen on one machine is a
backlog there and a trickle on a faster one (or once the workers get faster), and the
fairness it exists to show vanishes with the backlog. So, unless --loud-events is
given, a probe run (the loud tenant alone, PROBE_EVENTS at once, the same workers, slots
and endpoints as the flood) measures deliveries per second, and the loud tenant then
sends OVERLOAD times that for the flood's --seconds: the backlog at its end is
(OVERLOAD - 1) x --seconds of delivery, long enough that FIFO's quiet tenants wait tens of
seconds while the fair scheduler's wait a turn.
"""

from pathlib import Path
from typing import Any

from simulation.environment import RedisDatabase
from simulation.receiver import Receiver
from simulation.runner import execute
from simulation.scenarios import RunSpec

PROBE_EVENTS = 10_000
OVERLOAD = 4.0


def calibrate(
    options: dict[str, Any],
    receiver: Receiver,
    redis_db: RedisDatabase,
    database_url: str,
    workdir: Path,
) -> dict[str, Any]:
    """The probe's figures and the loud tenant's event count they give."""
    probe = {**options, "loud_events": PROBE_EVENTS, "seconds": 0.5, "quiet_tenants": 0}
    figures = execute(
        "flood", RunSpec("probe"), probe, receiver, redis_db, database_url, workdir, "probe"
    )
    per_s = figures["loud_per_s"] or figures["deliveries_per_s"] or 0.0
    if not per_s:
        raise RuntimeError("the calibration probe delivered nothing; see the workers' logs")
    return {
        "probe_events": PROBE_EVENTS,
        "delivered_per_s": per_s,
        "overload": OVERLOAD,
        "loud_events": int(round(per_s * OVERLOAD * options["seconds"], -3)),
    }


def describe(options: dict[str, Any], calibration: dict[str, Any]) -> str:
    return (
        f"calibration: {options['workers']} workers x {options['slots']} slots delivered "
        f"{calibration['delivered_per_s']:,.0f} events/s in a probe of "
        f"{calibration['probe_events']:,}; the loud tenant sends {calibration['overload']:g}x "
        f"that for {options['seconds']:g} s: {calibration['loud_events']:,} events "
        "(--loud-events sets it instead)"
    )

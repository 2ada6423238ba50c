"""What a Redis server has done so far, for figures per unit of work: read before and
after the work, and divide the difference by the deliveries (bench/shards.py, `simulate`).

Both readings are the whole server's: on a server other clients use too, their work is
counted with ours. Commands include those a script or function runs (INFO commandstats
counts each), as the `commands_per_delivery` figure defines them (docs/BENCHMARKS.md);
INFO itself is left out.
"""

from typing import NamedTuple

import redis


class ServerWork(NamedTuple):
    cpu_seconds: float  # used_cpu_sys + used_cpu_user
    commands: int


def server_work(conn: redis.Redis) -> ServerWork:
    cpu = conn.info("cpu")
    stats = conn.info("commandstats")
    calls = sum(v["calls"] for k, v in stats.items() if k != "cmdstat_info")
    return ServerWork(cpu["used_cpu_sys"] + cpu["used_cpu_user"], calls)


# The figures' names, as bench/shards.py and `simulate --json` report them.
CPU_FIGURE, COMMANDS_FIGURE = "redis_cpu_us_per_delivery", "redis_commands_per_delivery"
NOT_MEASURED: dict[str, float | None] = {CPU_FIGURE: None, COMMANDS_FIGURE: None}


def per_delivery(before: ServerWork, after: ServerWork, deliveries: int) -> dict[str, float | None]:
    """Server CPU (microseconds) and commands per delivery between two readings; none for none."""
    if deliveries <= 0:
        return dict(NOT_MEASURED)
    return {
        CPU_FIGURE: round((after.cpu_seconds - before.cpu_seconds) * 1e6 / deliveries, 1),
        COMMANDS_FIGURE: round((after.commands - before.commands) / deliveries, 2),
    }

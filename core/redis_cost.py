"""What a Redis server has done so far, for figures per unit of work: read before and
after the work, and divide the difference (bench/shards.py, `simulate`).

Both readings are the whole server's: on a server other clients use too, their work is
counted with ours. Commands include those a script or function runs (INFO commandstats
counts each), as #21's `commands_per_delivery` defines them; INFO itself is left out.
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


def per_unit(before: ServerWork, after: ServerWork, units: int) -> dict[str, float | None]:
    """Server CPU (µs) and commands per unit between two readings; None for no units."""
    if units <= 0:
        return {"redis_cpu_us_per_delivery": None, "redis_commands_per_delivery": None}
    return {
        "redis_cpu_us_per_delivery": round(
            (after.cpu_seconds - before.cpu_seconds) * 1e6 / units, 1
        ),
        "redis_commands_per_delivery": round((after.commands - before.commands) / units, 2),
    }

"""core.redis_cost: a Redis server's work between two readings, per unit of work."""

from pathlib import Path

import redis

from core.redis_cost import ServerWork, per_delivery, server_work
from tests.private_redis import PrivateRedis


def test_commands_count_those_a_script_runs_and_leave_info_out(tmp_path: Path) -> None:
    server = PrivateRedis(tmp_path)
    server.start()
    try:
        client = redis.Redis.from_url(server.url)
        before = server_work(client)
        for i in range(10):
            client.set(f"k{i}", i)  # 10 commands
        # One EVAL that runs 3 commands itself: 4 in all, as #21 counts them.
        client.eval(
            "redis.call('INCR', 'n'); redis.call('INCR', 'n'); return redis.call('GET', 'n')", 0
        )
        after = server_work(client)  # its own INFO calls are not counted
        assert after.commands - before.commands == 14
        assert after.cpu_seconds >= before.cpu_seconds
        figures = per_delivery(before, after, 7)
        assert figures["redis_commands_per_delivery"] == 2.0
        assert figures["redis_cpu_us_per_delivery"] >= 0
    finally:
        server.stop()


def test_no_deliveries_give_no_figure_rather_than_a_division_by_zero() -> None:
    reading = ServerWork(cpu_seconds=1.0, commands=10)
    assert per_delivery(reading, reading, 0) == {
        "redis_cpu_us_per_delivery": None,
        "redis_commands_per_delivery": None,
    }


def test_per_delivery_divides_the_difference() -> None:
    figures = per_delivery(ServerWork(1.0, 100), ServerWork(1.5, 1100), 250)
    assert figures == {"redis_cpu_us_per_delivery": 2000.0, "redis_commands_per_delivery": 4.0}

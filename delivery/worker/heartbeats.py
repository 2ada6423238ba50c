"""Delivery workers' heartbeats: each live worker writes the time into one sorted set
while its delivery engine's threads run, so that /readyz and `manage.py lanes` can say
how many workers deliver, and since when one has been silent. RQ's own heartbeat says
only that the process runs its job loop, not that it delivers."""

import time

from core import redis_connection

KEY = redis_connection.KEY_PREFIX + "workers"
BEAT_SECONDS = 5.0
# A worker silent this long counts as gone: three beats missed.
SILENT_SECONDS = 3 * BEAT_SECONDS
# Entries of workers gone this long are dropped by the next beat.
FORGET_SECONDS = 3600.0


def beat(connection: object, name: str, now: float | None = None) -> None:
    now = time.time() if now is None else now
    pipe = connection.pipeline(transaction=False)
    pipe.zadd(KEY, {name: now})
    pipe.zremrangebyscore(KEY, "-inf", now - FORGET_SECONDS)
    pipe.execute()


def forget(connection: object, name: str) -> None:
    connection.zrem(KEY, name)


def live(connection: object, now: float | None = None) -> dict[str, float]:
    """Workers that beat within SILENT_SECONDS: name -> seconds since their last beat."""
    now = time.time() if now is None else now
    beats = connection.zrangebyscore(KEY, now - SILENT_SECONDS, "+inf", withscores=True)
    return {
        (name.decode() if isinstance(name, bytes) else name): max(0.0, now - at)
        for name, at in beats
    }

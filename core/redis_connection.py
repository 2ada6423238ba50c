"""The process's Redis client for the platform's own keys (the schedule, the dashboards'
history gate, the fairness-key counts), configured from settings when first used.

One client means one connection pool per process, whichever app asks first; apps at any
layer may use it, so none of them reaches up into the scheduler's package for a socket.
"""

import redis

# Every key the platform writes starts with this: the scheduler's `wh:{<shard>}:` (the
# braces are a Redis Cluster hash tag), everything else `wh:<area>:`.
KEY_PREFIX = "wh:"
_client: redis.Redis | None = None


def shared() -> redis.Redis:
    """The client for settings.REDIS_URL; options in the URL itself (`?socket_timeout=`)
    win over REDIS_SOCKET_TIMEOUT and REDIS_CONNECT_TIMEOUT."""
    global _client
    if _client is None:
        from django.conf import settings  # read when first used, not at import

        _client = redis.Redis.from_url(
            settings.REDIS_URL,
            socket_timeout=getattr(settings, "REDIS_SOCKET_TIMEOUT", None),
            socket_connect_timeout=getattr(settings, "REDIS_CONNECT_TIMEOUT", None),
        )
    return _client


def forget() -> None:
    """Drop the client (tests that change settings, or after a fork)."""
    global _client
    _client = None

"""A per-token request budget: API_RATE_LIMIT_PER_MINUTE requests a minute, counted in
Redis so every web process shares it. Past it, 429 with Retry-After (the seconds left in
the minute). A token is counted, never an address: callers are machines behind NATs.

With Redis unreachable the budget is not enforced: refusing every API call because a
counter cannot be read would turn a cache outage into an API outage.
"""

import logging
import time

import redis
from django.conf import settings
from rest_framework.request import Request
from rest_framework.throttling import BaseThrottle

from core import redis_connection
from core.outage_log import OutageLog

logger = logging.getLogger(__name__)
KEY = redis_connection.KEY_PREFIX + "api:rate:"  # + token id + ":" + minute
# An outage is logged once a minute per process, not once per request.
_redis_down = OutageLog(logger)


class TokenRateThrottle(BaseThrottle):
    def __init__(self) -> None:
        self.retry_after: float | None = None

    def allow_request(self, request: Request, view: object) -> bool:
        token = request.auth
        limit = settings.API_RATE_LIMIT_PER_MINUTE
        if token is None or not limit:
            return True
        now = time.time()
        minute = int(now // 60)
        key = f"{KEY}{token.pk}:{minute}"
        try:
            pipe = redis_connection.shared().pipeline()
            pipe.incr(key)
            pipe.expire(key, 120)
            used = pipe.execute()[0]
        except redis.RedisError as exc:
            _redis_down.warn("API rate limit not enforced: Redis did not answer (%s)", exc)
            return True
        if used <= limit:
            return True
        self.retry_after = max(1.0, (minute + 1) * 60 - now)
        return False

    def wait(self) -> float | None:
        return self.retry_after

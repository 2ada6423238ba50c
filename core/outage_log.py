"""Say an expected outage once, then once a minute with how often it recurred: a Redis
restart must not write a line per request or per delivery (hundreds a second), nor a
traceback for what is not a bug."""

import logging
import threading
import time

EVERY_SECONDS = 60.0


class OutageLog:
    """One kind of outage (say, "enqueue while Redis is down") in one process."""

    def __init__(self, logger: logging.Logger, every_seconds: float = EVERY_SECONDS) -> None:
        self.logger = logger
        self.every_seconds = every_seconds
        self._lock = threading.Lock()
        self._said_at = float("-inf")
        self._since = 0  # occurrences not said since the last line

    def warn(self, message: str, *args: object) -> bool:
        """Log `message % args` at WARNING if the last line was long enough ago (adding how
        many went unsaid meanwhile); else count it. True if it was logged."""
        now = time.monotonic()
        with self._lock:
            if now - self._said_at < self.every_seconds:
                self._since += 1
                return False
            quiet, self._since, self._said_at = self._since, 0, now
        if quiet:
            message += f" ({quiet} more like it in the last {self.every_seconds:.0f} s)"
        self.logger.warning(message, *args)
        return True

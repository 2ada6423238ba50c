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

    def due(self) -> int | None:
        """None: stay quiet (counted); else say it now, with this many left unsaid since."""
        now = time.monotonic()
        with self._lock:
            if now - self._said_at < self.every_seconds:
                self._since += 1
                return None
            quiet, self._since, self._said_at = self._since, 0, now
        return quiet

    def suffix(self, quiet: int) -> str:
        return f" ({quiet} more like it in the last {self.every_seconds:.0f} s)" if quiet else ""

    def warn(self, message: str, *args: object) -> bool:
        """Log `message % args` at WARNING if the last line was long enough ago (adding how
        many went unsaid meanwhile); else count it. True if it was logged."""
        quiet = self.due()
        if quiet is None:
            return False
        self.logger.warning(message + self.suffix(quiet), *args)
        return True


class OutageFilter(logging.Filter):
    """The same for another library's log lines that contain `marker` (RQ's "could not
    connect to Redis", an ERROR per retry): once a minute, at WARNING, with the count."""

    def __init__(self, marker: str, every_seconds: float = EVERY_SECONDS) -> None:
        super().__init__()
        self.marker = marker
        self.outage = OutageLog(logging.getLogger(__name__), every_seconds)

    def filter(self, record: logging.LogRecord) -> bool:
        if self.marker not in record.getMessage():
            return True
        quiet = self.outage.due()
        if quiet is None:
            return False
        record.msg, record.args = record.getMessage() + self.outage.suffix(quiet), None
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True

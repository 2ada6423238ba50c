"""Waiting on a condition with a generous bound, never a bare sleep (no Django needed, so
session fixtures started before the database may use it too)."""

import time
from collections.abc import Callable


def wait_until(
    condition: Callable[[], bool], timeout: float = 10.0, interval: float = 0.05
) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval)
    return condition()

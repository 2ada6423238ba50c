"""Each endpoint's recent health on the tenant portal: success rate and attempt latency
(p50, p95) over the last hour and the last day, and its overload answers in the last
minute (what its adaptive limit backs off on), from its Attempt rows.

One query per endpoint, a range of the (endpoint, started_at) index, and never more than
MAX_ATTEMPTS_READ rows: a busy endpoint's day then reads as its latest attempts (the page
says so) instead of a scan that grows with its traffic.
"""

import math
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import QuerySet
from django.utils import timezone

from delivery.models import Attempt

MINUTE = timedelta(minutes=1)
HOUR = timedelta(hours=1)
DAY = timedelta(days=1)
MAX_ATTEMPTS_READ = 20_000


@dataclass(frozen=True)
class WindowHealth:
    """Attempts started within one window."""

    attempts: int
    delivered: int
    p50_ms: int | None
    p95_ms: int | None
    capped: bool = False  # True: only the latest MAX_ATTEMPTS_READ attempts were read

    @property
    def success_rate(self) -> float | None:
        return self.delivered / self.attempts if self.attempts else None

    @property
    def success_text(self) -> str:
        rate = self.success_rate
        if rate is None:
            return "no attempts"
        # Rounded down: a rate just under one must never read as a perfect hundred.
        tenths = math.floor(rate * 1000) / 10
        shown = f"{tenths:.1f}".removesuffix(".0") if rate < 1 else "100"
        return f"{shown} %"


@dataclass(frozen=True)
class MinuteAnswers:
    """Attempts started in the last minute, and those that said the endpoint was past
    its capacity: answered 429 or 503, or no answer at all (a timeout, a refused or
    reset connection)."""

    attempts: int = 0
    answered_429: int = 0
    answered_503: int = 0
    no_answer: int = 0
    capped: bool = False  # True: only the latest MAX_ATTEMPTS_READ attempts were read

    @property
    def overloaded(self) -> int:
        return self.answered_429 + self.answered_503 + self.no_answer


@dataclass(frozen=True)
class EndpointHealth:
    hour: WindowHealth
    day: WindowHealth
    minute: MinuteAnswers = MinuteAnswers()


def percentile(sorted_values: list[int], fraction: float) -> int | None:
    """Nearest-rank percentile: an actual observed value, never an interpolation."""
    if not sorted_values:
        return None
    rank = max(1, -(-len(sorted_values) * fraction // 1))  # ceil without float surprises
    return sorted_values[int(rank) - 1]


def summarize(rows: list[tuple[str, int]], capped: bool = False) -> WindowHealth:
    """(outcome, duration_ms) rows -> their window's numbers."""
    durations = sorted(duration for _, duration in rows)
    delivered = sum(1 for outcome, _ in rows if outcome == Attempt.Outcome.DELIVERED)
    return WindowHealth(
        attempts=len(rows),
        delivered=delivered,
        p50_ms=percentile(durations, 0.50),
        p95_ms=percentile(durations, 0.95),
        capped=capped,
    )


def recent_attempts(endpoint_id: int, now: datetime) -> QuerySet:
    """The endpoint's attempts of the last day, newest first, at most MAX_ATTEMPTS_READ:
    a range scan of attempt_endpoint_started_idx (a test checks the plan)."""
    return (
        Attempt.objects.filter(
            endpoint_id=endpoint_id, started_at__gt=now - DAY, started_at__lte=now
        )
        .order_by("-started_at")
        .values_list("started_at", "outcome", "duration_ms", "status_code")[:MAX_ATTEMPTS_READ]
    )


def minute_answers(rows: list[tuple], minute_start: datetime, capped: bool) -> MinuteAnswers:
    """(started_at, outcome, duration_ms, status_code) rows, newest first -> the last
    minute's answers. A request with no status that did not deliver got no answer."""
    recent = [(outcome, status) for at, outcome, _, status in rows if at > minute_start]
    return MinuteAnswers(
        attempts=len(recent),
        answered_429=sum(1 for _, status in recent if status == 429),
        answered_503=sum(1 for _, status in recent if status == 503),
        no_answer=sum(
            1
            for outcome, status in recent
            if status is None and outcome != Attempt.Outcome.DELIVERED
        ),
        capped=capped and rows[-1][0] > minute_start,
    )


def endpoint_health(endpoint_id: int, now: datetime | None = None) -> EndpointHealth:
    now = now or timezone.now()
    rows = list(recent_attempts(endpoint_id, now))
    capped = len(rows) == MAX_ATTEMPTS_READ
    hour_start = now - HOUR
    in_hour = [(outcome, ms) for at, outcome, ms, _ in rows if at > hour_start]
    # The hour is complete unless even the oldest row read is inside it.
    hour_capped = capped and rows[-1][0] > hour_start
    return EndpointHealth(
        hour=summarize(in_hour, hour_capped),
        day=summarize([(outcome, ms) for _, outcome, ms, _ in rows], capped),
        minute=minute_answers(rows, now - MINUTE, capped),
    )


def health_of(endpoint_ids: list[int], now: datetime | None = None) -> dict[int, EndpointHealth]:
    now = now or timezone.now()
    return {pk: endpoint_health(pk, now) for pk in endpoint_ids}

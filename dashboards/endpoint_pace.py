"""One endpoint's pace in words, for its page: the requests it may have open at once
(its adaptive limit or its cap), why the limit last moved, its overload answers in the
last minute, and its retry budget. Pure: the schedule's EndpointState and the minute's
answers in, sentences out (docs/SCHEDULER.md, "Adaptive limits"
and "Retry budgets")."""

import math
from datetime import UTC, datetime, tzinfo
from typing import Protocol

from delivery.scheduler import EndpointState

from .endpoint_health import MinuteAnswers
from .pacing import clock, count_phrase


class Backoff(Protocol):
    """An adaptive limit's last backoff, as the schedule's EndpointState and its snapshot's
    EndpointRow both carry it."""

    @property
    def baseline_ms(self) -> float | None: ...
    @property
    def backed_off_at(self) -> float | None: ...
    @property
    def backed_off_from(self) -> float | None: ...
    @property
    def backed_off_latency_ms(self) -> float | None: ...


def pace_lines(
    state: EndpointState | None,
    now: datetime,
    tz: tzinfo | None,
    minute: MinuteAnswers | None = None,
    *,
    own_cap: bool = True,
) -> list[str]:
    """Sentences a customer can read; with nothing of it in the schedule, that and the
    minute's overload answers, if any. `own_cap`: the cap is the endpoint's own, not the
    platform's (for an endpoint without one, its ceiling or its fixed cap)."""
    overloads = [_overloads(minute)] if minute and minute.overloaded else []
    if state is None:
        return ["Nothing is queued or in flight for it now.", *overloads]
    cap = state.max_in_flight
    adaptive = state.adaptive_limit is not None
    limit = state.in_flight_limit
    lines = [f"{state.in_flight} of {count_phrase(limit, 'request')} open at once now."]
    if adaptive:
        under = f"its cap of {cap}" if own_cap else f"the platform's ceiling of {cap}"
        lines.append(
            f"Its limit adapts to how it answers: {limit} now, under {under}. "
            + last_move(state, now, tz)
        )
    else:
        whose = "Its cap" if own_cap else "The platform's cap"
        lines.append(f"{whose} of {cap} is fixed (set by the platform's operators).")
    lines += overloads
    lines.append(_retry_budget(state))
    return lines


def _overloads(minute: MinuteAnswers) -> str:
    """ "In the last minute, 37 answered 503 and 2 got no answer (…) of 120 attempts: …" """
    parts = [
        f"{minute.answered_503} answered 503" if minute.answered_503 else "",
        f"{minute.answered_429} answered 429" if minute.answered_429 else "",
        f"{minute.no_answer} got no answer (a timeout or a failed connection)"
        if minute.no_answer
        else "",
    ]
    said = [part for part in parts if part]
    listed = ", ".join(said[:-1]) + " and " + said[-1] if len(said) > 1 else said[0]
    latest = " (its latest attempts read)" if minute.capped else ""
    return (
        f"In the last minute{latest}, {listed} of "
        f"{count_phrase(minute.attempts, 'attempt')}: answers that say it is past its capacity."
    )


def backoff_reason(state: Backoff) -> str | None:
    """Why its adaptive limit last backed off: "latency" (its answers slowed against its
    baseline) or "overload" (they said it was past its capacity); None before any."""
    if state.backed_off_at is None:
        return None
    return "overload" if state.backed_off_latency_ms is None else "latency"


def last_move(state: Backoff, now: datetime, tz: tzinfo | None) -> str:
    """Why its adaptive limit last went down, in a sentence (or that it has not)."""
    reason = backoff_reason(state)
    if reason is None:
        return "It has not backed off: it grows while answers stay fast and successful."
    at = clock(datetime.fromtimestamp(state.backed_off_at, UTC), now, tz)
    moved = f"It last backed off at {at}"
    if state.backed_off_from is not None:
        moved = f"It last backed off from {state.backed_off_from:.0f} at {at}"
    if reason == "latency" and state.baseline_ms:
        return (
            f"{moved}: its answers slowed to {state.backed_off_latency_ms:.0f} ms against "
            f"its usual {state.baseline_ms:.0f} ms."
        )
    return f"{moved}: it answered 429 or 503, timed out or refused the connection."


def _retry_budget(state: EndpointState) -> str:
    tokens, cap = math.floor(state.retry_budget), math.floor(state.retry_budget_cap)
    if tokens < 1:
        return (
            "Its retries wait for their budget: retries into it failed, so the next goes "
            "in a second, or as soon as it accepts deliveries again. New events are not held."
        )
    return (
        f"Retry budget: {tokens} of {cap}. Each retry takes one; each delivery it accepts "
        f"earns a fifth of one, and a retry it accepts its own back."
    )

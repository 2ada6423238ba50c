"""What happens after an attempt: one table from an HttpResult to a Decision.

The choices, and why:

* 2xx: delivered.
* 410 Gone: disable the endpoint. The receiver says the URL is gone for good; the caller
  holds this delivery (and the endpoint's others) until an operator re-enables it.
* Forbidden destination, invalid URL: dead at once. Nothing left our side, and sending
  again cannot succeed until someone edits the endpoint.
* Everything else is retried on the schedule: 5xx, 408, 429, timeouts, the total
  deadline, connection and TLS errors, and also 3xx and the other 4xx. A receiver's
  400/401/404 or a stray redirect is most often a deploy or configuration mistake that
  gets fixed within hours, and dead-lettering on the first one loses events (Svix does
  the same). The schedule's length bounds what a truly broken endpoint costs.
* An error beats a status: a 200 whose body then stalled past the deadline is retried.
  Delivery is at-least-once; a duplicate is better than a loss.
* After the last scheduled retry (attempt_number > len(schedule)) a retry becomes dead.
* The delay is the schedule's entry for this attempt, spread by +/- `jitter` (a fraction)
  so deliveries that failed together do not all come back in the same second. A
  Retry-After on the response is a "not before" time: the delay is the later of the
  two, with Retry-After clamped to [1 s, retry_after_max]. Taking the later one means
  an endpoint answering "Retry-After: 5" through a two-hour outage cannot burn the
  whole schedule in a minute, and one asking for an hour gets its hour.
* A failure inside our own worker (loading, signing, building the request, judging or
  recording it raised: error kind INTERNAL) is retried on the same schedule and then
  dead-lettered, like any failure, so a poison event can never loop or hold a slot. It
  never counts against the endpoint: nothing reached it.
* counts_as_failure: whether the attempt counts toward disabling the endpoint for
  persistent failure. A 429 does not: the endpoint is alive and asks us to slow down,
  which is pacing (the scheduler's job), not breakage.
"""

import random
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from delivery.pipeline import transport
from delivery.pipeline.transport import HttpResult


class Action(StrEnum):
    """What becomes of a delivery after an attempt. delivery.pipeline.records maps each action to
    the Delivery's status and the Attempt's outcome, the models' own vocabulary."""

    DELIVERED = "delivered"
    RETRY = "retry"
    DEAD = "dead"
    DISABLE_ENDPOINT = "disable_endpoint"


MIN_RETRY_AFTER_SECONDS = 1.0
# The error kind of a delivery that failed inside the worker, before or after its request.
INTERNAL = "internal"


@dataclass(frozen=True)
class Decision:
    action: Action
    delay_seconds: float  # for RETRY; 0.0 otherwise
    reason: str  # short human text for the attempt log, e.g. "HTTP 503"
    counts_as_failure: bool


@dataclass(frozen=True)
class _Rule:
    action: Action
    counts_as_failure: bool = True
    reason: str = ""  # format string with {status}; "" means the transport's error text


# Requests that produced no usable response, by HttpResult.error_kind.
_BY_ERROR_KIND: dict[str, _Rule] = {
    transport.TIMEOUT: _Rule(Action.RETRY),
    transport.DEADLINE: _Rule(Action.RETRY),
    transport.CONNECTION: _Rule(Action.RETRY),
    transport.TLS: _Rule(Action.RETRY),  # an expired or mismatched certificate gets fixed
    transport.FORBIDDEN_DESTINATION: _Rule(Action.DEAD),
    transport.INVALID_URL: _Rule(Action.DEAD),
    INTERNAL: _Rule(Action.RETRY, counts_as_failure=False),
}

# Responses, by status code: the first row whose range holds the code wins.
_BY_STATUS: tuple[tuple[range, _Rule], ...] = (
    (range(200, 300), _Rule(Action.DELIVERED, counts_as_failure=False, reason="HTTP {status}")),
    (range(410, 411), _Rule(Action.DISABLE_ENDPOINT, reason="HTTP 410 Gone: endpoint disabled")),
    (
        range(429, 430),
        _Rule(Action.RETRY, counts_as_failure=False, reason="HTTP 429 Too Many Requests"),
    ),
    (range(300, 400), _Rule(Action.RETRY, reason="redirect (HTTP {status}) not followed")),
    (range(1000), _Rule(Action.RETRY, reason="HTTP {status}")),  # 408, other 4xx, 5xx, oddities
)


def decide(
    result: HttpResult,
    attempt_number: int,
    *,
    schedule: Sequence[float],
    jitter: float,
    retry_after_max: float,
    rng: random.Random | None = None,
) -> Decision:
    """What to do after attempt number `attempt_number` (1 for the first) ended in `result`."""
    if attempt_number < 1:
        raise ValueError(f"attempt_number starts at 1, got {attempt_number}")
    rule, reason = _rule_for(result)
    if rule.action != Action.RETRY:
        return Decision(rule.action, 0.0, reason, rule.counts_as_failure)
    if attempt_number > len(schedule):
        reason = f"{reason}; gave up after {attempt_number} attempts"
        return Decision(Action.DEAD, 0.0, reason, rule.counts_as_failure)
    spread = (rng or random).uniform(-jitter, jitter)
    delay = schedule[attempt_number - 1] * (1 + spread)
    if result.retry_after_seconds is not None:
        asked = min(max(result.retry_after_seconds, MIN_RETRY_AFTER_SECONDS), retry_after_max)
        delay = max(delay, asked)
    return Decision(Action.RETRY, delay, reason, rule.counts_as_failure)


def _rule_for(result: HttpResult) -> tuple[_Rule, str]:
    if result.error_kind:
        rule = _BY_ERROR_KIND[result.error_kind]
        reason = result.error or result.error_kind
        if result.status_code is not None:
            reason = f"HTTP {result.status_code}, then {reason}"
        return rule, reason
    status = result.status_code
    for codes, rule in _BY_STATUS:
        if status in codes:
            # A response's own note (a redirect's destination) says more than its code.
            return rule, result.error or rule.reason.format(status=status)
    raise ValueError(f"a result with neither a status nor an error kind: {result!r}")

"""policy.decide: the table from an HttpResult to what happens next."""

import random

import pytest
from django.conf import settings
from hypothesis import given
from hypothesis import strategies as st

from delivery.pipeline import transport
from delivery.pipeline.policy import Action, Decision, decide
from delivery.pipeline.transport import HttpResult

SCHEDULE = (5.0, 300.0, 1800.0)
NO_JITTER = {"schedule": SCHEDULE, "jitter": 0.0, "retry_after_max": 3600.0}


def response(status: int, retry_after: float | None = None) -> HttpResult:
    return HttpResult(status, 12, "", "", "", retry_after)


def failure(kind: str, error: str, status: int | None = None) -> HttpResult:
    return HttpResult(status, 30000, error, kind, "", None)


@pytest.mark.parametrize(
    ("result", "expected"),
    [
        (response(200), Decision(Action.DELIVERED, 0.0, "HTTP 200", False)),
        (response(204), Decision(Action.DELIVERED, 0.0, "HTTP 204", False)),
        (response(299), Decision(Action.DELIVERED, 0.0, "HTTP 299", False)),
        (response(500), Decision(Action.RETRY, 5.0, "HTTP 500", True)),
        (response(502), Decision(Action.RETRY, 5.0, "HTTP 502", True)),
        (response(503), Decision(Action.RETRY, 5.0, "HTTP 503", True)),
        (response(408), Decision(Action.RETRY, 5.0, "HTTP 408", True)),
        (response(429), Decision(Action.RETRY, 5.0, "HTTP 429 Too Many Requests", False)),
        # Other 4xx and 3xx: retried on the schedule (a fixable receiver mistake, see policy).
        (response(400), Decision(Action.RETRY, 5.0, "HTTP 400", True)),
        (response(401), Decision(Action.RETRY, 5.0, "HTTP 401", True)),
        (response(404), Decision(Action.RETRY, 5.0, "HTTP 404", True)),
        (response(301), Decision(Action.RETRY, 5.0, "redirect (HTTP 301) not followed", True)),
        (response(302), Decision(Action.RETRY, 5.0, "redirect (HTTP 302) not followed", True)),
        (response(100), Decision(Action.RETRY, 5.0, "HTTP 100", True)),
        (
            HttpResult(
                302, 10, "redirect to elsewhere.example not followed (HTTP 302)", "", "", None
            ),
            Decision(
                Action.RETRY, 5.0, "redirect to elsewhere.example not followed (HTTP 302)", True
            ),
        ),
        (
            response(410),
            Decision(Action.DISABLE_ENDPOINT, 0.0, "HTTP 410 Gone: endpoint disabled", True),
        ),
        (
            failure(transport.TIMEOUT, "connect timed out after 5 s"),
            Decision(Action.RETRY, 5.0, "connect timed out after 5 s", True),
        ),
        (
            failure(transport.DEADLINE, "no response within 30 s"),
            Decision(Action.RETRY, 5.0, "no response within 30 s", True),
        ),
        (
            failure(transport.DEADLINE, "response body incomplete after 30 s", status=200),
            Decision(Action.RETRY, 5.0, "HTTP 200, then response body incomplete after 30 s", True),
        ),
        (
            failure(transport.CONNECTION, "connection failed: Connection refused"),
            Decision(Action.RETRY, 5.0, "connection failed: Connection refused", True),
        ),
        (
            failure(transport.TLS, "TLS error: certificate verify failed"),
            Decision(Action.RETRY, 5.0, "TLS error: certificate verify failed", True),
        ),
        (
            failure(transport.FORBIDDEN_DESTINATION, "forbidden destination: 10.0.0.1 is private"),
            Decision(Action.DEAD, 0.0, "forbidden destination: 10.0.0.1 is private", True),
        ),
        (
            failure(transport.INVALID_URL, "invalid URL: No host supplied"),
            Decision(Action.DEAD, 0.0, "invalid URL: No host supplied", True),
        ),
    ],
)
def test_first_attempt_outcomes(result, expected):
    assert decide(result, 1, **NO_JITTER) == expected


def test_every_transport_error_kind_has_a_rule():
    for kind in transport.ERROR_KINDS:
        decision = decide(failure(kind, "x"), 1, **NO_JITTER)
        assert decision.action in (Action.RETRY, Action.DEAD)


@pytest.mark.parametrize(("attempt", "delay"), [(1, 5.0), (2, 300.0), (3, 1800.0)])
def test_retries_follow_the_schedule(attempt, delay):
    assert decide(response(503), attempt, **NO_JITTER) == Decision(
        Action.RETRY, delay, "HTTP 503", True
    )


@pytest.mark.parametrize("status", [503, 429, 404])
def test_after_the_last_scheduled_retry_the_delivery_is_dead(status):
    decision = decide(response(status), len(SCHEDULE) + 1, **NO_JITTER)
    assert decision.action == Action.DEAD
    assert decision.reason.endswith("; gave up after 4 attempts")


def test_permanent_outcomes_do_not_depend_on_the_attempt_number():
    assert decide(response(200), 99, **NO_JITTER).action == Action.DELIVERED
    assert decide(response(410), 99, **NO_JITTER).action == Action.DISABLE_ENDPOINT


@given(
    attempt=st.integers(min_value=1, max_value=len(SCHEDULE)),
    jitter=st.floats(min_value=0.0, max_value=0.5),
    seed=st.integers(),
)
def test_jitter_stays_within_its_bounds(attempt, jitter, seed):
    decision = decide(
        response(500),
        attempt,
        schedule=SCHEDULE,
        jitter=jitter,
        retry_after_max=3600.0,
        rng=random.Random(seed),
    )
    base = SCHEDULE[attempt - 1]
    assert base * (1 - jitter) <= decision.delay_seconds <= base * (1 + jitter)


def test_jitter_spreads_retries_that_failed_together():
    rng = random.Random(7)
    delays = {
        decide(
            response(503), 2, schedule=SCHEDULE, jitter=0.2, retry_after_max=3600.0, rng=rng
        ).delay_seconds
        for _ in range(50)
    }
    assert len(delays) == 50
    assert min(delays) < 300 < max(delays)


@pytest.mark.parametrize(
    ("retry_after", "first_delay", "third_delay"),
    [
        (
            120.0,
            120.0,
            1800.0,
        ),  # "not before": later than the schedule's 5 s, not sooner than 1800 s
        (10_000.0, 3600.0, 3600.0),  # clamped to retry_after_max
        (float("inf"), 3600.0, 3600.0),
        (0.0, 5.0, 1800.0),  # never sooner than the schedule: a hot loop cannot burn the retries
    ],
)
def test_retry_after_is_a_not_before_time_within_bounds(retry_after, first_delay, third_delay):
    first = decide(response(503, retry_after), 1, **NO_JITTER)
    third = decide(response(503, retry_after), 3, **NO_JITTER)
    assert (first.action, first.delay_seconds) == (Action.RETRY, first_delay)
    assert (third.action, third.delay_seconds) == (Action.RETRY, third_delay)


def test_retry_after_neither_delays_success_nor_extends_the_schedule():
    assert decide(response(200, 60.0), 1, **NO_JITTER) == Decision(
        Action.DELIVERED, 0.0, "HTTP 200", False
    )
    assert decide(response(429, 60.0), len(SCHEDULE) + 1, **NO_JITTER).action == Action.DEAD


def test_attempt_numbers_start_at_one():
    with pytest.raises(ValueError, match="starts at 1"):
        decide(response(500), 0, **NO_JITTER)


def test_the_settings_plug_straight_in():
    decision = decide(
        response(500),
        len(settings.RETRY_SCHEDULE_SECONDS) + 1,
        schedule=settings.RETRY_SCHEDULE_SECONDS,
        jitter=settings.RETRY_JITTER,
        retry_after_max=settings.RETRY_AFTER_MAX_SECONDS,
    )
    assert decision.action == Action.DEAD

"""An endpoint's pace in words (dashboards.endpoint_pace): its limit, why it last moved,
and its retry budget, from the schedule's EndpointState; and on the endpoint's page."""

from datetime import UTC, datetime

import pytest
from django.urls import reverse

from dashboards.endpoint_health import MinuteAnswers
from dashboards.endpoint_pace import pace_lines
from delivery.models import Attempt, Delivery
from delivery.scheduler import EndpointState, get_scheduler
from ingest.publish import publish
from tenants.models import Membership
from tests.factories import make_endpoint, make_tenant, make_user

NOW = datetime(2026, 12, 7, 14, 0, tzinfo=UTC)


def state(**fields) -> EndpointState:
    values = {"in_flight": 3, "max_in_flight": 40, "retry_budget": 6.0, "retry_budget_cap": 8.0}
    return EndpointState(**{**values, **fields})


def test_an_idle_endpoint_has_nothing_in_the_schedule() -> None:
    assert pace_lines(None, NOW, UTC) == ["Nothing is queued or in flight for it now."]


def test_a_fixed_cap_and_a_full_budget() -> None:
    lines = pace_lines(state(retry_budget=80.0, retry_budget_cap=80.0), NOW, UTC)
    assert lines[0] == "3 of 40 requests open at once now."
    assert lines[1] == "Its cap of 40 is fixed (set by the platform's operators)."
    assert lines[2].startswith("Retry budget: 80 of 80.")


def test_a_limit_that_backed_off_on_slow_answers_says_from_what_and_why() -> None:
    backed_off = NOW.timestamp() - 60
    lines = pace_lines(
        state(
            adaptive_limit=12.6,
            latency_ms=300,
            baseline_ms=180,
            backed_off_at=backed_off,
            backed_off_from=40,
            backed_off_latency_ms=900,
        ),
        NOW,
        UTC,
    )
    assert lines[0] == "3 of 12 requests open at once now."
    assert lines[1] == (
        "Its limit adapts to how it answers: 12 now, under its cap of 40. It last backed off "
        "from 40 at 13:59 UTC: its answers slowed to 900 ms against its usual 180 ms."
    )


def test_a_limit_that_backed_off_on_an_overload_says_so() -> None:
    lines = pace_lines(
        state(adaptive_limit=5, backed_off_at=NOW.timestamp(), backed_off_from=10), NOW, UTC
    )
    assert lines[1].endswith(
        "from 10 at 14:00 UTC: it answered 429 or 503, timed out or refused the connection."
    )


def test_without_a_cap_of_its_own_the_platforms_is_named() -> None:
    adapting = pace_lines(state(adaptive_limit=8, max_in_flight=64), NOW, UTC, own_cap=False)
    assert adapting[1].startswith(
        "Its limit adapts to how it answers: 8 now, under the platform's ceiling of 64."
    )
    fixed = pace_lines(state(max_in_flight=2), NOW, UTC, own_cap=False)
    assert fixed[1] == "The platform's cap of 2 is fixed (set by the platform's operators)."


def test_a_limit_that_never_backed_off_says_it_grows() -> None:
    lines = pace_lines(state(adaptive_limit=8), NOW, UTC)
    assert "It has not backed off" in lines[1]


def test_retries_out_of_budget_say_they_wait_and_new_events_do_not() -> None:
    lines = pace_lines(state(retry_budget=0.4), NOW, UTC)
    assert lines[2].startswith("Its retries wait for their budget")
    assert "New events are not held." in lines[2]


def test_the_last_minutes_overload_answers_say_why_it_backs_off() -> None:
    minute = MinuteAnswers(attempts=120, answered_503=37, answered_429=4, no_answer=2)
    lines = pace_lines(state(adaptive_limit=12), NOW, UTC, minute)
    assert lines[2] == (
        "In the last minute, 37 answered 503, 4 answered 429 and 2 got no answer (a timeout "
        "or a failed connection) of 120 attempts: answers that say it is past its capacity."
    )
    assert lines[3].startswith("Retry budget")
    only = pace_lines(None, NOW, UTC, MinuteAnswers(attempts=9, answered_429=1, capped=True))
    assert only[1] == (
        "In the last minute (its latest attempts read), 1 answered 429 of 9 attempts: answers "
        "that say it is past its capacity."
    )
    # A minute of good answers adds nothing.
    assert len(pace_lines(state(), NOW, UTC, MinuteAnswers(attempts=50))) == 3


@pytest.mark.django_db(transaction=True)
def test_the_endpoint_page_shows_its_pace_from_the_schedule(client, settings) -> None:
    settings.DELIVERY_ADAPTIVE_CONCURRENCY = "all"
    tenant = make_tenant("pace.example")
    endpoint = make_endpoint(tenant, "http://127.0.0.1:9/pace", max_in_flight=20)
    client.force_login(make_user("ada", tenant=tenant, role=Membership.ADMIN))
    page = reverse("tenants:endpoint", args=[tenant.key, endpoint.pk])
    assert "Nothing is queued or in flight for it now." in client.get(page).content.decode()
    publish(tenant, "x", {})
    assert len(get_scheduler().pick("w", 10).leases) == 1
    html = client.get(page).content.decode()
    assert "1 of 4 requests open at once now." in html
    assert "Its limit adapts to how it answers: 4 now, under its cap of 20." in html
    assert "Retry budget: 8 of 8." in html
    Attempt.objects.create(
        delivery=Delivery.objects.get(),
        endpoint=endpoint,
        number=1,
        outcome="retry",
        status_code=503,
    )
    html = client.get(page).content.decode()
    assert "In the last minute, 1 answered 503 of 1 attempt:" in html

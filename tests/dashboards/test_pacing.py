"""The pacing status in words: one test per status, then the numbers people read."""

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from dashboards import pacing
from dashboards.pacing import EndpointFacts, PlatformFacts, Status, TenantFacts
from delivery.scheduler import EndpointRow

NOW = datetime(2026, 3, 3, 14, 0, tzinfo=UTC)
HEALTHY = EndpointFacts(label="https://shop.example/hooks", max_in_flight=4)


NOBODY_ELSE = PlatformFacts()


def assess(facts: TenantFacts, platform: PlatformFacts = NOBODY_ELSE) -> pacing.Pacing:
    return pacing.assess(facts, platform, now=NOW)


def test_nothing_waiting_is_on_pace() -> None:
    result = assess(TenantFacts(endpoints=(HEALTHY,)))
    assert result.status is Status.ON_PACE
    assert result.label == "on pace"
    assert "Nothing is waiting" in result.explanation
    assert result.drain_seconds is None


def test_alone_with_a_backlog_is_on_pace_with_an_estimate() -> None:
    facts = TenantFacts(
        fresh=600, oldest_age_seconds=30, delivered_last_minute=1200, endpoints=(HEALTHY,)
    )
    result = assess(facts, PlatformFacts(backlogged_tenants=1, backlogged_weight=1))
    assert result.status is Status.ON_PACE
    assert result.drain_seconds == 30
    assert "20 per second" in result.explanation


def test_sharing_turns_with_a_real_backlog_is_paced_and_explained_with_numbers() -> None:
    facts = TenantFacts(
        fresh=2_000_000,
        in_flight=16,
        oldest_age_seconds=420,
        delivered_last_minute=84_000,  # 1,400 per second
        received_recently=2_140_000,
        endpoints=(HEALTHY,),
    )
    result = assess(facts, PlatformFacts(backlogged_tenants=4, backlogged_weight=4))
    assert result.status is Status.PACED
    assert result.label == "paced (sharing turns with 3 other backlogged tenants)"
    assert result.share_of_turns == 0.25
    assert result.other_backlogged == 3
    assert result.explanation.startswith("You sent 2.1 million events in the last 10 minutes.")
    assert "We deliver every tenant's events in turn" in result.explanation
    assert "about 1,400 per second" in result.explanation
    assert "25% of the turns" in result.explanation
    # 2,000,016 / 1,400 per second = 1,428.6 s after 14:00 -> 14:23
    assert result.clears_at == NOW + timedelta(seconds=2_000_016 / 1400)
    assert "clear around 14:23 UTC" in result.explanation
    assert result.explanation.endswith("Nothing is lost.")


def test_a_short_wait_while_others_are_backlogged_is_still_on_pace() -> None:
    facts = TenantFacts(fresh=3, oldest_age_seconds=0.4, endpoints=(HEALTHY,))
    result = assess(facts, PlatformFacts(backlogged_tenants=5, backlogged_weight=5))
    assert result.status is Status.ON_PACE


def test_weight_shows_in_the_share_and_the_words() -> None:
    facts = TenantFacts(weight=4, fresh=100, oldest_age_seconds=60, endpoints=(HEALTHY,))
    result = assess(facts, PlatformFacts(backlogged_tenants=3, backlogged_weight=6))
    assert result.status is Status.PACED
    assert result.share_of_turns == pytest.approx(4 / 6)
    assert "your weight of 4 gives you 67% of the turns" in result.explanation


def test_endpoint_at_its_cap_with_work_parked_behind_it() -> None:
    capped = EndpointFacts(
        label="https://slow.example/", in_flight=2, max_in_flight=2, parked_lanes=1
    )
    facts = TenantFacts(
        fresh=500, oldest_age_seconds=90, delivered_last_minute=120, endpoints=(capped,)
    )
    result = assess(facts, PlatformFacts(backlogged_tenants=3, backlogged_weight=3))
    assert result.status is Status.AT_CAP
    assert result.label == "endpoint at its concurrency cap"
    assert Status.PACED in result.reasons  # both apply; the cap explains more
    assert "takes at most 2 requests at a time" in result.explanation
    assert "https://slow.example/" in result.explanation


def test_a_full_endpoint_with_nothing_parked_holds_nobody_up() -> None:
    busy = EndpointFacts(label="x", in_flight=2, max_in_flight=2, parked_lanes=0)
    assert not busy.at_cap
    result = assess(TenantFacts(fresh=1, oldest_age_seconds=1, endpoints=(busy,)))
    assert result.status is Status.ON_PACE


def test_a_tenant_at_its_own_rate_limit_is_told_the_rate_paces_it() -> None:
    facts = TenantFacts(
        fresh=3_000,
        oldest_age_seconds=300,
        delivered_last_minute=600,  # 10 per second: its whole rate
        rate_limit_per_second=10,
        rate_limited=True,
        endpoints=(HEALTHY,),
    )
    result = assess(facts, PlatformFacts(backlogged_tenants=3, backlogged_weight=3))
    assert result.status is Status.RATE_LIMITED
    assert result.label == "at its delivery rate limit"
    assert Status.PACED in result.reasons  # others wait too, but the rate explains more
    assert result.headline == "Your delivery rate limit paces your events"
    assert "at most 10 per second for you" in result.explanation
    assert "even when we have spare capacity" in result.explanation
    assert "clear around 14:05 UTC" in result.explanation  # 3,000 / 10 per second


def test_a_rate_limit_far_above_the_pace_is_not_the_reason() -> None:
    facts = TenantFacts(
        fresh=10,
        oldest_age_seconds=1,
        delivered_last_minute=60,  # 1 per second, under a 100/s limit
        rate_limit_per_second=100,
        endpoints=(HEALTHY,),
    )
    assert not facts.at_rate_limit
    assert assess(facts).status is Status.ON_PACE


def test_an_endpoint_rate_limit_with_work_parked_behind_it() -> None:
    limited = EndpointFacts(
        label="https://slow.example/", rate_per_second=0.5, rate_limited=True, parked_lanes=1
    )
    facts = TenantFacts(
        fresh=30, oldest_age_seconds=40, delivered_last_minute=30, endpoints=(limited,)
    )
    result = assess(facts)
    assert result.status is Status.RATE_LIMITED
    assert result.headline == "Your endpoint's rate limit paces your events"
    assert "https://slow.example/ is limited to 30 per minute" in result.explanation


def test_an_endpoint_waiting_out_its_retry_after() -> None:
    waiting = EndpointFacts(
        label="https://busy.example/",
        paused_until=NOW + timedelta(minutes=2),
        rate_limited=True,
        parked_lanes=1,
        consecutive_failures=1,
    )
    result = assess(TenantFacts(fresh=7, retry=1, endpoints=(waiting,)))
    assert result.status is Status.ENDPOINT_WAIT
    assert Status.FAILING in result.reasons
    assert result.label == "endpoint asked us to wait (Retry-After)"
    assert "answered with Retry-After" in result.explanation
    assert "until 14:02 UTC" in result.explanation
    assert "8 events wait" in result.explanation
    assert not waiting.at_rate  # a pause is not the endpoint's rate


def test_live_endpoint_fields_come_from_the_snapshot_row() -> None:
    row = EndpointRow(
        endpoint_id=1,
        in_flight=2,
        max_in_flight=4,
        retry_in_flight=0,
        retry_max_in_flight=1,
        parked_lanes=3,
        rate_per_second=5.0,
        paused_until=NOW.timestamp() + 60,
        rate_limited=True,
    )
    fields = pacing.live_endpoint_fields(row)
    assert fields == {
        "in_flight": 2,
        "limit": 4,
        "adaptive": False,
        "parked_lanes": 3,
        "rate_per_second": 5.0,
        "paused_until": NOW + timedelta(seconds=60),
        "rate_limited": True,
    }
    assert pacing.live_endpoint_fields(None) == {}
    adaptive = pacing.live_endpoint_fields(replace(row, adaptive_limit=2.7))
    assert (adaptive["limit"], adaptive["adaptive"]) == (2, True)  # its whole part binds


def test_an_endpoint_at_its_adaptive_limit_under_its_cap_is_at_cap() -> None:
    full = pacing.EndpointFacts(
        label="x", in_flight=3, max_in_flight=40, limit=3, adaptive=True, parked_lanes=1
    )
    assert full.at_cap
    assert not replace(full, limit=0).at_cap  # against the cap of 40 it had room


def test_failing_endpoint_with_retries_waiting() -> None:
    failing = EndpointFacts(
        label="https://down.example/",
        max_in_flight=2,
        consecutive_failures=7,
        failing_since=NOW - timedelta(minutes=20),
        last_error="HTTP 503",
        next_retry_at=NOW + timedelta(minutes=5),
    )
    result = assess(TenantFacts(retry=3, delayed=40, endpoints=(failing,)))
    assert result.status is Status.FAILING
    assert result.label == "endpoint failing (retrying)"
    assert "has failed 7 times in a row since 13:40 UTC (last: HTTP 503)" in result.explanation
    assert "next retry is due at 14:05 UTC" in result.explanation


def test_failing_endpoint_without_retries_of_this_tenant_is_not_its_reason() -> None:
    failing = EndpointFacts(label="x", consecutive_failures=2)
    assert assess(TenantFacts(endpoints=(failing,))).status is Status.ON_PACE


def test_disabled_endpoint_holding_work() -> None:
    disabled = EndpointFacts(
        label="https://gone.example/",
        enabled=False,
        held=12,
        disabled_reason="Disabled: HTTP 410 Gone at 2026-03-03 13:00 UTC",
    )
    result = assess(TenantFacts(held=12, endpoints=(disabled,)))
    assert result.status is Status.DISABLED
    assert result.label == "endpoint disabled (held)"
    assert "12 events for it are held" in result.explanation
    assert "HTTP 410 Gone" in result.explanation
    assert result.drain_seconds is None  # nothing moves held work


def test_paused_tenant_wins_over_everything() -> None:
    capped = EndpointFacts(label="x", in_flight=1, max_in_flight=1, parked_lanes=1)
    facts = TenantFacts(
        paused=True, fresh=50, oldest_age_seconds=600, delivered_last_minute=10, endpoints=(capped,)
    )
    result = assess(facts, PlatformFacts(backlogged_tenants=3, backlogged_weight=3))
    assert result.status is Status.PAUSED
    assert result.label == "tenant paused"
    assert result.share_of_turns == 0
    assert result.drain_seconds is None
    assert "paused by our operators" in result.explanation
    assert "50 events waiting" in result.explanation


def test_share_of_a_tenant_without_backlog_is_what_it_would_get_on_arrival() -> None:
    share = pacing.share_of_turns(TenantFacts(weight=2), PlatformFacts(3, 6))
    assert share == pytest.approx(2 / 8)
    assert pacing.share_of_turns(TenantFacts(), PlatformFacts()) == 1.0


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0"),
        (7, "7"),
        (14_230, "14,230"),
        (1_000_000, "1.0 million"),
        (2_140_000, "2.1 million"),
        (3_400_000_000, "3.4 billion"),
    ],
)
def test_human_count(n: int, text: str) -> None:
    assert pacing.human_count(n) == text


@pytest.mark.parametrize(
    ("per_second", "text"),
    [
        (1412, "1,400 per second"),
        (23.4, "23 per second"),
        (2.5, "2.5 per second"),
        (0.5, "30 per minute"),
        (0, "no deliveries in the last minute"),
    ],
)
def test_rate_phrase(per_second: float, text: str) -> None:
    assert pacing.rate_phrase(per_second) == text


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(4, "4 s"), (600, "10 min"), (3 * 3600 + 1200, "3 h 20 min"), (50 * 3600, "2 d 2 h")],
)
def test_duration(seconds: float, text: str) -> None:
    assert pacing.duration(seconds) == text


def test_clock_names_the_day_when_it_is_not_today() -> None:
    assert pacing.clock(NOW + timedelta(minutes=20), NOW) == "14:20 UTC"
    assert pacing.clock(NOW + timedelta(days=1), NOW) == "4 Mar, 14:00 UTC"


def test_recent_rate_prefers_the_short_window_when_it_holds_enough() -> None:
    # A flood 10 s old: 250 in the last 15 s is 16.7/s, the minute's average only 4.2/s.
    assert pacing.recent_rate(last_minute=250, last_window=250) == pytest.approx(250 / 15)
    # A trickle: 5 in 15 s is noise; the minute says 12 per minute.
    assert pacing.recent_rate(last_minute=12, last_window=5) == pytest.approx(0.2)
    facts = TenantFacts(fresh=100, delivered_last_minute=60, rate_per_second=10)
    assert pacing.drain_seconds(facts) == 10


def test_platform_facts_leave_paused_tenants_out_and_estimate_the_unseen() -> None:
    from delivery.scheduler import Snapshot, TenantRow

    def row(tenant_id: int, weight: int, paused: bool = False) -> TenantRow:
        return TenantRow(tenant_id, 5, 0, 0, 0, 30.0, weight, paused)

    snapshot = Snapshot(
        active_tenants=6,
        backlogged_tenants=5,  # two of them beyond the top-3 the snapshot lists
        fresh_depth=25,
        retry_depth=0,
        delayed_depth=0,
        in_flight=0,
        fallback_enqueued_total=0,
        fallback_depth=0,
        deferrals_total=0,
        oldest_age_seconds=30.0,
        tenants=[row(1, 4), row(2, 1, paused=True), row(3, 2)],
        endpoints=[],
        age_histogram={},
    )
    assert pacing.platform_facts(snapshot) == PlatformFacts(
        backlogged_tenants=4, backlogged_weight=4 + 2 + 2
    )
    assert pacing.platform_facts(None) == PlatformFacts()

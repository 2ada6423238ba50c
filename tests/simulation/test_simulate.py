"""`manage.py simulate` keeps working: each scenario end to end at a tiny size.

Real worker subprocesses, real Redis (a database simulate picks for itself, never the
tests' own), a temporary SQLite database and the simulation's own receiver. The sizes
prove the plumbing and the report, not the platform's speed: docs/BENCHMARKS.md has
the full-size figures.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from core import redis_connection
from simulation.environment import SCHEDULE_TAG_BASE, child_env, schedule_env
from simulation.report import FIGURES
from simulation.runner import worker_settings
from simulation.scenarios import Setup, runs_for

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--workers", "1", "--slots", "8", "--timeout", "60"]


def simulate(*args: str, tmp_path: Path, printed: list[str] | None = None) -> dict:
    out = tmp_path / "figures.json"
    done = subprocess.run(
        [sys.executable, "manage.py", "simulate", *args, *TINY, "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    if printed is not None:
        printed.append(done.stdout)
    return json.loads(out.read_text())


@pytest.mark.slow
def test_flood_compare_reports_both_schedulers_and_draws_them(tmp_path: Path) -> None:
    plot = tmp_path / "flood.svg"
    figures = simulate(
        "flood",
        "--compare",
        *("--loud-events", "300", "--quiet-tenants", "5", "--quiet-events", "2"),
        *("--seconds", "0.5", "--quiet-seconds", "1", "--plot", str(plot)),
        tmp_path=tmp_path,
    )
    assert set(figures["runs"]) == {"fair", "fifo"}
    for run in figures["runs"].values():
        assert set(FIGURES) <= set(run)
        assert run["delivered"] == 310
        assert run["quiet_p99_ms"] is not None and run["loud_done_s"] > 0
        assert run["deliveries_per_s"] > 0
        # The Redis server's work per delivery over the run (#21's figures): every
        # delivery is at least enqueued, picked and acknowledged.
        assert run["redis_commands_per_delivery"] >= 3
        assert run["redis_cpu_us_per_delivery"] > 0
    assert [goal["goal"] for goal in figures["goals"]] == [">= 100", ">= 0.9"]
    assert plot.read_text().startswith("<svg") and "fifo, quiet tenants" in plot.read_text()


@pytest.mark.slow
def test_a_flood_runs_with_its_schedule_sharded_on_a_redis_cluster(
    tmp_path: Path, redis_cluster
) -> None:
    redis_cluster.flush()
    figures = simulate(
        "flood",
        *("--shards", "3", "--scheduler-redis-url", redis_cluster.url),
        *("--loud-events", "300", "--quiet-tenants", "5", "--quiet-events", "2"),
        *("--seconds", "0.5", "--quiet-seconds", "1"),
        tmp_path=tmp_path,
    )
    assert figures["runs"]["fair"]["delivered"] == 310
    # Not measured: the schedule's work was on the cluster, not on the run's Redis.
    assert figures["runs"]["fair"]["redis_commands_per_delivery"] is None
    # The schedule was on the cluster, under the simulation's own tags, one per shard.
    client = redis_connection.connect(redis_cluster.url)
    tags = [SCHEDULE_TAG_BASE + i for i in range(3)]
    assert all(client.exists(f"wh-simulate:{{{tag}}}") for tag in tags)
    assert client.exists(*(f"wh:{{{tag}}}:epoch:5" for tag in tags)) == 3


def test_a_schedule_the_simulation_did_not_write_is_not_cleared(redis_conn, settings) -> None:
    from delivery.scheduler import get_scheduler, reset_scheduler
    from simulation.runner import claim_schedule

    settings.SCHEDULER_SHARD = SCHEDULE_TAG_BASE
    settings.SCHEDULER_SHARDS = 2
    reset_scheduler()
    try:
        scheduler = get_scheduler()
        theirs = scheduler.shards[1]
        theirs.start_epoch()  # somebody's schedule under the second tag
        with pytest.raises(RuntimeError, match="did not write; refusing to clear it"):
            claim_schedule(scheduler)
        assert redis_conn.exists(theirs.keys.epoch)  # left alone
        redis_conn.set(f"wh-simulate:{{{theirs.shard}}}", "1")  # the simulation's, after all
        claim_schedule(scheduler)
        assert not redis_conn.exists(theirs.keys.epoch)
    finally:
        reset_scheduler()


def test_the_schedule_url_reaches_every_process_of_a_run(tmp_path: Path) -> None:
    (fair,) = runs_for("flood", "fair", no_caps=False, compare=False, shards=3)
    url = "redis+cluster://127.0.0.1:7000,127.0.0.1:7001"
    setup = Setup(plan=[], expected=0, worker_env={})
    options = {"slots": 8, "scheduler_redis_url": url}
    env = child_env("sqlite:///x", "redis://127.0.0.1:6379/12", tmp_path, **schedule_env(options))
    workers = child_env(
        "sqlite:///x",
        "redis://127.0.0.1:6379/12",
        tmp_path,
        **worker_settings(fair, options, setup),
    )
    for one in (env, workers):
        assert (one["SCHEDULER_REDIS_URL"], one["SCHEDULER_SHARD"]) == (url, str(SCHEDULE_TAG_BASE))
    assert workers["SCHEDULER_SHARDS"] == "3"


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("http://127.0.0.1:6379", "must be a redis://, rediss://, unix:// or redis\\+cluster://"),
        ("redis+cluster://nohost", "'nohost' in 'redis\\+cluster://nohost' is not host:port"),
    ],
)
def test_a_bad_schedule_url_is_refused_before_anything_starts(url: str, message: str) -> None:
    with pytest.raises(CommandError, match=message):
        call_command("simulate", "flood", "--scheduler-redis-url", url)


def test_a_schedule_urls_password_is_not_printed() -> None:
    assert redis_connection.without_password("redis://:s3cret@h:1/0") == "redis://:***@h:1/0"
    assert (
        redis_connection.without_password("redis+cluster://u:p%40ss@a:1,b:2")
        == "redis+cluster://u:***@a:1,b:2"
    )
    assert redis_connection.without_password("redis://h:1/0") == "redis://h:1/0"


@pytest.mark.slow
def test_an_unsized_flood_is_sized_from_a_probe_of_the_workers(tmp_path: Path) -> None:
    printed: list[str] = []
    figures = simulate(
        "flood",
        *("--quiet-tenants", "5", "--quiet-events", "2", "--seconds", "0.5"),
        *("--quiet-seconds", "1"),
        tmp_path=tmp_path,
        printed=printed,
    )
    found = figures["options"]["calibration"]
    assert found["delivered_per_s"] > 0
    # The flood offers OVERLOAD times what the probe saw delivered, over --seconds.
    expected = int(round(found["delivered_per_s"] * found["overload"] * 0.5, -3))
    assert figures["options"]["loud_events"] == found["loud_events"] == expected > 0
    assert figures["runs"]["fair"]["delivered"] == expected + 10
    assert "calibration: 1 workers x 8 slots delivered" in printed[0]


@pytest.mark.slow
def test_slow_endpoints_hung_ones_hold_no_more_than_their_caps(tmp_path: Path) -> None:
    figures = simulate(
        "slow-endpoints",
        *("--endpoints", "6", "--hung", "2", "--endpoint-timeout", "1"),
        *("--rate", "4", "--seconds", "2"),
        tmp_path=tmp_path,
    )
    run = figures["runs"]["fair"]
    assert run["groups"]["healthy"]["missing"] == 0
    assert run["healthy_p99_ms"] is not None
    assert 0 < run["hung_slots_max"] <= 2 * 2  # hung endpoints x the default cap of 2
    assert run["hung_open_requests_max"] <= 2 * 2


@pytest.mark.slow
def test_hung_endpoints_without_caps_hold_no_more_than_a_new_adaptive_limit(
    tmp_path: Path,
) -> None:
    figures = simulate(
        "slow-endpoints",
        "--adaptive",
        *("--endpoints", "6", "--hung", "2", "--endpoint-timeout", "1"),
        *("--rate", "4", "--seconds", "2"),
        tmp_path=tmp_path,
    )
    assert figures["options"]["adaptive"] is True
    run = figures["runs"]["fair"]
    assert run["groups"]["healthy"]["missing"] == 0
    # No cap of their own: the platform's ceiling of 64. A limit starts at 4 and grows
    # only on fast answers, which a hung endpoint never gives.
    assert 0 < run["hung_slots_max"] <= 2 * 4
    assert run["hung_open_requests_max"] <= 2 * 4


def test_adaptive_reaches_the_capped_fair_runs_only_and_not_fragile_endpoints() -> None:
    fair, fifo = runs_for("flood", "fair", no_caps=False, compare=True, adaptive=True)
    assert (fair.adaptive, fifo.adaptive) == (True, False)
    assert not any(spec.adaptive for spec in runs_for("slow-endpoints", "fair", False, True))
    # The no-caps baseline stays one: limits that adapt are limits.
    slow = runs_for("slow-endpoints", "fair", False, True, adaptive=True)
    assert {spec.label: spec.adaptive for spec in slow} == {
        "fair": True,
        "no-caps": False,
        "no-hang": True,
    }
    with pytest.raises(CommandError, match="fragile-endpoints has its adaptive run already"):
        call_command("simulate", "fragile-endpoints", "--adaptive")
    with pytest.raises(CommandError, match="choose one"):
        call_command("simulate", "flood", "--no-caps", "--adaptive")


@pytest.mark.slow
def test_retry_storm_retries_stay_within_the_retry_cap(tmp_path: Path) -> None:
    figures = simulate(
        "retry-storm",
        *("--tenants", "3", "--storm-rate", "20", "--service-ms", "5"),
        *("--outage-start", "0.5", "--outage-seconds", "1.5", "--seconds", "3"),
        tmp_path=tmp_path,
    )
    run = figures["runs"]["fair"]
    assert run["groups"]["large"]["missing"] == 0
    assert run["storm_peak_retry_rps_after_recovery"] > 0  # the outage left retries behind
    assert run["storm_retry_open_max"] == 1  # retry_max_in_flight
    assert run["storm_open_max"] <= 4  # max_in_flight


def test_a_knob_of_another_scenario_is_refused() -> None:
    with pytest.raises(CommandError, match="--hung does not apply to flood"):
        call_command("simulate", "flood", "--hung", "3")


def test_shards_reach_the_fair_runs_workers_and_fifo_stays_one_queue(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # The caller's own schedule URL must not lead the workers away from the claimed database.
    monkeypatch.setenv("SCHEDULER_REDIS_URL", "redis://127.0.0.1:1/0")
    fair, fifo = runs_for("flood", "fair", no_caps=False, compare=True, shards=3)
    setup = Setup(plan=[], expected=0, worker_env={"RETRY_SCHEDULE_SECONDS": "1"})
    envs = {
        spec.label: child_env(
            "sqlite:///x",
            "redis://127.0.0.1:6379/12",
            tmp_path,
            **worker_settings(spec, {"slots": 8}, setup),
        )
        for spec in (fair, fifo)
    }
    assert (envs["fair"]["SCHEDULER_MODE"], envs["fair"]["SCHEDULER_SHARDS"]) == ("fair", "3")
    assert (envs["fifo"]["SCHEDULER_MODE"], envs["fifo"]["SCHEDULER_SHARDS"]) == ("fifo", "1")
    for env in envs.values():
        assert env["SCHEDULER_REDIS_URL"] == ""
        assert env["DELIVERY_CONCURRENCY"] == "8" and env["RETRY_SCHEDULE_SECONDS"] == "1"
    # Without --compare every run in fair mode gets them, the no-caps baseline included.
    assert [s.shards for s in runs_for("slow-endpoints", "fair", False, True, 2)] == [2, 2, 2]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--shards", "0"], "--shards must be from 1 to 64"),
        (["--shards", "65"], "--shards must be from 1 to 64"),
        (["--scheduler", "fifo", "--shards", "3"], "--shards applies to the fair scheduler only"),
    ],
)
def test_shards_out_of_range_or_with_fifo_are_refused(args: list[str], message: str) -> None:
    with pytest.raises(CommandError, match=message):
        call_command("simulate", "flood", *args)


@pytest.mark.slow
def test_fragile_endpoints_compares_the_adaptive_limit_with_a_static_cap_and_no_cap(
    tmp_path: Path,
) -> None:
    figures = simulate(
        "fragile-endpoints",
        "--compare",
        *("--seconds", "6", "--capacity", "2", "--cap", "2", "--service-ms", "50"),
        *("--fragile-rate", "100", "--tenants", "2"),
        tmp_path=tmp_path,
    )
    runs = figures["runs"]
    static, no_caps, adaptive = runs["static"], runs["no-caps"], runs["adaptive"]
    for run in (static, no_caps, adaptive):
        # C = 2, halved after a third of the window and doubled back after two.
        assert [capacity for _, capacity in run["capacity_changes"]] == [2, 1, 2]
        assert run["quiet_p99_ms"] is not None and run["capacity_per_s"] > 0
    # A cap of 2 never opens more than 2C requests, even while C is 1: no 503.
    assert static["fragile_open_max"] <= 2
    assert static["overload_error_share"] == 0
    assert 0.5 < static["goodput_to_capacity"] <= 1.2
    # Eight slots and no cap: past 2C at once, the receiver answers 503.
    assert no_caps["fragile_open_max"] > 2
    assert no_caps["overload_error_share"] > 0
    # The adaptive limit, uncapped as well, backs off: a fraction of no cap's 503s.
    assert adaptive["goodput_to_capacity"] > 0.5
    assert adaptive["overload_error_share"] < no_caps["overload_error_share"] / 2
    # The goals' figures under the issue's names, at the top of --json.
    assert figures["goodput_to_capacity"] == adaptive["goodput_to_capacity"]
    assert figures["goodput_to_capacity_static"] == static["goodput_to_capacity"]
    assert figures["overload_error_share_nocap"] == no_caps["overload_error_share"]
    assert {"converge_s", "quiet_p99_ratio", "overload_error_share"} <= set(figures)

"""`make run`'s platform, as a newcomer starts it: within 150 s the loud shop is paced
with a real backlog, retries and dead letters exist, and the terminal stays readable."""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from tests.private_redis import free_port

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
GOAL_SECONDS = 150.0
MAX_LOG_LINES = 400  # in GOAL_SECONDS


def read_metrics(base: str, token: str) -> list:
    answer = requests.get(
        f"{base}/metrics", headers={"Authorization": f"Bearer {token}"}, timeout=30
    )
    answer.raise_for_status()
    return [
        sample
        for family in text_string_to_metric_families(answer.text)
        for sample in family.samples
    ]


def figure(samples: list, name: str, **labels: str) -> float:
    """The largest value of the matching samples; 0 when there is none."""
    return max(
        (
            s.value
            for s in samples
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
        ),
        default=0.0,
    )


def test_the_demo_shows_pacing_retries_and_dead_letters_within_150_s(tmp_path) -> None:
    port, receiver_port, token = free_port(), free_port(), "demo-metrics-token"
    # As on a fresh machine: SQLite and the embedded Redis under var/ (here tmp_path).
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in {"REDIS_URL", "DATABASE_URL", "LOG_LEVEL", "DELIVERY_CONCURRENCY"}
    }
    env.update(VAR_DIR=str(tmp_path), METRICS_TOKEN=token)
    log = (tmp_path / "run.log").open("w")
    started = time.monotonic()
    platform = subprocess.Popen(
        [
            sys.executable,
            "manage.py",
            "runplatform",
            "--port",
            str(port),
            "--receiver-port",
            str(receiver_port),
        ],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        # As `make run &` from a script starts it: SIGINT arrives ignored, and Ctrl-C (the
        # SIGINT below) must stop it all the same.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    base, seen, met = f"http://127.0.0.1:{port}", {}, False
    try:
        while not met and time.monotonic() - started < GOAL_SECONDS:
            time.sleep(5)
            assert platform.poll() is None, (tmp_path / "run.log").read_text()
            try:
                samples = read_metrics(base, token)
            except requests.RequestException:
                continue  # still starting
            seen = {
                "big-shop paced": figure(
                    samples, "webhook_tenant_status", tenant="big-shop.example", status="paced"
                ),
                "big-shop backlog age": figure(
                    samples, "webhook_backlog_age_seconds", tenant="big-shop.example"
                ),
                "retries": figure(samples, "webhook_retries_scheduled_total"),
                "dead letters": figure(samples, "webhook_dead_letters_total"),
            }
            met = (
                seen["big-shop paced"] == 1
                and seen["big-shop backlog age"] >= 1
                and seen["retries"] >= 1
                and seen["dead letters"] >= 1
            )
        elapsed = time.monotonic() - started
        lines = (tmp_path / "run.log").read_text().splitlines()
    finally:
        platform.send_signal(signal.SIGINT)  # Ctrl-C
        try:
            platform.wait(60)
        finally:
            platform.kill()
            log.close()
    text = (tmp_path / "run.log").read_text()
    assert met, (seen, text[-3000:])
    assert len(lines) < MAX_LOG_LINES * elapsed / GOAL_SECONDS, lines[-40:]
    # Every login is printed, and Ctrl-C reads as a stop, not a crash.
    assert "user admin, password" in text
    for login in ("user big ", "user charlie ", "user alpha "):
        assert login in text
    assert "dead letters to replay" in text
    # The status line's words match its figures: a hung endpoint with no cap of its own
    # has its limit backed off by the timeouts, to one request plus its retry slot and
    # nothing more; the flood follows the deliveries rather than one announced rate.
    hung = [
        (int(held), int(limit))
        for held, limit in re.findall(
            r"delta \(hangs\) (\d+) in flight \(adaptive limit (\d+) of 64 \+ 1 for retries\)",
            text,
        )
    ]
    assert hung, text[-3000:]
    # It never answers, so its limit never grows past where a new one starts.
    assert max(limit for _, limit in hung) <= 4, hung
    assert hung[-1][1] == 1 and hung[-1][0] <= 2, hung
    assert "x what is delivered" in text
    assert "Stopping the platform" in text
    assert "stopped unexpectedly" not in text
    assert platform.returncode == 0, text[-3000:]

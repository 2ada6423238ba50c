"""The alert rules load in Prometheus and behave as their unit tests say, checked by the
real promtool (`make promtool` installs it; PROMTOOL picks another binary)."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"


def promtool() -> str:
    """The promtool binary. A missing one fails rather than skips: a skip would let
    untested alert rules pass as tested in a green run."""
    name = os.environ.get("PROMTOOL", "promtool")
    found = shutil.which(name)
    if found is None:
        pytest.fail(
            f"promtool not found ({name}): run `make promtool`, or set PROMTOOL=/path/to/promtool",
            pytrace=False,
        )
    return found


def run_promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool(), *args],
        cwd=DEPLOY,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize(
    "args",
    [("check", "rules", "alerts.yml"), ("test", "rules", "alerts_test.yml")],
    ids=["check-rules", "test-rules"],
)
def test_promtool_accepts_the_alert_rules(args: tuple[str, ...]) -> None:
    result = run_promtool(*args)
    assert result.returncode == 0, (
        f"promtool {' '.join(args)} exited {result.returncode}:\n{result.stdout}{result.stderr}"
    )


def test_every_alert_has_unit_tests_firing_and_silent() -> None:
    """promtool only runs the cases written: a new alert without any would pass unnoticed."""
    rules = yaml.safe_load((DEPLOY / "alerts.yml").read_text())
    alerts = {rule["alert"] for group in rules["groups"] for rule in group["rules"]}
    cases = yaml.safe_load((DEPLOY / "alerts_test.yml").read_text())
    checks = [check for test in cases["tests"] for check in test.get("alert_rule_test", [])]
    firing = {check["alertname"] for check in checks if check.get("exp_alerts")}
    silent = {check["alertname"] for check in checks if not check.get("exp_alerts")}
    assert alerts - firing == set(), "alerts with no case where they fire"
    assert alerts - silent == set(), "alerts with no case where they stay silent"

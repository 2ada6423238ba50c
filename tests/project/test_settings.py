"""Settings come from the environment; a malformed value stops start-up naming the variable."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from core.env import env_bool, env_choice, env_float_list, env_int, env_list

ROOT = Path(__file__).resolve().parents[2]


def run_check(**env: str) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **env}
    return subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("DEBUG", "maybe"),
        ("LEASE_SECONDS", "600"),
        ("DELIVERY_CONCURRENCY", "lots"),
        ("SCHEDULER_MODE", "random"),
        ("REDIS_URL", "http://127.0.0.1:6379"),
        ("SCHEDULER_REDIS_URL", "redis+cluster://127.0.0.1"),
        ("SCHEDULER_PICK_SHARDS", "1"),  # with one shard, only shard 0 exists
        ("DATABASE_URL", "nosuchdb://x"),
        ("RETRY_SCHEDULE_SECONDS", "5,,10"),
        ("ALLOWED_HOSTS", "a,,b"),
        ("SECURE_PROXY_SSL_HEADER", "X-Forwarded-Proto: https"),
        ("DELIVERY_ADAPTIVE_CONCURRENCY", "some"),
    ],
)
def test_malformed_setting_stops_startup_naming_the_variable(name: str, value: str) -> None:
    result = run_check(**{name: value})
    assert result.returncode != 0
    assert name in result.stderr
    assert "Traceback" not in result.stderr.splitlines()[-1]


def test_defaults_start_cleanly() -> None:
    result = run_check()
    assert result.returncode == 0, result.stderr
    assert "no issues" in result.stdout


def test_bool_reader_accepts_the_usual_spellings(monkeypatch: pytest.MonkeyPatch) -> None:
    for raw, expected in [
        ("true", True),
        ("1", True),
        ("On", True),
        ("false", False),
        ("0", False),
    ]:
        monkeypatch.setenv("X_FLAG", raw)
        assert env_bool("X_FLAG", not expected) is expected


def test_choice_reader_takes_each_spelling_and_names_them_all_when_wrong(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    choices = {"uncapped": "uncapped", "true": "all", "all": "all", "0": "off"}
    for raw, expected in [("ALL", "all"), ("true", "all"), ("Uncapped", "uncapped"), ("0", "off")]:
        monkeypatch.setenv("X_MODE", raw)
        assert env_choice("X_MODE", "off", choices) == expected
    monkeypatch.setenv("X_MODE", "some")
    with pytest.raises(ImproperlyConfigured, match="one of uncapped; true/all; 0"):
        env_choice("X_MODE", "off", choices)


def test_unset_or_blank_values_fall_back_to_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("X_NUM", raising=False)
    assert env_int("X_NUM", 7) == 7
    monkeypatch.setenv("X_NUM", "  ")
    assert env_int("X_NUM", 7) == 7


def test_int_bounds_are_enforced(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("X_NUM", "0")
    with pytest.raises(ImproperlyConfigured, match="X_NUM"):
        env_int("X_NUM", 5, minimum=1)


def test_list_readers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("X_LIST", "a, b ,c")
    assert env_list("X_LIST", []) == ["a", "b", "c"]
    monkeypatch.setenv("X_FLOATS", "5,300, 1800")
    assert env_float_list("X_FLOATS", []) == [5.0, 300.0, 1800.0]
    monkeypatch.setenv("X_FLOATS", "5,-1")
    with pytest.raises(ImproperlyConfigured, match="X_FLOATS"):
        env_float_list("X_FLOATS", [])


def test_secret_file_wins_over_plain_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from core.env import secret_from_file_or_env

    secret_file = tmp_path / "key"
    secret_file.write_text("from-file\n")
    monkeypatch.setenv("X_SECRET", "plain")
    monkeypatch.setenv("X_SECRET_FILE", str(secret_file))
    assert secret_from_file_or_env("X_SECRET") == "from-file"
    monkeypatch.setenv("X_SECRET_FILE", str(tmp_path / "missing"))
    with pytest.raises(ImproperlyConfigured, match="X_SECRET_FILE"):
        secret_from_file_or_env("X_SECRET")


def test_setting_up_django_starts_no_process_and_writes_no_file(tmp_path) -> None:
    var_dir = tmp_path / "var"
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "SECRET_KEY")}
    env.update(VAR_DIR=str(var_dir), DJANGO_SETTINGS_MODULE="project.settings")
    env.pop("DATABASE_URL", None)
    code = (
        "import django; django.setup(); from django.conf import settings;"
        "print(settings.REDIS_URL, settings.EMBEDDED_REDIS)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [f"unix://{var_dir}/redis/redis.sock", "True"]
    assert not var_dir.exists()  # no directory, no secret key, no redis-server socket or pid


def test_manage_py_starts_the_embedded_redis_and_stops_what_it_started(tmp_path) -> None:
    from project import embedded_redis

    var_dir = tmp_path / "var"
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "SECRET_KEY")}
    env.update(VAR_DIR=str(var_dir))
    env.pop("DATABASE_URL", None)
    result = subprocess.run(
        [
            sys.executable,
            "manage.py",
            "shell",
            "-c",
            "import redis; from django.conf import settings;"
            "print(redis.Redis.from_url(settings.REDIS_URL).ping())",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "True"  # it ran while the command did
    assert (var_dir / "secret_key").exists()
    assert not embedded_redis.is_running(var_dir / "redis")  # and was stopped after


def test_a_portal_others_may_frame_sends_its_cookies_cross_site() -> None:
    show = (
        "import django; django.setup(); from django.conf import settings; "
        "print(settings.SESSION_COOKIE_SAMESITE, settings.CSRF_COOKIE_SAMESITE)"
    )

    def samesite(**env: str) -> str:
        done = subprocess.run(
            [sys.executable, "-c", show],
            cwd=ROOT,
            env={**os.environ, "DJANGO_SETTINGS_MODULE": "project.settings", **env},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    assert samesite(PORTAL_FRAME_ANCESTORS="") == "Lax Lax"
    assert samesite(PORTAL_FRAME_ANCESTORS="https://app.example") == "None None"

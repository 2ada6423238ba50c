"""Helpers for delivery tests: publish events to real local receivers and run workers."""

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from django.db import connection

from delivery.models import Delivery
from tests.waiting import wait_until  # noqa: F401 (the tests import it from here)

ROOT = Path(__file__).resolve().parent.parent


def statuses() -> dict[str, int]:
    counts: dict[str, int] = {}
    for status in Delivery.objects.values_list("status", flat=True):
        counts[status] = counts.get(status, 0) + 1
    return counts


def database_url_for_subprocesses() -> str:
    """The test database, as a DATABASE_URL a worker subprocess can open."""
    settings_dict = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{settings_dict['NAME']}"
    user = settings_dict.get("USER") or "postgres"
    host = settings_dict.get("HOST") or "127.0.0.1"
    port = settings_dict.get("PORT") or "5432"
    return f"postgres://{user}@{host}:{port}/{settings_dict['NAME']}"


def start_worker(**env: str) -> subprocess.Popen:
    """`python manage.py rqworker default maintenance` against the test database and Redis."""
    full_env = {
        **os.environ,
        "DATABASE_URL": database_url_for_subprocesses(),
        "ALLOW_PRIVATE_DESTINATIONS": "true",
        "DELIVERY_CONCURRENCY": "4",
        "LEASE_SECONDS": "3",
        "RETRY_SCHEDULE_SECONDS": "0.3,0.3,0.3",
        "RETRY_JITTER": "0",
        "LOG_LEVEL": "WARNING",
        # A SIGABRT (or a crash) then writes every thread's stack into the worker's log.
        "PYTHONFAULTHANDLER": "1",
        **env,
    }
    # A file, not a pipe: nobody reads a pipe while the test runs, and a worker whose
    # pipe fills up (Redis outage warnings, say) would block on its next log line.
    log = tempfile.NamedTemporaryFile(prefix="worker-", suffix=".log", delete=False)  # noqa: SIM115
    process = subprocess.Popen(
        [sys.executable, "manage.py", "rqworker", "default", "maintenance"],
        cwd=ROOT,
        env=full_env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    process.log_path = log.name  # type: ignore[attr-defined]
    log.close()
    return process

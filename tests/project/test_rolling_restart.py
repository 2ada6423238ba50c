"""A deploy as docs/DEPLOY.md describes it, under load: the Procfile's processes (gunicorn
with deploy/gunicorn.conf.py, two delivery workers) on the test's database and a fresh
Redis, traffic once /readyz says ready (as a load balancer would), signed events posted
all along, and every process replaced one by one with SIGTERM: each delivery worker (then started again), and each of gunicorn's processes
(its master starts another; the listening socket never closes). Every request must be
answered 202, and every acknowledged event delivered exactly once (by webhook-id)."""

import http.client
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from delivery.models import Delivery
from tests import signing
from tests.delivery_helpers import database_url_for_subprocesses, wait_until
from tests.factories import make_endpoint, make_source, make_tenant
from tests.http_receivers import Recorder

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.chaos]

ROOT = Path(__file__).resolve().parents[2]
SECRET = "rolling-secret"


def procfile() -> dict[str, list[str]]:
    commands = {}
    for line in (ROOT / "Procfile").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, command = line.split(":", 1)
            commands[name.strip()] = shlex.split(command)
    return commands


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Platform:
    """The Procfile's processes, each with its log in a file."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.commands = procfile()
        self.processes: list[subprocess.Popen] = []

    def start(self, name: str) -> subprocess.Popen:
        log = tempfile.NamedTemporaryFile(prefix=f"{name}-", suffix=".log", delete=False)  # noqa: SIM115
        process = subprocess.Popen(
            self.commands[name], cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT
        )
        process.log_path = log.name  # type: ignore[attr-defined]
        log.close()
        self.processes.append(process)
        return process

    def stop_all(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
                process.wait(10)

    def logs(self) -> str:
        out = []
        for process in self.processes:
            with open(process.log_path, errors="replace") as log:
                out.append(
                    f"--- {process.args[0]} {process.pid} ({process.returncode}) ---\n{log.read()[-3000:]}"
                )
        return "\n".join(out)


def ready(port: int) -> bool:
    """What a load balancer asks before it sends traffic (/readyz)."""
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("GET", "/readyz")
        status = conn.getresponse().status
        conn.close()
    except OSError:
        return False
    return status == 200


def children(pid: int) -> set[int]:
    found = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True)
    return {int(line) for line in found.stdout.split()}


class Poster:
    """Signed events posted from two threads until stopped: what each answered."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.accepted: list[str] = []
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._post, args=(n,)) for n in range(2)]

    def __enter__(self) -> "Poster":
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)

    def _post(self, n: int) -> None:
        i = 0
        while not self._stop.is_set():
            i += 1
            body = f'{{"shop_id": "shop-1", "n": "{n}-{i}"}}'.encode()
            headers = {
                "X-Signature": signing.hmac_hex(SECRET, body),
                "Content-Type": "application/json",
            }
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
                conn.request("POST", "/ingest/rolling/", body, headers)
                answer = conn.getresponse()
                text = answer.read()
                conn.close()
            except OSError as exc:
                with self._lock:
                    self.failures.append(f"{type(exc).__name__}: {exc}")
                continue
            with self._lock:
                if answer.status == 202:
                    self.accepted.append(__import__("json").loads(text)["id"])
                else:
                    self.failures.append(f"{answer.status}: {text[:200]!r}")
            time.sleep(0.02)


def test_a_rolling_restart_under_load_loses_nothing_and_sends_nothing_twice(redis_conn) -> None:
    with Recorder() as receiver:
        make_tenant("shop-1")
        source = make_source("rolling", secret=SECRET, fairness_key="body.shop_id")
        source.destinations.add(make_endpoint(None, receiver.url, max_in_flight=8))
        port = free_port()
        venv_bin = str(Path(sys.executable).parent)
        env = {
            **os.environ,
            "PATH": f"{venv_bin}:{os.environ.get('PATH', '')}",
            "DATABASE_URL": database_url_for_subprocesses(),
            "DB_CONN_MAX_AGE": "0",
            "PORT": str(port),
            "WEB_CONCURRENCY": "2",
            "WEB_THREADS": "2",
            "ALLOW_PRIVATE_DESTINATIONS": "true",
            "DELIVERY_CONCURRENCY": "8",
            "MAINTENANCE_INTERVAL_SECONDS": "2",
            "LOG_LEVEL": "WARNING",
            "PYTHONFAULTHANDLER": "1",
        }
        platform = Platform(env)
        try:
            web = platform.start("web")
            workers = [platform.start("worker"), platform.start("worker")]
            assert wait_until(lambda: len(children(web.pid)) == 2, timeout=30), platform.logs()
            # A new Redis: ready once the first worker has built the schedule.
            assert wait_until(lambda: ready(port), timeout=60), platform.logs()
            with Poster(port) as poster:
                time.sleep(2)
                for index, worker in enumerate(list(workers)):
                    worker.send_signal(signal.SIGTERM)
                    assert worker.wait(60) == 0, platform.logs()
                    workers[index] = platform.start("worker")
                    time.sleep(1.5)
                for child in sorted(children(web.pid)):
                    os.kill(child, signal.SIGTERM)
                    assert wait_until(
                        lambda child=child: (
                            child not in children(web.pid) and len(children(web.pid)) == 2
                        ),
                        timeout=40,
                    ), platform.logs()
                    time.sleep(1.5)
                time.sleep(1)
            assert poster.failures == [], (poster.failures[:5], platform.logs())
            accepted = set(poster.accepted)
            assert len(accepted) >= 50
            assert wait_until(
                lambda: (
                    Delivery.objects.filter(status=Delivery.Status.DELIVERED).count()
                    == len(accepted)
                ),
                timeout=60,
            ), platform.logs()
            time.sleep(2)  # a sweep more: nothing comes a second time
            sent = Counter(request.headers["webhook-id"] for request in receiver.requests)
        finally:
            platform.stop_all()
    assert set(sent) == accepted
    assert max(sent.values()) == 1, [(i, n) for i, n in sent.items() if n > 1][:5]

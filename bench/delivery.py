"""End-to-end deliveries per second into a fast local receiver, several ways, in one run.

    .venv/bin/python bench/delivery.py                      # SQLite in a temp dir
    .venv/bin/python bench/delivery.py --database-url postgres://postgres@127.0.0.1:5432/bench_delivery

(a) ours: W `manage.py rqworker default maintenance` processes (DeliveryWorker, each
    running the delivery engine with DELIVERY_CONCURRENCY=--concurrency requests at
    once on one libcurl multi loop) drain N pre-created deliveries (T tenants, one
    signed endpoint each, all on the receiver).
(b) bare: W processes x --slots threads posting the same payloads with one shared
    `requests.Session` per process: the ceiling for that HTTP client.
(b') curl: W processes, each one pycurl.CurlMulti driving up to --concurrency POSTs at
    once on reused easy handles (keep-alive), the same payloads and headers as (b): the
    ceiling of the HTTP part of (a) (no database, no Redis, no signing).
(c) one RQ job per delivery: W `manage.py rqworker default --worker-class
    rq.worker.SimpleWorker` processes; each job loads the Delivery row (with its event
    and endpoint), posts the payload on a per-process pooled session and marks the row
    delivered. No signature, no Attempt row: less work than (a) does.
(t) traced: (a) with tracing on (core.tracing), every attempt's spans exported over
    OTLP/HTTP to a stand-in collector on 127.0.0.1 (bench/otlp_sink.py).
(p) before: (a) run by the workers of an older checkout (--before DIR, e.g. a
    `git worktree` of the commit before a change), on the same database and backlog:
    what the change costs with everything else equal. The database is migrated by this
    checkout, so the older one must be able to read its schema.
(h) hung: ONE worker of ours (DELIVERY_CONCURRENCY = --concurrency + --hung) drains the
    same backlog twice in one run: alone, then while --hung endpoints (a tenant each,
    max_in_flight=1, timeout 30 s, 2 deliveries each) point at a listener that accepts,
    reads and never answers, so the worker holds one request per hung endpoint for the
    whole second drain. Reported: healthy deliveries/s with the hung ones / without
    (`healthy_with_hung_ratio`), and the most requests the listener held at once during
    the second drain (`hung_in_flight_max`, to approach --hung). The listener is then
    closed (the hung requests end as failed attempts) and the worker stopped.

Every mode is timed the same way: from the first to the last request counted by the
receiver (an asyncio HTTP/1.1 keep-alive server in its own process, answering 200 at
once). Workers are started and registered before the work is released, so start-up is
not timed. The receiver, Redis and the database share the machine's CPUs with the
clients: the CPU columns say where the time went.

The database is dedicated: a SQLite file in a temp dir (migrated here), or the
PostgreSQL database named by --database-url, created if missing and truncated (its name
must contain "bench"). The Redis database (--redis-url, default db 13) is flushed: only
if it is empty or was last used by this script.
"""

import argparse
import asyncio
import contextlib
import json
import os
import pickle
import random
import selectors
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.dedicated import clean_redis, prepare_database  # noqa: E402
from bench.otlp_sink import OtlpSink  # noqa: E402
from simulation.environment import Workers  # noqa: E402

REDIS_MARKER = "wh:bench-delivery"
JOB_PATH = "bench.delivery.rq_job_deliver"


# --- the receiver: its own process, counts requests, answers 200 at once ---------------


class _Stats:
    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.count = 0
        self.first = 0.0
        self.last = 0.0
        self.cpu_at_reset = time.process_time()

    def as_json(self) -> bytes:
        cpu = time.process_time() - self.cpu_at_reset
        return json.dumps(
            {"count": self.count, "first": self.first, "last": self.last, "cpu": cpu}
        ).encode()


_OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: text/plain\r\n\r\nok"


class _ReceiverProtocol(asyncio.Protocol):
    def __init__(self, stats: _Stats) -> None:
        self.stats = stats
        self.buffer = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        buffer = self.buffer + data if self.buffer else data
        replies = []
        while True:
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                break
            head = buffer[:end]
            length = 0
            at = head.find(b"ontent-Length:")
            if at < 0:
                at = head.lower().find(b"ontent-length:")
            if at >= 0:
                stop = head.find(b"\r\n", at)
                length = int(head[at + 14 : stop if stop >= 0 else len(head)])
            total = end + 4 + length
            if len(buffer) < total:
                break
            replies.append(self._answer(head))
            buffer = buffer[total:]
        self.buffer = buffer
        if replies:
            self.transport.write(b"".join(replies))

    def _answer(self, head: bytes) -> bytes:
        if head.startswith(b"GET /__stats"):
            body = self.stats.as_json()
            return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        if head.startswith(b"POST /__reset"):
            self.stats.reset()
            return _OK
        now = time.time()
        if not self.stats.count:
            self.stats.first = now
        self.stats.count += 1
        self.stats.last = now
        return _OK


def serve_receiver() -> None:
    async def main() -> None:
        stats = _Stats()
        loop = asyncio.get_running_loop()
        server = await loop.create_server(
            lambda: _ReceiverProtocol(stats), "127.0.0.1", 0, backlog=1024
        )
        print(server.sockets[0].getsockname()[1], flush=True)
        async with server:
            await server.serve_forever()

    asyncio.run(main())


class Receiver:
    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, __file__, "--serve-receiver"], stdout=subprocess.PIPE, text=True
        )
        port = int(self.process.stdout.readline())
        self.base = f"http://127.0.0.1:{port}"
        self.url = self.base + "/hook"

    def _call(self, method: str, path: str) -> dict:
        request = urllib.request.Request(
            self.base + path, method=method, data=b"" if method == "POST" else None
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            body = response.read()
        return json.loads(body) if method == "GET" else {}

    def stats(self) -> dict:
        return self._call("GET", "/__stats")

    def reset(self) -> None:
        self._call("POST", "/__reset")

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(10)


# --- (h) the listener that accepts, reads and never answers ----------------------------


def serve_hung() -> None:
    """Accept every connection, read whatever comes, answer nothing, in one selectors
    loop: hundreds of held connections cost a socket each. Control on stdin, one command
    a line: "stats" (answered with a JSON line on stdout) and "reset" (the maximum and
    minimum of held connections start again from now)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", 0))
    server.listen(4096)
    server.setblocking(False)
    selector = selectors.DefaultSelector()
    selector.register(server, selectors.EVENT_READ, "accept")
    selector.register(sys.stdin.fileno(), selectors.EVENT_READ, "control")
    talked: dict[socket.socket, bool] = {}  # open connection -> has sent a request
    counts = {"accepted": 0, "closed": 0, "held": 0, "held_max": 0, "held_min": 0}
    control = b""
    print(server.getsockname()[1], flush=True)
    while True:
        for key, _ in selector.select():
            if key.data == "accept":
                while True:
                    try:
                        conn, _ = server.accept()
                    except (BlockingIOError, InterruptedError):
                        break
                    conn.setblocking(False)
                    selector.register(conn, selectors.EVENT_READ, "conn")
                    talked[conn] = False
                    counts["accepted"] += 1
            elif key.data == "control":
                data = os.read(sys.stdin.fileno(), 4096)
                if not data:
                    return
                control += data
                while b"\n" in control:
                    line, control = control.split(b"\n", 1)
                    if line.strip() == b"reset":
                        counts["held_max"] = counts["held_min"] = counts["held"]
                    reply = {**counts, "open": len(talked)}
                    sys.stdout.write(json.dumps(reply) + "\n")
                    sys.stdout.flush()
            else:
                conn = key.fileobj
                try:
                    data = conn.recv(65536)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    data = b""
                if not data:
                    selector.unregister(conn)
                    conn.close()
                    counts["closed"] += 1
                    if talked.pop(conn):
                        counts["held"] -= 1
                        counts["held_min"] = min(counts["held_min"], counts["held"])
                elif not talked[conn]:
                    talked[conn] = True
                    counts["held"] += 1
                    counts["held_max"] = max(counts["held_max"], counts["held"])


class HungListener:
    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, __file__, "--serve-hung"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        port = int(self.process.stdout.readline())
        self.url = f"http://127.0.0.1:{port}/hook"

    def _call(self, command: str) -> dict:
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        return json.loads(self.process.stdout.readline())

    def stats(self) -> dict:
        """accepted, closed, open, held (sent a request, still open), held_max/_min."""
        return self._call("stats")

    def reset(self) -> dict:
        """Start the maximum and minimum again from what is held now."""
        return self._call("reset")

    def close(self) -> None:
        """Every held connection closes with the process."""
        if self.process.poll() is None:
            self.process.stdin.close()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


# --- (b) the bare requests loop, in its own processes ---------------------------------


def bare_client(url: str, payload_file: str, start: int, count: int, threads: int) -> None:
    import requests

    with open(payload_file, "rb") as handle:
        requests_to_send = pickle.load(handle)[start : start + count]
    session = requests.Session()
    session.trust_env = False
    adapter = requests.adapters.HTTPAdapter(pool_maxsize=threads, pool_connections=1)
    session.mount("http://", adapter)
    work = iter(requests_to_send)
    errors = []

    def loop() -> None:
        for headers, body in work:  # a list iterator is safe to share under the GIL
            try:
                response = session.post(url, data=body, headers=headers, timeout=(5, 30))
                response.content  # noqa: B018 - read the body, as a delivery does
            except requests.RequestException as exc:
                errors.append(str(exc))

    print("ready", flush=True)
    sys.stdin.readline()
    cpu = time.process_time()
    pool = [threading.Thread(target=loop) for _ in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    print(json.dumps({"cpu": time.process_time() - cpu, "errors": len(errors)}), flush=True)


# --- (b') the bare pycurl multi loop, in its own processes -----------------------------


def curl_client(url: str, payload_file: str, start: int, count: int, concurrency: int) -> None:
    import pycurl

    with open(payload_file, "rb") as handle:
        requests_to_send = pickle.load(handle)[start : start + count]
    multi = pycurl.CurlMulti()
    idle = []
    bodies: dict[pycurl.Curl, list[bytes]] = {}
    for _ in range(max(1, min(concurrency, len(requests_to_send)))):
        curl = pycurl.Curl()
        curl.setopt(pycurl.URL, url)
        curl.setopt(pycurl.NOSIGNAL, 1)
        curl.setopt(pycurl.CONNECTTIMEOUT, 5)
        curl.setopt(pycurl.TIMEOUT, 30)
        chunks: list[bytes] = []
        curl.setopt(pycurl.WRITEFUNCTION, chunks.append)  # read the body, as (a) does
        bodies[curl] = chunks
        idle.append(curl)
    work = iter(requests_to_send)
    errors = 0
    under_way = 0

    print("ready", flush=True)
    sys.stdin.readline()
    cpu = time.process_time()
    more = True
    while True:
        while more and idle:
            try:
                headers, body = next(work)
            except StopIteration:
                more = False
                break
            curl = idle.pop()
            bodies[curl].clear()
            curl.setopt(pycurl.POSTFIELDS, body)
            curl.setopt(pycurl.HTTPHEADER, [f"{name}: {value}" for name, value in headers.items()])
            multi.add_handle(curl)
            under_way += 1
        if not under_way:
            break
        while multi.perform()[0] == pycurl.E_CALL_MULTI_PERFORM:
            pass
        ended = 0
        while True:
            queued, succeeded, failed = multi.info_read()
            for curl in succeeded:
                if curl.getinfo(pycurl.RESPONSE_CODE) != 200:
                    errors += 1
            errors += len(failed)
            for curl in [*succeeded, *(entry[0] for entry in failed)]:
                multi.remove_handle(curl)
                idle.append(curl)
                under_way -= 1
                ended += 1
            if not queued:
                break
        if not ended:
            multi.select(1.0)
    print(json.dumps({"cpu": time.process_time() - cpu, "errors": errors}), flush=True)


# --- (c) the job that one RQ job per delivery runs ------------------------------------

_job_session = None


def rq_job_deliver(delivery_id: str) -> None:
    """Load the row, POST its payload, mark it delivered: the least a job-per-webhook does."""
    global _job_session
    import requests
    from django.db.models import F
    from django.utils import timezone

    from delivery.models import Delivery

    if _job_session is None:
        _job_session = requests.Session()
        _job_session.trust_env = False
    delivery = Delivery.objects.select_related("event", "endpoint").get(pk=delivery_id)
    response = _job_session.post(
        delivery.endpoint.url,
        data=bytes(delivery.event.payload),
        headers={"Content-Type": delivery.event.content_type, "webhook-id": delivery.event_id},
        timeout=(5, delivery.endpoint.timeout_seconds),
    )
    response.raise_for_status()
    Delivery.objects.filter(pk=delivery_id).update(
        status=Delivery.Status.DELIVERED, attempts=F("attempts") + 1, delivered_at=timezone.now()
    )


# --- setup: a dedicated database and Redis db -----------------------------------------


def setup_django(database_url: str, redis_url: str, workdir: Path) -> None:
    os.environ.update(
        DJANGO_SETTINGS_MODULE="project.settings",
        DATABASE_URL=database_url,
        REDIS_URL=redis_url,
        VAR_DIR=str(workdir / "var"),
        ALLOW_PRIVATE_DESTINATIONS="true",
        LOG_LEVEL="WARNING",
    )
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    call_command("flush", interactive=False, verbosity=0)


def make_payload(rng: random.Random, tenant: int, index: int, size: int) -> bytes:
    body = {
        "type": "order.created",
        "tenant": f"shop-{tenant}.example",
        "order": {"id": index, "total": f"{rng.uniform(1, 500):.2f}", "currency": "EUR"},
        "pad": "",
    }
    raw = json.dumps(body, separators=(",", ":"))
    body["pad"] = "x" * max(0, size - len(raw))
    return json.dumps(body, separators=(",", ":")).encode()


def create_backlog(
    receiver_url: str, events: int, tenants: int, payload_bytes: int, cap: int
) -> list:
    """Tenants, one signed endpoint each, and N events with their deliveries (bulk)."""
    from delivery.models import Delivery
    from tenants.models import Endpoint, Tenant  # endpoints get their signing secrets as made
    from webhooks.models import Event

    rng = random.Random(7)
    rows = Tenant.objects.bulk_create(
        [Tenant(key=f"shop-{i}.example", name=f"Shop {i}") for i in range(tenants)]
    )
    endpoints = Endpoint.objects.bulk_create(
        [
            Endpoint(tenant=t, url=receiver_url, max_in_flight=cap, retry_max_in_flight=cap)
            for t in rows
        ]
    )
    new_events, new_deliveries = [], []
    for index in range(events):
        slot = index % tenants
        event = Event(
            tenant=rows[slot],
            event_type="order.created",
            content_type="application/json",
            payload=make_payload(rng, slot, index, payload_bytes),
        )
        new_events.append(event)
        new_deliveries.append(Delivery(event=event, endpoint=endpoints[slot], tenant=rows[slot]))
    Event.objects.bulk_create(new_events, batch_size=500)
    Delivery.objects.bulk_create(new_deliveries, batch_size=500)
    return new_deliveries


def reset_deliveries() -> None:
    from django.db import connection

    from delivery.models import Attempt, Delivery

    Attempt.objects.all().delete()
    Delivery.objects.update(
        status=Delivery.Status.PENDING,
        lane=Delivery.Lane.FRESH,
        attempts=0,
        delivered_at=None,
        next_attempt_at=None,
        last_error="",
    )
    if connection.vendor == "postgresql":
        # What autovacuum does between bursts in production (it is off on some machines,
        # this one included): without it every round adds a backlog's worth of dead rows
        # and index entries, and later rounds run slower than earlier ones.
        with connection.cursor() as cursor:
            for model in (Delivery, Attempt):
                cursor.execute(f"VACUUM ANALYZE {connection.ops.quote_name(model._meta.db_table)}")


def delivered_count() -> int:
    from delivery.models import Delivery

    return Delivery.objects.filter(status=Delivery.Status.DELIVERED).count()


# --- running the modes --------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """utime + stime of a live process, from /proc (Linux)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_for(condition, timeout: float, what: str, interval: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(interval)


def worker_env(opts, database_url: str, workdir: Path, **extra: str) -> dict:
    return {
        **os.environ,
        "DATABASE_URL": database_url,
        "REDIS_URL": opts.redis_url,
        "VAR_DIR": str(workdir / "var"),
        "ALLOW_PRIVATE_DESTINATIONS": "true",
        "DELIVERY_CONCURRENCY": str(opts.concurrency),
        "LOG_LEVEL": "WARNING",
        "PYTHONPATH": str(ROOT),
        **extra,
    }


def workers_cpu(workers: Workers) -> float:
    return sum(cpu_seconds(process.pid) for process in workers.processes)


class Probe:
    """Machine-wide CPU use (from /proc/stat) and the Redis server's CPU over one mode's
    run. Both include whatever else uses the machine and the server meanwhile."""

    def __init__(self, redis_client) -> None:
        self.redis = redis_client
        self.machine = self._machine()
        self.redis_cpu = self._redis_cpu()

    @staticmethod
    def _machine() -> tuple[int, int]:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        idle = fields[3] + fields[4]  # idle + iowait
        return sum(fields) - idle, sum(fields)

    def _redis_cpu(self) -> float:
        info = self.redis.info("cpu")
        return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])

    def stop(self, result: dict) -> dict:
        busy, total = self._machine()
        share = (busy - self.machine[0]) / max(1, total - self.machine[1])
        result["machine_busy_cores"] = share * (os.cpu_count() or 1)
        result["redis_cpu"] = self._redis_cpu() - self.redis_cpu
        return result


def background_load(seconds: float = 2.0) -> float:
    """Cores kept busy by others (tests, other benchmarks) while nothing of ours runs."""
    before = Probe._machine()
    time.sleep(seconds)
    after = Probe._machine()
    return (after[0] - before[0]) / max(1, after[1] - before[1]) * (os.cpu_count() or 1)


def drain(
    receiver: Receiver, events: int, workers: Workers | None, timeout: float, check_db: bool
) -> dict:
    def done() -> bool:
        if workers is not None:
            workers.check_alive()
        return receiver.stats()["count"] >= events and (not check_db or delivered_count() >= events)

    wait_for(done, timeout, f"{events} deliveries", 0.1)
    stats = receiver.stats()
    elapsed = stats["last"] - stats["first"]
    return {
        "requests": stats["count"],
        "elapsed": elapsed,
        "per_s": events / elapsed if elapsed > 0 else float("inf"),
        "receiver_cpu": stats["cpu"],
    }


def run_ours(
    opts,
    receiver,
    redis_client,
    deliveries,
    database_url,
    workdir,
    env: dict[str, str] | None = None,
    root: Path = ROOT,
) -> dict:
    from core import redis_connection
    from delivery.models import Attempt
    from delivery.pipeline.enqueueing import item_for
    from delivery.scheduler import Scheduler, reset_scheduler

    reset_deliveries()
    clean_redis(opts.redis_url, REDIS_MARKER)
    reset_scheduler()
    receiver.reset()
    env = {**(env or {}), "PYTHONPATH": str(root)}
    workers = Workers(
        opts.workers, worker_env(opts, database_url, workdir, **env), workdir, "ours", root=root
    )
    try:
        workers.wait_registered(redis_client, 60)
        cpu_before = workers_cpu(workers)
        probe = Probe(redis_client)
        scheduler = Scheduler.from_settings(redis_connection.shared())
        scheduler.start_epoch()  # else the sweeper takes the flushed db for a lost schedule
        items = [item_for(d) for d in deliveries]
        for start in range(0, len(items), 1000):  # each call lands atomically
            scheduler.enqueue(items[start : start + 1000])
        profilers = start_profilers(opts, workers, workdir)
        result = probe.stop(drain(receiver, len(deliveries), workers, opts.timeout, True))
        result["client_cpu"] = workers_cpu(workers) - cpu_before
        stop_profilers(profilers)
    finally:
        workers.stop()
    result["attempts"] = Attempt.objects.count()
    result["duplicates"] = result["requests"] - len(deliveries)
    return result


def start_profilers(opts, workers: Workers, workdir: Path, label: str = "ours") -> list:
    """py-spy (collapsed stacks of the thread holding the GIL) on our workers while they drain."""
    if not opts.py_spy:
        return []
    out = Path(opts.py_spy)
    out.mkdir(parents=True, exist_ok=True)
    return [
        subprocess.Popen(
            [
                shutil.which("py-spy") or "py-spy",
                "record",
                "--format",
                "raw",
                "--rate",
                "200",
                "--gil",
                "-o",
                str(out / f"{label}-{index}.txt"),
                "-p",
                str(process.pid),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for index, process in enumerate(workers.processes)
    ]


def stop_profilers(profilers: list) -> None:
    for profiler in profilers:
        profiler.send_signal(signal.SIGINT)
    for profiler in profilers:
        profiler.wait(30)


def run_bare(opts, receiver, redis_client, payload_file: Path, kind: str = "bare") -> dict:
    """(b) with `kind` "bare" (requests threads), (b') with "curl" (a pycurl multi loop)."""
    receiver.reset()
    per_process = -(-opts.events // opts.workers)
    parallel = opts.slots if kind == "bare" else opts.concurrency
    clients = [
        subprocess.Popen(
            [
                sys.executable,
                __file__,
                f"--{kind}-client",
                receiver.url,
                str(payload_file),
                str(index * per_process),
                str(per_process),
                str(parallel),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for index in range(opts.workers)
    ]
    for client in clients:
        assert client.stdout.readline().strip() == "ready"
    probe = Probe(redis_client)
    for client in clients:
        client.stdin.write("go\n")
        client.stdin.flush()
    reports = [json.loads(client.stdout.readline()) for client in clients]
    for client in clients:
        client.wait(30)
    result = probe.stop(drain(receiver, opts.events, None, opts.timeout, False))
    result["client_cpu"] = sum(r["cpu"] for r in reports)
    result["errors"] = sum(r["errors"] for r in reports)
    return result


def run_rq_jobs(opts, receiver, redis_client, deliveries, database_url, workdir) -> dict:
    from rq import Queue

    reset_deliveries()
    clean_redis(opts.redis_url, REDIS_MARKER)
    receiver.reset()
    worker_class = "rq.worker.Worker" if opts.rq_fork else "rq.worker.SimpleWorker"
    workers = Workers(
        opts.workers,
        worker_env(opts, database_url, workdir, RQ_WORKER_CLASS=worker_class),
        workdir,
        "rq",
        args=["default", "--worker-class", worker_class],
    )
    try:
        workers.wait_registered(redis_client, 60)
        queue = Queue("default", connection=redis_client)
        jobs = [
            Queue.prepare_data(JOB_PATH, args=(d.id,), result_ttl=0, failure_ttl=3600)
            for d in deliveries
        ]
        cpu_before = workers_cpu(workers)
        probe = Probe(redis_client)
        with redis_client.pipeline() as pipe:  # released in one go
            queue.enqueue_many(jobs, pipeline=pipe)
            pipe.execute()
        result = probe.stop(drain(receiver, len(deliveries), workers, opts.timeout, True))
        result["client_cpu"] = workers_cpu(workers) - cpu_before
    finally:
        workers.stop()
    return result


def create_hung(listener_url: str, count: int, per_endpoint: int = 2) -> list:
    """`count` tenants with one endpoint each on the never-answering listener (cap 1,
    timeout 30 s) and `per_endpoint` deliveries each."""
    from delivery.models import Delivery
    from tenants.models import Endpoint, Tenant  # endpoints get their signing secrets as made
    from webhooks.models import Event

    tenants = Tenant.objects.bulk_create(
        [Tenant(key=f"hung-{i}.example", name=f"Hung {i}") for i in range(count)]
    )
    endpoints = Endpoint.objects.bulk_create(
        [
            Endpoint(
                tenant=t,
                url=listener_url,
                max_in_flight=1,
                retry_max_in_flight=1,
                timeout_seconds=30,
            )
            for t in tenants
        ]
    )
    events, deliveries = [], []
    for tenant, endpoint in zip(tenants, endpoints, strict=True):
        for index in range(per_endpoint):
            event = Event(
                tenant=tenant,
                event_type="order.created",
                content_type="application/json",
                payload=b'{"type":"order.created","hung":%d}' % index,
            )
            events.append(event)
            deliveries.append(Delivery(event=event, endpoint=endpoint, tenant=tenant))
    Event.objects.bulk_create(events, batch_size=500)
    Delivery.objects.bulk_create(deliveries, batch_size=500)
    return deliveries


def delete_hung(deliveries: list) -> None:
    from tenants.models import Tenant
    from webhooks.models import Event

    tenant_ids = {d.tenant_id for d in deliveries}
    Event.objects.filter(tenant_id__in=tenant_ids).delete()  # deliveries, attempts with them
    Tenant.objects.filter(pk__in=tenant_ids).delete()  # endpoints, secrets with them


def hung_in_scheduler(scheduler, endpoint_ids: set[int]) -> int:
    """Leases the scheduler counts in flight on the hung endpoints (one snapshot)."""
    snap = scheduler.snapshot(top_n=len(endpoint_ids) + 100, age_buckets=())
    return sum(row.in_flight for row in snap.endpoints if row.endpoint_id in endpoint_ids)


def wait_scheduler_idle(scheduler, timeout: float) -> None:
    """Every lease acknowledged and nothing queued: the backlog may be enqueued again."""

    def idle() -> bool:
        snap = scheduler.snapshot(top_n=0, age_buckets=())
        return not (snap.in_flight or snap.fresh_depth or snap.retry_depth or snap.delayed_depth)

    wait_for(idle, timeout, "the scheduler to settle", 0.05)


def run_hung(opts, receiver, redis_client, deliveries, database_url, workdir) -> dict:
    """One worker: the healthy backlog alone, then again while --hung endpoints are held."""
    from core import redis_connection
    from delivery.models import Attempt
    from delivery.pipeline.enqueueing import item_for
    from delivery.scheduler import Scheduler, reset_scheduler

    reset_deliveries()
    clean_redis(opts.redis_url, REDIS_MARKER)
    reset_scheduler()
    receiver.reset()
    listener = HungListener()
    hung = create_hung(listener.url, opts.hung)
    hung_endpoints = {d.endpoint_id for d in hung}
    concurrency = opts.concurrency + opts.hung
    env = worker_env(opts, database_url, workdir, DELIVERY_CONCURRENCY=str(concurrency))
    workers = Workers(1, env, workdir, "hung")
    result: dict = {"hung": opts.hung, "concurrency": concurrency}
    profilers: list = []
    try:
        workers.wait_registered(redis_client, 60)
        scheduler = Scheduler.from_settings(redis_connection.shared())
        scheduler.start_epoch()
        items = [item_for(d) for d in deliveries]

        def drain_healthy(label: str, profile_as: str) -> dict:
            receiver.reset()
            cpu_before = workers_cpu(workers)
            probe = Probe(redis_client)
            for start in range(0, len(items), 1000):
                scheduler.enqueue(items[start : start + 1000])
            profilers[:] = start_profilers(opts, workers, workdir, profile_as)
            phase = probe.stop(drain(receiver, len(deliveries), workers, opts.timeout, True))
            phase["client_cpu"] = workers_cpu(workers) - cpu_before
            stop_profilers(profilers)
            profilers.clear()
            phase["attempts"] = Attempt.objects.count()
            phase["duplicates"] = phase["requests"] - len(deliveries)
            print(f"  hung run, {label}: {phase['per_s']:.0f}/s", flush=True)
            return phase

        result["alone"] = drain_healthy("healthy alone", "hung-alone")
        wait_scheduler_idle(scheduler, 30)
        reset_deliveries()  # the hung deliveries stay pending: they were never enqueued

        started = time.monotonic()
        hung_items = [item_for(d) for d in hung]
        for start in range(0, len(hung_items), 1000):
            scheduler.enqueue(hung_items[start : start + 1000])
        with contextlib.suppress(TimeoutError):
            wait_for(lambda: listener.stats()["held"] >= opts.hung, 30, "the hung requests", 0.05)
        held = listener.reset()
        result["hung_held_before"] = held["held"]
        result["hung_fill_seconds"] = time.monotonic() - started
        print(
            f"  hung run: {held['held']} of {opts.hung} hung requests held after "
            f"{result['hung_fill_seconds']:.1f} s",
            flush=True,
        )
        result["with_hung"] = drain_healthy(f"healthy with {opts.hung} hung", "hung-held")
        after = listener.stats()
        result["hung_in_flight_max"] = after["held_max"]
        result["hung_held_min"] = after["held_min"]
        result["hung_held_after"] = after["held"]
        result["hung_connections_accepted"] = after["accepted"]
        result["hung_in_flight_scheduler"] = hung_in_scheduler(scheduler, hung_endpoints)
        result["seconds_since_hung_started"] = time.monotonic() - started
        result["ratio"] = result["with_hung"]["per_s"] / result["alone"]["per_s"]
    finally:
        stop_profilers(profilers)
        listener.close()  # the held requests end (empty reply): the worker stops at once
        workers.stop()
        delete_hung(hung)
    return result


# --- report ---------------------------------------------------------------------------


MODE_NAMES = {
    "ours": "(a) ours: DeliveryWorker",
    "traced": "(t) ours, traced",
    "before": "(p) ours, --before checkout",
    "bare": "(b) bare requests.Session loop",
    "curl": "(b') bare pycurl multi loop",
    "rq": "(c) one RQ job each",
}


def report(rounds: list[dict], opts, database_url: str) -> dict:
    def median(mode: str, key: str) -> float:
        return statistics.median(r[mode][key] for r in rounds)

    modes = [m for m in MODE_NAMES if m in rounds[0]]
    rate = {m: median(m, "per_s") for m in modes}
    engine = database_url.split(":", 1)[0]
    print()
    print(
        f"{opts.events} deliveries, {opts.tenants} tenants, {opts.workers} processes each: "
        f"ours and curl {opts.concurrency} requests at once, bare {opts.slots} threads; "
        f"{opts.payload_bytes}-byte payloads, {engine}, {len(rounds)} round(s), medians; "
        f"(c) uses {'the forking Worker' if opts.rq_fork else 'SimpleWorker'}"
    )
    header = f"{'mode':<34}{'per s':>7}{'seconds':>8}{'busy cores':>11}"
    header += f"{'CPU ms/req: client':>19}{'receiver':>9}{'redis':>7}"
    print(header)
    print("-" * len(header))
    for mode in modes:
        per_request = {
            key: median(mode, key) / opts.events * 1000
            for key in ("client_cpu", "receiver_cpu", "redis_cpu")
        }
        print(
            f"{MODE_NAMES[mode]:<34}{rate[mode]:>7.0f}{median(mode, 'elapsed'):>8.2f}"
            f"{median(mode, 'machine_busy_cores'):>11.2f}{per_request['client_cpu']:>19.2f}"
            f"{per_request['receiver_cpu']:>9.2f}{per_request['redis_cpu']:>7.2f}"
        )
    print()
    figures: dict = {
        "deliveries_per_s": round(rate["ours"], 1) if "ours" in rate else None,
        "bare_requests_per_s": round(rate["bare"], 1) if "bare" in rate else None,
        "bare_curl_per_s": round(rate["curl"], 1) if "curl" in rate else None,
        "healthy_with_hung_ratio": None,
        "hung_in_flight_max": None,
    }
    if "rq" in rate:
        figures["rq_job_per_delivery_per_s"] = round(rate["rq"], 1)
    if "ours" in rate and "bare" in rate:
        figures["ours_over_bare"] = round(rate["ours"] / rate["bare"], 3)
        print(f"ours / bare   = {rate['ours'] / rate['bare']:6.1%}   (goal >= 70%)")
    if "ours" in rate and "curl" in rate:
        figures["ours_over_curl"] = round(rate["ours"] / rate["curl"], 3)
        print(f"ours / curl   = {rate['ours'] / rate['curl']:6.1%}   (the HTTP part's ceiling)")
    for other, label in (("before", "ours / before"), ("traced", "traced / ours")):
        if "ours" in rate and other in rate:
            ratio = (
                rate["ours"] / rate["before"] if other == "before" else rate[other] / rate["ours"]
            )
            figures[label.replace(" / ", "_over_")] = round(ratio, 3)
            print(f"{label:<14}= {ratio:6.1%}")
    if "ours" in rate and "rq" in rate:
        figures["ours_over_rq_job"] = round(rate["ours"] / rate["rq"], 2)
        print(f"ours / rq-job = {rate['ours'] / rate['rq']:6.1f}x   (goal >= 5x)")
    for index, r in enumerate(rounds):
        line = ", ".join(f"{m} {r[m]['per_s']:.0f}/s" for m in modes)
        if "ours" in r:
            for other in ("bare", "curl", "rq"):
                if other in r:
                    line += f"; ours/{other} {r['ours']['per_s'] / r[other]['per_s']:.2f}"
            line += f"; ours made {r['ours']['attempts']} attempts"
            line += f", {r['ours']['duplicates']} duplicate requests"
        print(f"round {index + 1}: {line}")
    hung_runs = [r["hung"] for r in rounds if "hung" in r]
    if hung_runs:
        report_hung(hung_runs, opts)
        figures["healthy_with_hung_ratio"] = round(
            statistics.median(h["ratio"] for h in hung_runs), 3
        )
        figures["hung_in_flight_max"] = min(h["hung_in_flight_max"] for h in hung_runs)
    figures.update(
        events=opts.events,
        tenants=opts.tenants,
        workers=opts.workers,
        slots=opts.slots,
        concurrency=opts.concurrency,
        hung=opts.hung if hung_runs else 0,
        payload_bytes=opts.payload_bytes,
        database=engine,
        rq_worker="Worker" if opts.rq_fork else "SimpleWorker",
        rounds=rounds,
    )
    return figures


def report_hung(runs: list[dict], opts) -> None:
    print()
    print(
        f"hung run: ONE worker, DELIVERY_CONCURRENCY={runs[0]['concurrency']}, the same "
        f"{opts.events} healthy deliveries alone, then with {opts.hung} hung endpoints held"
    )
    header = f"{'run':<5}{'phase':<22}{'per s':>7}{'seconds':>8}{'busy cores':>11}"
    header += f"{'CPU ms/req: worker':>19}{'receiver':>9}{'redis':>7}{'attempts':>9}{'dup':>5}"
    print(header)
    print("-" * len(header))
    for index, run in enumerate(runs):
        for phase, name in (("alone", "healthy alone"), ("with_hung", "healthy + hung")):
            r = run[phase]
            print(
                f"{index + 1:<5}{name:<22}{r['per_s']:>7.0f}{r['elapsed']:>8.2f}"
                f"{r['machine_busy_cores']:>11.2f}{r['client_cpu'] / opts.events * 1000:>19.2f}"
                f"{r['receiver_cpu'] / opts.events * 1000:>9.2f}"
                f"{r['redis_cpu'] / opts.events * 1000:>7.2f}{r['attempts']:>9}{r['duplicates']:>5}"
            )
        print(
            f"     ratio {run['ratio']:.3f}; hung held: {run['hung_held_before']} after "
            f"{run['hung_fill_seconds']:.1f} s; during the healthy drain max "
            f"{run['hung_in_flight_max']}, min {run['hung_held_min']}, "
            f"{run['hung_held_after']} at its end (scheduler: "
            f"{run['hung_in_flight_scheduler']} in flight), "
            f"{run['hung_connections_accepted']} connections accepted, "
            f"{run['seconds_since_hung_started']:.1f} s after the hung ones were enqueued"
        )
    print()


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2, help="processes per mode (default 2)")
    parser.add_argument(
        "--events",
        type=int,
        default=20000,
        help="deliveries (default 20000: at 5000 a run of ~2 s is much ramp-up and noise)",
    )
    parser.add_argument("--tenants", type=int, default=50, help="tenants, one endpoint each")
    parser.add_argument(
        "--slots", type=int, default=16, help="(b): requests threads per process (default 16)"
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=64,
        help="(a): DELIVERY_CONCURRENCY per worker; (b'): POSTs at once per process (default 64)",
    )
    parser.add_argument(
        "--hung",
        type=int,
        default=500,
        help="(h): hung endpoints held while the healthy backlog drains (default 500)",
    )
    parser.add_argument("--payload-bytes", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=1, help="repeat the modes; report medians")
    parser.add_argument(
        "--database-url", help="a dedicated *bench* database (default: temp SQLite)"
    )
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/13")
    parser.add_argument("--rq-fork", action="store_true", help="(c) with the forking rq Worker")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per mode")
    parser.add_argument("--json", metavar="PATH", help="write the figures as JSON")
    parser.add_argument(
        "--modes",
        default="bare,curl,ours,rq",
        help="which of bare, curl, ours, traced, before, rq, hung, in this order "
        "(default bare,curl,ours,rq)",
    )
    parser.add_argument(
        "--before", type=Path, metavar="DIR", help="(p): an older checkout's workers"
    )
    parser.add_argument(
        "--py-spy", metavar="DIR", help="profile (a) and (h)'s two drains with py-spy into DIR"
    )
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (worker logs)")
    return parser.parse_args()


def main() -> None:
    opts = parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="bench-delivery-"))
    receiver = None
    sink = OtlpSink().__enter__()
    try:
        database_url = prepare_database(opts.database_url, workdir)
        setup_django(database_url, opts.redis_url, workdir)
        redis_client = clean_redis(opts.redis_url, REDIS_MARKER)
        receiver = Receiver()
        started = time.monotonic()
        deliveries = create_backlog(
            receiver.url,
            opts.events,
            opts.tenants,
            opts.payload_bytes,
            cap=4 * max(opts.slots, opts.concurrency + opts.hung) * opts.workers,
        )
        print(
            f"created {len(deliveries)} deliveries in {time.monotonic() - started:.1f} s",
            flush=True,
        )
        payloads = [
            (
                {
                    "Content-Type": "application/json",
                    "webhook-id": d.event_id,
                    "webhook-timestamp": str(int(time.time())),
                    "webhook-signature": "v1," + "A" * 44,
                },
                bytes(d.event.payload),
            )
            for d in deliveries
        ]
        payload_file = workdir / "payloads.pickle"
        payload_file.write_bytes(pickle.dumps(payloads))
        background = [background_load()]
        rounds = []
        for index in range(opts.rounds):
            r = {}
            for mode in opts.modes.split(","):
                if mode in ("bare", "curl"):
                    r[mode] = run_bare(opts, receiver, redis_client, payload_file, mode)
                elif mode in ("ours", "traced", "before"):
                    if mode == "before" and opts.before is None:
                        sys.exit("mode before needs --before DIR")
                    variant = {
                        "traced": {"env": sink.env},
                        "before": {"root": opts.before.resolve() if opts.before else ROOT},
                    }.get(mode, {})
                    r[mode] = run_ours(
                        opts, receiver, redis_client, deliveries, database_url, workdir, **variant
                    )
                elif mode == "rq":
                    r[mode] = run_rq_jobs(
                        opts, receiver, redis_client, deliveries, database_url, workdir
                    )
                elif mode == "hung":
                    r[mode] = run_hung(
                        opts, receiver, redis_client, deliveries, database_url, workdir
                    )
                    print(f"round {index + 1}: hung ratio {r[mode]['ratio']:.3f}", flush=True)
                    continue
                else:
                    sys.exit(f"unknown mode {mode!r}: bare, curl, ours, rq or hung")
                print(f"round {index + 1}: {mode} {r[mode]['per_s']:.0f}/s", flush=True)
            rounds.append(r)
        background.append(background_load())
        print(
            "machine busy while this script was idle (other work on the shared CPUs): "
            + ", ".join(f"{cores:.2f}" for cores in background)
            + " cores"
        )
        figures = report(rounds, opts, database_url)
        figures["background_busy_cores"] = background
        if opts.json:
            Path(opts.json).write_text(json.dumps(figures, indent=2) + "\n")
    finally:
        sink.__exit__()
        if receiver is not None:
            receiver.close()
        if opts.keep:
            print(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--serve-receiver":
        serve_receiver()
    elif len(sys.argv) > 1 and sys.argv[1] == "--serve-hung":
        serve_hung()
    elif len(sys.argv) > 1 and sys.argv[1] in ("--bare-client", "--curl-client"):
        url, payload_file, start, count, parallel = sys.argv[2:7]
        client = bare_client if sys.argv[1] == "--bare-client" else curl_client
        client(url, payload_file, int(start), int(count), int(parallel))
    else:
        with contextlib.suppress(KeyboardInterrupt):
            main()

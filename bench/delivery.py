"""End-to-end deliveries per second into a fast local receiver, three ways, in one run.

    .venv/bin/python bench/delivery.py                      # SQLite in a temp dir
    .venv/bin/python bench/delivery.py --database-url postgres://postgres@127.0.0.1:5432/bench_delivery

(a) ours: W `manage.py rqworker default maintenance` processes (DeliveryWorker, each
    with DELIVERY_SLOTS slot threads) drain N pre-created deliveries (T tenants, one
    signed endpoint each, all on the receiver).
(b) bare: W processes x the same number of threads posting the same payloads with one
    shared `requests.Session` per process: the ceiling for this HTTP client.
(c) one RQ job per delivery: W `manage.py rqworker default --worker-class
    rq.worker.SimpleWorker` processes; each job loads the Delivery row (with its event
    and endpoint), posts the payload on a per-process pooled session and marks the row
    delivered. No signature, no Attempt row: less work than (a) does.

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
import shutil
import signal
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
from delivery.simulation.environment import Workers  # noqa: E402

REDIS_MARKER = "fairhooks:bench-delivery"
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
        status=Delivery.DELIVERED, attempts=F("attempts") + 1, delivered_at=timezone.now()
    )


# --- setup: a dedicated database and Redis db -----------------------------------------


def setup_django(database_url: str, redis_url: str, workdir: Path) -> None:
    os.environ.update(
        DJANGO_SETTINGS_MODULE="webhooks.settings",
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
    from tenants.models import Endpoint, EndpointSecret, Tenant
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
    EndpointSecret.objects.bulk_create([EndpointSecret(endpoint=e) for e in endpoints])
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
        status=Delivery.PENDING,
        lane=Delivery.FRESH,
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

    return Delivery.objects.filter(status=Delivery.DELIVERED).count()


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
        "DELIVERY_SLOTS": str(opts.slots),
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


def run_ours(opts, receiver, redis_client, deliveries, database_url, workdir) -> dict:
    from delivery.enqueueing import item_for, reset_scheduler
    from delivery.models import Attempt
    from delivery.scheduler import Scheduler

    reset_deliveries()
    clean_redis(opts.redis_url, REDIS_MARKER)
    reset_scheduler()
    receiver.reset()
    workers = Workers(opts.workers, worker_env(opts, database_url, workdir), workdir, "ours")
    try:
        workers.wait_registered(redis_client, 60)
        cpu_before = workers_cpu(workers)
        probe = Probe(redis_client)
        scheduler = Scheduler.from_settings()
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


def start_profilers(opts, workers: Workers, workdir: Path) -> list:
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
                str(out / f"ours-{index}.txt"),
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


def run_bare(opts, receiver, redis_client, payload_file: Path) -> dict:
    receiver.reset()
    per_process = -(-opts.events // opts.workers)
    clients = [
        subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--bare-client",
                receiver.url,
                str(payload_file),
                str(index * per_process),
                str(per_process),
                str(opts.slots),
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


# --- report ---------------------------------------------------------------------------


MODE_NAMES = {
    "ours": "(a) ours: DeliveryWorker",
    "bare": "(b) bare requests.Session loop",
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
        f"{opts.events} deliveries, {opts.tenants} tenants, {opts.workers} processes x "
        f"{opts.slots} threads, {opts.payload_bytes}-byte payloads, {engine}, "
        f"{len(rounds)} round(s), medians; (c) uses "
        f"{'the forking Worker' if opts.rq_fork else 'SimpleWorker'}"
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
    figures: dict = {"deliveries_per_s": round(rate.get("ours", 0), 1)}
    if "bare" in rate:
        figures["bare_requests_per_s"] = round(rate["bare"], 1)
    if "rq" in rate:
        figures["rq_job_per_delivery_per_s"] = round(rate["rq"], 1)
    if "ours" in rate and "bare" in rate:
        figures["ours_over_bare"] = round(rate["ours"] / rate["bare"], 3)
        print(f"ours / bare   = {rate['ours'] / rate['bare']:6.1%}   (goal >= 70%)")
    if "ours" in rate and "rq" in rate:
        figures["ours_over_rq_job"] = round(rate["ours"] / rate["rq"], 2)
        print(f"ours / rq-job = {rate['ours'] / rate['rq']:6.1f}x   (goal >= 5x)")
    for index, r in enumerate(rounds):
        line = ", ".join(f"{m} {r[m]['per_s']:.0f}/s" for m in modes)
        if "ours" in r:
            for other in ("bare", "rq"):
                if other in r:
                    line += f"; ours/{other} {r['ours']['per_s'] / r[other]['per_s']:.2f}"
            line += f"; ours made {r['ours']['attempts']} attempts"
            line += f", {r['ours']['duplicates']} duplicate requests"
        print(f"round {index + 1}: {line}")
    figures.update(
        events=opts.events,
        tenants=opts.tenants,
        workers=opts.workers,
        slots=opts.slots,
        payload_bytes=opts.payload_bytes,
        database=engine,
        rq_worker="Worker" if opts.rq_fork else "SimpleWorker",
        rounds=rounds,
    )
    return figures


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
        "--slots", type=int, default=16, help="DELIVERY_SLOTS = bare threads per process"
    )
    parser.add_argument("--payload-bytes", type=int, default=512)
    parser.add_argument(
        "--rounds", type=int, default=1, help="repeat (b), (a), (c); report medians"
    )
    parser.add_argument(
        "--database-url", help="a dedicated *bench* database (default: temp SQLite)"
    )
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/13")
    parser.add_argument("--rq-fork", action="store_true", help="(c) with the forking rq Worker")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per mode")
    parser.add_argument("--json", metavar="PATH", help="write the figures as JSON")
    parser.add_argument(
        "--modes", default="bare,ours,rq", help="which modes, in this order (default all)"
    )
    parser.add_argument("--py-spy", metavar="DIR", help="profile (a) with py-spy into DIR")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (worker logs)")
    return parser.parse_args()


def main() -> None:
    opts = parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="bench-delivery-"))
    receiver = None
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
            cap=4 * opts.slots * opts.workers,
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
                if mode == "bare":
                    r[mode] = run_bare(opts, receiver, redis_client, payload_file)
                elif mode == "ours":
                    r[mode] = run_ours(
                        opts, receiver, redis_client, deliveries, database_url, workdir
                    )
                elif mode == "rq":
                    r[mode] = run_rq_jobs(
                        opts, receiver, redis_client, deliveries, database_url, workdir
                    )
                else:
                    sys.exit(f"unknown mode {mode!r}: bare, ours or rq")
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
        if receiver is not None:
            receiver.close()
        if opts.keep:
            print(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--serve-receiver":
        serve_receiver()
    elif len(sys.argv) > 1 and sys.argv[1] == "--bare-client":
        url, payload_file, start, count, threads = sys.argv[2:7]
        bare_client(url, payload_file, int(start), int(count), int(threads))
    else:
        with contextlib.suppress(KeyboardInterrupt):
            main()

"""Chaos, end to end: HTTP ingest, real worker processes, a recording receiver.

The promise: every event we acknowledged is delivered (or dead-lettered), at least once,
with the same webhook-id on every try. Figures measured here are in docs/RELIABILITY.md.
"""

import json
import logging
import random
import signal
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest
import redis
import requests

from delivery.models import Delivery
from delivery.scheduler import get_scheduler, reset_scheduler
from tests import signing
from tests.delivery_helpers import start_worker, statuses, wait_until
from tests.factories import make_endpoint, make_source, make_tenant
from tests.http_receivers import HangingServer, Recorder
from tests.private_redis import PrivateRedis
from webhooks.models import Source

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.chaos]
SECRET = "chaos-secret"
TENANTS = [f"shop-{i}.example" for i in range(8)]


def post_event(session: requests.Session, base_url: str, shop: str) -> requests.Response:
    body = json.dumps({"shop": shop, "n": uuid.uuid4().hex}).encode()
    return session.post(
        f"{base_url}/ingest/shop/",
        data=body,
        headers={
            "Content-Type": "application/json",
            "X-Shopify-Shop-Domain": shop,
            "X-Shopify-Event-Id": uuid.uuid4().hex,
            "X-Shopify-Hmac-Sha256": signing.shopify(SECRET, body),
        },
        timeout=30,
    )


def produce(base_url: str, count: int, producers: int) -> list[str]:
    """`producers` threads post `count` events in all; returns the accepted event ids."""
    accepted: list[str] = []
    lock = threading.Lock()

    def run(share: int) -> None:
        session = requests.Session()
        session.trust_env = False
        for index in range(share):
            response = post_event(session, base_url, TENANTS[index % len(TENANTS)])
            assert response.status_code == 202, response.text
            with lock:
                accepted.append(response.json()["id"])

    threads = [threading.Thread(target=run, args=(count // producers,)) for _ in range(producers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return accepted


@pytest.fixture
def gateway(settings):
    """A Shopify-style source delivering every tenant's events to one recording app."""
    settings.ALLOW_PRIVATE_DESTINATIONS = True
    with Recorder() as receiver:
        source = make_source(
            "shop",
            secret=SECRET,
            scheme=Source.SHOPIFY,
            fairness_key="header:X-Shopify-Shop-Domain",
        )
        for key in TENANTS:
            make_tenant(key)
        source.destinations.add(make_endpoint(None, receiver.url + "/app", max_in_flight=16))
        yield receiver


@pytest.fixture
def workers():
    running: list = []

    def start(**env: str):
        process = start_worker(**{"LEASE_SECONDS": "2", "MAINTENANCE_INTERVAL_SECONDS": "1", **env})
        running.append(process)
        return process

    yield start, running
    for process in running:
        if process.poll() is None:
            # Not SIGKILL: with PYTHONFAULTHANDLER the worker writes each thread's stack to
            # its log first, which is what a stuck worker needs to be understood.
            process.send_signal(signal.SIGABRT)
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                process.kill()
        process.wait(10)
        # Shown by pytest only when the test failed.
        lines = Path(process.log_path).read_text(errors="replace").splitlines()
        print(f"--- worker log {process.log_path} (exit {process.returncode}), last lines:")
        print("\n".join(lines[-60:]))


def delivered_ids(receiver: Recorder) -> list[str]:
    return [request.headers["webhook-id"] for request in receiver.requests]


def test_killing_workers_at_random_loses_nothing(live_server, gateway, workers) -> None:
    start, running = workers
    start()
    start()
    stop_chaos = threading.Event()
    kills = 0

    def chaos() -> None:
        nonlocal kills
        rng = random.Random(7)
        while not stop_chaos.wait(rng.uniform(0.5, 1.5)):
            victims = [p for p in running if p.poll() is None]
            if victims:
                rng.choice(victims).send_signal(signal.SIGKILL)
                kills += 1
                start()

    chaos_thread = threading.Thread(target=chaos)
    chaos_thread.start()
    accepted = produce(live_server.url, 2000, producers=10)
    time.sleep(2)
    stop_chaos.set()
    chaos_thread.join()
    assert wait_until(
        lambda: statuses() == {Delivery.Status.DELIVERED: len(accepted)}, timeout=120
    ), statuses()
    received = delivered_ids(gateway)
    assert set(received) == set(accepted)  # nothing lost
    print(
        f"chaos: {len(accepted)} accepted, {kills} workers killed, "
        f"{len(received) - len(set(received))} duplicates (same webhook-id), 0 lost"
    )
    assert kills >= 3


def test_redis_restart_without_persistence_is_rebuilt_from_the_database(
    live_server, gateway, workers, private_redis
) -> None:
    start, _ = workers
    start(REDIS_URL=private_redis.url)
    first = produce(live_server.url, 300, producers=5)
    private_redis.restart()  # the schedule is gone: lanes, leases, epoch
    restarted_at = time.monotonic()
    second = produce(live_server.url, 300, producers=5)
    assert wait_until(lambda: statuses() == {Delivery.Status.DELIVERED: 600}, timeout=60), (
        statuses()
    )
    recovered_in = time.monotonic() - restarted_at
    assert set(delivered_ids(gateway)) == set(first + second)
    print(f"redis restart: 600 accepted, all delivered {recovered_in:.1f}s after the restart")
    assert recovered_in < 60


@pytest.fixture
def private_redis(settings, tmp_path):
    """A Redis of this test's own (so it may be restarted or flushed), used by everything."""
    private = PrivateRedis(tmp_path)
    private.start()
    settings.REDIS_URL = private.url
    reset_scheduler()
    yield private
    reset_scheduler()
    private.stop()


def test_flushall_is_rebuilt_from_the_database(
    live_server, gateway, workers, private_redis
) -> None:
    start, _ = workers
    start(REDIS_URL=private_redis.url)
    accepted = produce(live_server.url, 200, producers=4)
    redis.Redis.from_url(private_redis.url).flushall()
    flushed_at = time.monotonic()
    more = produce(live_server.url, 100, producers=4)
    assert wait_until(lambda: statuses() == {Delivery.Status.DELIVERED: 300}, timeout=60), (
        statuses()
    )
    assert set(delivered_ids(gateway)) == set(accepted + more)
    assert time.monotonic() - flushed_at < 60


def test_redis_down_during_ingest_still_acknowledges_and_delivers_after(
    live_server, gateway, workers, private_redis, caplog
) -> None:
    start, _ = workers
    worker = start(REDIS_URL=private_redis.url)
    # A running worker (registered in RQ) sees Redis go away and rides it out.
    probe = redis.Redis.from_url(private_redis.url)
    assert wait_until(lambda: probe.scard("rq:workers") == 1, timeout=30)
    logged_before = len(Path(worker.log_path).read_text(errors="replace").splitlines())
    private_redis.stop()
    stopped_at = time.monotonic()
    with caplog.at_level(logging.WARNING):
        accepted = produce(live_server.url, 100, producers=4)  # every one answered 202
        time.sleep(max(0.0, 5 - (time.monotonic() - stopped_at)))  # a 5 s outage at least
    assert Delivery.objects.filter(needs_schedule=True).count() == 100
    private_redis.start()
    assert wait_until(lambda: statuses() == {Delivery.Status.DELIVERED: 100}, timeout=60), (
        statuses()
    )
    assert set(delivered_ids(gateway)) == set(accepted)
    # Said, not shouted: the web side and the worker together write a handful of lines
    # for the outage (core.outage_log), not one per event or per retry.
    worker_lines = Path(worker.log_path).read_text(errors="replace").splitlines()[logged_before:]
    worker_lines = [line for line in worker_lines if line.strip()]
    web_lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    print(f"redis outage: {len(web_lines)} web and {len(worker_lines)} worker log lines")
    assert len(web_lines) + len(worker_lines) < 20, "\n".join(web_lines + worker_lines)


def test_hung_endpoint_holds_only_its_cap_while_others_deliver(workers, settings) -> None:
    from ingest.publish import publish

    settings.ALLOW_PRIVATE_DESTINATIONS = True
    start, _ = workers
    with HangingServer() as hung, Recorder() as healthy:
        stuck, fine = make_tenant("stuck"), make_tenant("fine")
        make_endpoint(stuck, hung.url, max_in_flight=1, timeout_seconds=30)
        make_endpoint(fine, healthy.url, max_in_flight=4)
        for i in range(20):
            publish(stuck, "x", {"i": i})
        time.sleep(0.2)
        started = time.monotonic()
        for i in range(100):
            publish(fine, "x", {"i": i})
        # Leases long enough not to expire under a loaded CI machine: an expired lease
        # frees the slot (by design, for crashed workers) and would open a second request.
        start(DELIVERY_CONCURRENCY="4", LEASE_SECONDS="15")
        healthy.wait_for(100, timeout=60)
        took = time.monotonic() - started
    assert len(hung.connections) <= 1  # the cap: one slot held, three free for everyone else
    print(f"hung endpoint: 100 healthy deliveries in {took:.1f}s beside it")
    assert took < 30


@pytest.mark.slow
def test_load_every_event_delivered_exactly_once_and_no_lane_starves(
    live_server, gateway, workers
) -> None:
    from webhooks.models import Event

    start, _ = workers
    # Leases long enough that a loaded machine never lets one expire: no crash, no duplicate.
    # A deployed schedule has its epoch; without it the first sweep rebuilds the lanes
    # from the database while events arrive, which may send a few twice (by design).
    get_scheduler().start_epoch()
    start(LEASE_SECONDS="30")
    start(LEASE_SECONDS="30")
    accepted = produce(live_server.url, 4000, producers=20)
    assert wait_until(lambda: statuses() == {Delivery.Status.DELIVERED: 4000}, timeout=120), (
        statuses()
    )
    received = delivered_ids(gateway)
    assert set(received) == set(accepted)
    # Without crashes, a second request only follows a recorded failed attempt (a
    # connection dropped after the receiver read the body, say): never silently.
    from collections import Counter

    from delivery.models import Attempt

    repeated = {event_id for event_id, n in Counter(received).items() if n > 1}
    retried = set(
        Attempt.objects.exclude(outcome=Attempt.Outcome.DELIVERED).values_list(
            "delivery__event_id", flat=True
        )
    )
    failures = list(
        Attempt.objects.exclude(outcome=Attempt.Outcome.DELIVERED).values_list("error", flat=True)[
            :5
        ]
    )
    print(
        f"load: {len(received) - len(set(received))} repeated requests; failed attempts: {failures}"
    )
    assert repeated <= retried
    arrivals = {r.headers["webhook-id"]: r.arrived_wall for r in gateway.requests}
    waits: dict[str, list[float]] = {}
    for event_id, tenant_key, received_at in Event.objects.values_list(
        "id", "tenant__key", "received_at"
    ):
        waits.setdefault(tenant_key, []).append(arrivals[event_id] - received_at.timestamp())
    medians = {key: sorted(values)[len(values) // 2] for key, values in waits.items()}
    overall = sorted(w for values in waits.values() for w in values)[len(accepted) // 2]
    print(
        f"load: 4000 events, per-tenant median wait {min(medians.values()):.2f}-{max(medians.values()):.2f}s"
    )
    assert len(medians) == len(TENANTS)
    assert max(medians.values()) <= 3 * overall + 0.5  # no tenant's lane left behind


def test_a_worker_killed_mid_run_leaves_the_adaptive_limit_in_the_schedule(
    settings, workers
) -> None:
    """The limit lives in the scheduler, not in a worker (docs/SCHEDULER.md, "Adaptive
    limits"): a worker killed while the limit is up leaves it where it was, and the next
    worker goes on from it and delivers everything."""
    from ingest.publish import publish
    from tests.http_receivers import Reply
    from tests.scheduler_helpers import endpoint_row

    settings.ALLOW_PRIVATE_DESTINATIONS = True
    settings.DELIVERY_ADAPTIVE_CONCURRENCY = "all"  # this process enqueues
    start, _ = workers
    adaptive = {"DELIVERY_ADAPTIVE_CONCURRENCY": "1", "DELIVERY_CONCURRENCY": "32"}

    def limit() -> float:
        return endpoint_row(get_scheduler(), endpoint.pk).get("al", 0)

    with Recorder(Reply(200, delay=0.2)) as receiver:
        tenant = make_tenant("adaptive.example")
        endpoint = make_endpoint(tenant, receiver.url, max_in_flight=40)
        for i in range(600):
            publish(tenant, "x", {"i": i})
        assert limit() == 4  # a new limit starts low
        first = start(**adaptive)
        assert wait_until(lambda: limit() >= 16, timeout=30)
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        kept = limit()
        assert kept >= 16  # the crash changed nothing of it
        time.sleep(1)
        assert limit() == kept  # and nothing moves it while no worker answers
        start(**adaptive)
        assert wait_until(lambda: statuses() == {Delivery.Status.DELIVERED: 600}, timeout=90), (
            statuses()
        )
    assert set(delivered_ids(receiver)) == {
        str(event_id) for event_id in Delivery.objects.values_list("event_id", flat=True)
    }

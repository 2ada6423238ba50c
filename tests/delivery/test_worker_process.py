"""Real worker processes (`manage.py rqworker`): registration, crash recovery, warm shutdown,
and recovery from a Redis that lost the schedule."""

import signal
import subprocess
import time

import pytest
from rq import Queue, Worker

from core import redis_connection
from delivery.models import Delivery
from delivery.scheduler import get_scheduler, reset_scheduler
from delivery.worker import heartbeats
from ingest.publish import publish
from tests.delivery_helpers import start_worker, statuses, wait_until
from tests.factories import make_endpoint, make_tenant
from tests.http_receivers import Recorder, Reply
from tests.private_redis import PrivateRedis

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture
def workers():
    started = []

    def start(**env: str):
        process = start_worker(**env)
        started.append(process)
        return process

    yield start
    for process in started:
        if process.poll() is None:
            # Still running means a test failed: faulthandler (PYTHONFAULTHANDLER) writes
            # every thread's stack into the worker's log, which pytest then shows.
            process.send_signal(signal.SIGABRT)
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
        with open(process.log_path, errors="replace") as log:
            print(f"--- worker {process.pid} exited {process.returncode} ---\n{log.read()}")


def test_worker_registers_in_rq_and_delivers(workers, redis_conn) -> None:
    with Recorder() as receiver:
        tenant = make_tenant("acme")
        make_endpoint(tenant, receiver.url)
        for i in range(10):
            publish(tenant, "x", {"i": i})
        process = workers()
        receiver.wait_for(10, timeout=30)
        assert wait_until(lambda: statuses() == {Delivery.Status.DELIVERED: 10}, timeout=10)
        assert wait_until(lambda: len(Worker.all(connection=redis_conn)) == 1)
        # Its engine delivers, and says so: /readyz and `lanes` count it.
        assert wait_until(lambda: len(heartbeats.live(redis_conn)) == 1)
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
        assert heartbeats.live(redis_conn) == {}  # a worker that left is not counted


def test_on_a_new_redis_nothing_in_flight_goes_out_twice(workers) -> None:
    """Found by a chaos run (issue 42): ingest alone sets no schedule marker, so on a new
    Redis the worker's first sweep "rebuilt" the live schedule under its leases and sent
    what was in flight again. The worker now builds the schedule before its first pick."""
    with Recorder(Reply(200, delay=2.0)) as receiver:
        tenant = make_tenant("acme")
        make_endpoint(tenant, receiver.url, max_in_flight=8)
        for i in range(6):
            publish(tenant, "x", {"i": i})
        assert get_scheduler().epoch() is None  # what ingest alone leaves
        workers(MAINTENANCE_INTERVAL_SECONDS="1")
        receiver.wait_for(6, timeout=30)
        # Sweeps run every second while the first requests are still being answered.
        assert wait_until(lambda: statuses() == {Delivery.Status.DELIVERED: 6}, timeout=30)
        time.sleep(2.5)
        sent = [request.headers["webhook-id"] for request in receiver.requests]
    assert len(sent) == 6 and len(set(sent)) == 6


def test_a_worker_started_before_redis_waits_for_it_then_delivers(
    workers, settings, tmp_path
) -> None:
    """Found by a chaos run (issue 42): started while Redis was down, a worker exited with
    code 1, which a supervisor turns into a crash loop. It now waits, saying so once."""
    server = PrivateRedis(tmp_path)  # not started yet
    with Recorder() as receiver:
        tenant = make_tenant("acme")
        make_endpoint(tenant, receiver.url)
        process = workers(REDIS_URL=server.url)
        time.sleep(3)
        assert process.poll() is None  # still there, waiting
        server.start()
        try:
            settings.REDIS_URL = server.url
            redis_connection.forget()
            reset_scheduler()
            accepted = publish(tenant, "x", {})
            [request] = receiver.wait_for(1, timeout=30)
            assert request.headers["webhook-id"] == accepted.event.id
            process.send_signal(signal.SIGTERM)
            assert process.wait(30) == 0
        finally:
            redis_connection.forget()
            reset_scheduler()
            server.stop()
    with open(process.log_path) as log:
        waiting = [line for line in log if "waiting for it to start" in line]
    assert len(waiting) == 1


def test_killed_worker_its_delivery_comes_back_with_the_same_webhook_id(workers) -> None:
    with Recorder(Reply(200, delay=2.0), Reply(200)) as receiver:
        tenant = make_tenant("acme")
        make_endpoint(tenant, receiver.url)
        accepted = publish(tenant, "x", {})
        victim = workers()
        assert wait_until(lambda: get_scheduler().snapshot().in_flight == 1, timeout=30)
        time.sleep(0.5)  # the request is on its way to the (slow) receiver
        victim.send_signal(signal.SIGKILL)
        victim.wait(10)
        killed_at = time.monotonic()
        workers()
        assert wait_until(lambda: statuses() == {Delivery.Status.DELIVERED: 1}, timeout=60)
        recovered_in = time.monotonic() - killed_at
        ids = {request.headers["webhook-id"] for request in receiver.requests}
    assert ids == {accepted.event.id}
    assert recovered_in < 60


def test_sigterm_finishes_the_delivery_in_flight_then_exits(workers) -> None:
    with Recorder(Reply(200, delay=2.0)) as receiver:
        tenant = make_tenant("acme")
        make_endpoint(tenant, receiver.url)
        publish(tenant, "x", {})
        process = workers(LEASE_SECONDS="15")  # no expiry mid-request on a loaded machine
        assert wait_until(lambda: get_scheduler().snapshot().in_flight == 1, timeout=30)
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
        assert len(receiver.requests) == 1
    assert statuses() == {Delivery.Status.DELIVERED: 1}
    assert get_scheduler().snapshot().in_flight == 0


def test_schedule_lost_in_redis_is_rebuilt_from_the_database(workers, redis_conn) -> None:
    with Recorder() as receiver:
        tenant = make_tenant("acme")
        make_endpoint(tenant, receiver.url)
        for i in range(5):
            publish(tenant, "x", {"i": i})
        redis_conn.flushdb()  # as a Redis restart without persistence would
        workers(MAINTENANCE_INTERVAL_SECONDS="1")
        receiver.wait_for(5, timeout=30)
        assert wait_until(lambda: statuses() == {Delivery.Status.DELIVERED: 5}, timeout=10)


def test_worker_loop_steps_ride_out_a_redis_outage(tmp_path) -> None:
    """RQ quits its main loop on a Redis error outside the dequeue; ours skips the step."""
    import redis

    from delivery.worker import DeliveryWorker
    from tests.private_redis import PrivateRedis

    private_redis = PrivateRedis(tmp_path)
    private_redis.start()
    connection = redis.Redis.from_url(private_redis.url)
    worker = DeliveryWorker(["maintenance"], connection=connection)
    queue = Queue("maintenance", connection=connection)
    job = queue.enqueue("delivery.upkeep.maintenance.sweep")  # dequeued just before the outage
    private_redis.stop()
    worker.subscribe()  # start-up steps after registering, when Redis goes right then
    worker.set_state("started")
    worker.check_for_suspension(burst=False)
    worker.run_maintenance_tasks()
    worker.execute_job(job, queue)
    worker.heartbeat()
    worker.unsubscribe()  # teardown copes with the subscription that never happened
    with pytest.raises(redis.ConnectionError):  # the outage is real, not a stub
        connection.ping()


def test_a_window_replay_is_fed_by_the_workers_between_sweeps(workers, redis_conn) -> None:
    """The worker's replay feeder, not the (here 60 s) sweep, feeds chunk after chunk as
    each leaves the lane: 30 dead deliveries in chunks of 10 arrive within seconds."""
    from datetime import timedelta

    from django.utils import timezone

    from delivery.models import ReplayJob
    from delivery.replays import window as replay_window

    with Recorder() as receiver:
        tenant = make_tenant("acme")
        make_endpoint(tenant, receiver.url)
        for i in range(30):
            publish(tenant, "x", {"i": i})
        Delivery.objects.update(status=Delivery.Status.DEAD)  # as the worker leaves them:
        redis_conn.flushdb()  # finished, and in no schedule
        get_scheduler().start_epoch()
        now = timezone.now()
        window = replay_window.Window(
            start=now - timedelta(minutes=5), end=now + timedelta(minutes=1), statuses=("dead",)
        )
        job = replay_window.start(tenant, window, user=None, via="admin")
        assert job.matched == 30
        workers(
            REPLAY_CHUNK_SIZE="10", REPLAY_FEED_SECONDS="0.2", MAINTENANCE_INTERVAL_SECONDS="60"
        )
        receiver.wait_for(30, timeout=30)
        assert wait_until(lambda: statuses() == {Delivery.Status.DELIVERED: 30}, timeout=10)
        finished = ReplayJob.objects.filter(pk=job.pk, state="finished", fed=30)
        assert wait_until(finished.exists, timeout=10)
        assert len({request.headers["webhook-id"] for request in receiver.requests}) == 30

"""The worker's warm stop, in-process: the races a busy machine found between a SIGTERM
and the worker's own start-up and teardown."""

import signal
import time

import pytest
from rq.exceptions import StopRequested

from delivery.worker import DeliveryWorker


@pytest.fixture
def worker(redis_conn):
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    yield DeliveryWorker(["maintenance"], connection=redis_conn)
    for sig, handler in handlers.items():  # request_stop installs the force-stop ones
        signal.signal(sig, handler)


def test_a_stop_outside_the_wait_for_a_job_raises_nothing_and_ends_the_next_wait(worker) -> None:
    # Raising here used to escape from wherever the main thread was, such as starting
    # the engine's threads, and skip the teardown that finishes deliveries in flight.
    worker.request_stop(signal.SIGTERM, None)
    assert worker._stop_requested
    assert signal.getsignal(signal.SIGTERM) == worker.request_force_stop
    started = time.monotonic()
    assert worker.dequeue_job_and_maintain_ttl(timeout=30) is None
    assert time.monotonic() - started < 1


def test_a_stop_while_waiting_for_a_job_interrupts_the_wait(worker) -> None:
    worker._waiting_for_work = True  # as inside dequeue_job_and_maintain_ttl
    with pytest.raises(StopRequested):
        worker.request_stop(signal.SIGTERM, None)
    assert worker._stop_requested


def test_unsubscribing_is_bounded_when_the_listener_already_saw_its_channel_go(worker) -> None:
    # RQ's order (UNSUBSCRIBE, then stop the listener) let the listener read the reply,
    # find no subscription left and wait a minute for one, while stop() joined it.
    worker.subscribe()
    assert worker.pubsub.subscribed
    worker.pubsub.unsubscribe()
    deadline = time.monotonic() + 5
    while worker.pubsub.subscribed and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not worker.pubsub.subscribed  # the listener is now in its long wait
    started = time.monotonic()
    worker.unsubscribe()
    assert time.monotonic() - started < 3

"""The delivery worker: an RQ worker (registered, heartbeating, visible in the django-rq
dashboard) whose process also runs the delivery engine's slots.

RQ jobs remain for maintenance (the sweeper); webhooks never become RQ jobs. It is a
SimpleWorker because forking a process that runs threads is unsafe, and maintenance
jobs are few.

Shutdown: the first SIGTERM/SIGINT stops picking and waits for in-flight deliveries;
a second one exits at once, and the leases of anything unfinished bring it back.
"""

import logging
import signal
import threading
import time

import redis
from django.conf import settings
from django.db import close_old_connections
from rq import Queue
from rq.utils import now as rq_now
from rq.worker import SimpleWorker

from core import redis_connection
from core.outage_log import OutageFilter, OutageLog
from delivery.pipeline.engine import DeliveryEngine
from delivery.replays import window as replay_window
from delivery.upkeep import maintenance
from delivery.worker import heartbeats

logger = logging.getLogger(__name__)
# A worker started before Redis waits for it, pausing this long, doubled up to the most.
START_WAIT_FIRST_SECONDS = 0.5
START_WAIT_MAX_SECONDS = 5.0
_redis_down_at_start = OutageLog(logger)
SWEEP_LOCK_KEY = redis_connection.KEY_PREFIX + "maintenance:sweep-lock"
REPLAY_LOCK_KEY = redis_connection.KEY_PREFIX + "maintenance:replay-lock"


def wait_for_redis(connection: redis.Redis) -> None:
    """Started while Redis is down (a host booting, Redis restarting), wait for it with a
    growing pause rather than exit: under systemd or Kubernetes an exit is a crash loop.
    Said once a minute with a count; SIGTERM still ends the wait (nothing is in flight)."""
    pause = START_WAIT_FIRST_SECONDS
    while True:
        try:
            connection.ping()
            return
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            _redis_down_at_start.warn("Redis unavailable (%s): waiting for it to start", exc)
        time.sleep(pause)
        pause = min(pause * 2, START_WAIT_MAX_SECONDS)


def _quiet_rq_reconnects() -> None:
    """RQ logs an ERROR for each reconnection attempt while Redis is down (every one to
    sixty seconds): an expected outage, said once a minute at WARNING with a count."""
    rq_logger = logging.getLogger("rq.worker")
    if not any(isinstance(f, OutageFilter) for f in rq_logger.filters):
        rq_logger.addFilter(OutageFilter("could not connect to Redis"))


class DeliveryWorker(SimpleWorker):
    # After a Redis outage RQ backs off exponentially (up to 60 s by default) before it
    # dequeues again; the sweeper that rebuilds the schedule runs as an RQ job, so keep
    # the wait short: recovery within seconds of Redis returning, not a minute.
    max_connection_wait_time = 5.0
    _waiting_for_work = False  # blocked in RQ's dequeue (see request_stop)

    def __init__(self, queues, *args, connection=None, **kwargs) -> None:
        # RQ's own set-up already talks to Redis (and django-rq exits on its error).
        target = connection if connection is not None else getattr(queues[0], "connection", None)
        if target is not None:
            wait_for_redis(target)
        # An outage's steps (skipped RQ steps, the maintenance and replay timers): one line
        # a minute for them all, with a count.
        self._redis_down = OutageLog(logger)
        _quiet_rq_reconnects()
        super().__init__(queues, *args, connection=connection, **kwargs)

    def work(self, *args, **kwargs) -> bool:
        self._build_schedule_first()
        self.engine = DeliveryEngine(worker_id=f"rq-{self.name}")
        self._cold_stop = False
        self._maintenance_stop = threading.Event()
        return super().work(*args, **kwargs)

    def _build_schedule_first(self) -> None:
        """On a new Redis, build the schedule before this worker's engine picks (see
        maintenance.build_before_picking). Redis down: RQ's start-up decides, as before."""
        try:
            maintenance.build_before_picking()
        except redis.RedisError as exc:
            logger.warning("could not check the schedule before starting: %s", exc)
        finally:
            close_old_connections()

    def _install_signal_handlers(self) -> None:
        # Start delivering only once SIGTERM means "warm shutdown": a signal arriving
        # earlier would otherwise kill the process with deliveries in flight.
        super()._install_signal_handlers()
        self.engine.start()
        threading.Thread(target=self._schedule_maintenance, name="maintenance", daemon=True).start()
        threading.Thread(target=self._feed_replays, name="replay-feeder", daemon=True).start()
        threading.Thread(target=self._beat, name="heartbeat", daemon=True).start()

    # RQ's main loop quits on any Redis error outside its dequeue call (the suspension
    # check, registry cleaning, running a job it just dequeued, the heartbeat after it),
    # and so does its start-up after the worker registered (the pub/sub subscription for
    # `rq` commands, the state). A delivery worker must ride out an outage instead: skip
    # the step, and let the dequeue back off and reconnect. (Before it registers, a
    # worker waits for Redis: wait_for_redis.)
    def subscribe(self) -> None:
        self._outside_an_outage("pub/sub subscription (rq commands)", super().subscribe)

    def set_state(self, state: str, pipeline=None) -> None:
        if pipeline is not None:  # queued, not sent: nothing can fail here
            super().set_state(state, pipeline)
        else:
            self._outside_an_outage(f"state update ({state})", super().set_state, state)

    def check_for_suspension(self, burst: bool) -> None:
        self._outside_an_outage("suspension check", super().check_for_suspension, burst)

    def run_maintenance_tasks(self) -> None:
        self._outside_an_outage("registry cleaning", super().run_maintenance_tasks)

    def execute_job(self, job, queue) -> None:
        # Only maintenance runs as RQ jobs, and every one of them is idempotent and comes
        # round again next interval: a job caught by the outage is simply skipped. RQ's
        # registry cleaning later fails it if it was left marked as started.
        self._outside_an_outage(f"job {job.id}", super().execute_job, job, queue)

    def heartbeat(self, *args, **kwargs) -> None:
        self._outside_an_outage("heartbeat", super().heartbeat, *args, **kwargs)

    def _outside_an_outage(self, step: str, call, *args, **kwargs) -> None:
        try:
            call(*args, **kwargs)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            self._redis_down.warn("Redis unavailable, skipped the %s: %s", step, exc)

    def unsubscribe(self) -> None:
        # RQ sends UNSUBSCRIBE and then stops its listener thread. The listener can read
        # the reply first, find no subscription left and go back to waiting up to a minute
        # for one, while redis-py's stop() joins it without a bound: a SIGTERM'd worker
        # can hang that long on a busy machine. Stopping the loop first makes the reply that
        # wakes the listener its last read, and every wait here is bounded.
        listener = getattr(self, "pubsub_thread", None)
        if listener is None:  # the subscription never happened (Redis was down)
            return
        listener.stop(timeout=0)
        self._outside_an_outage("unsubscribe (rq commands)", self.pubsub.unsubscribe)
        listener.join(timeout=1)
        self.pubsub.close()

    def request_stop(self, signum, frame) -> None:
        # RQ's warm stop raises StopRequested out of the signal handler whenever the worker
        # is not running a job, that is wherever the main thread happens to be. Caught while
        # the engine's threads are starting (before RQ's loop and its teardown), it would end
        # the process at once with a delivery in flight, exit code 1. Only a thread blocked
        # waiting for a job needs interrupting; anywhere else, the loop sees the flag.
        self._stop_requested = True
        if self._waiting_for_work:
            super().request_stop(signum, frame)
            return
        self._shutdown_requested_date = rq_now()  # a second signal within 1 s is a repeat
        signal.signal(signal.SIGINT, self.request_force_stop)
        signal.signal(signal.SIGTERM, self.request_force_stop)
        self.handle_warm_shutdown_request()

    def dequeue_job_and_maintain_ttl(self, timeout, max_idle_time=None):
        self._waiting_for_work = True
        try:
            if self._stop_requested:  # asked between the loop's check and here
                return None  # RQ's loop ends on no job
            return super().dequeue_job_and_maintain_ttl(timeout, max_idle_time)
        finally:
            self._waiting_for_work = False

    def request_force_stop(self, signum, frame):
        self._cold_stop = True
        return super().request_force_stop(signum, frame)

    def teardown(self) -> None:
        engine = getattr(self, "engine", None)
        if engine is not None:
            self._maintenance_stop.set()
            self._outside_an_outage(
                "heartbeat removal", heartbeats.forget, self.connection, self.name
            )
            if self._cold_stop:
                engine.stop(graceful=False)
            else:
                logger.info(
                    "warm shutdown: finishing %d in-flight deliveries", len(engine.in_flight())
                )
                if not engine.stop(graceful=True):
                    logger.warning(
                        "deliveries still running at exit come back through their leases"
                    )
        super().teardown()

    def _beat(self) -> None:
        """While the engine delivers, say so (heartbeats.py) every BEAT_SECONDS."""
        while True:
            if self.engine.alive():
                self._outside_an_outage("heartbeat", heartbeats.beat, self.connection, self.name)
            if self._maintenance_stop.wait(heartbeats.BEAT_SECONDS):
                return

    def _schedule_maintenance(self) -> None:
        """Every interval one worker (whichever takes the lock) enqueues the sweep job."""
        interval = settings.MAINTENANCE_INTERVAL_SECONDS
        queue = Queue("maintenance", connection=self.connection)
        while not self._maintenance_stop.wait(interval):
            try:
                if not self.connection.set(SWEEP_LOCK_KEY, self.name, nx=True, ex=interval):
                    continue
                if self.engine.scheduler.epoch() is None:
                    # Redis lost the schedule: rebuild here and now rather than wait for
                    # RQ's main loop, which may still be backing off from the same outage.
                    maintenance.sweep()
                else:
                    queue.enqueue(
                        "delivery.upkeep.maintenance.sweep", job_timeout=300, result_ttl=600
                    )
            except redis.RedisError as exc:
                self._redis_down.warn("Redis unavailable, skipped the maintenance timer: %s", exc)
            except Exception:
                logger.exception("maintenance failed; trying again next interval")
            finally:
                close_old_connections()

    def _feed_replays(self) -> None:
        """Every REPLAY_FEED_SECONDS one worker (whichever takes the lock) feeds window
        replays whose last chunk has left the lane. The sweep alone (every 15 s) would cap
        a replay at one chunk per sweep, 48,000 deliveries an hour at the defaults, where
        the receiver may take far more; how fast the lane drains is the pace, not this."""
        interval = settings.REPLAY_FEED_SECONDS
        lock_ms = max(100, int(interval * 1000))
        while not self._maintenance_stop.wait(interval):
            try:
                if not self.connection.set(REPLAY_LOCK_KEY, self.name, nx=True, px=lock_ms):
                    continue
                # Not while the schedule is lost or being rebuilt (no epoch yet): a chunk
                # would go into a schedule the rebuild is still filling. The sweep feeds
                # again once it is whole.
                if self.engine.scheduler.epoch() is not None:
                    replay_window.feed_replays()
            except redis.RedisError as exc:
                self._redis_down.warn("Redis unavailable, skipped feeding replays: %s", exc)
            except Exception:
                logger.exception("feeding replays failed; trying again next interval")
            finally:
                close_old_connections()

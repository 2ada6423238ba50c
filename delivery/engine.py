"""N delivery slots (threads) pulling from the fair scheduler, sharing one HTTP session.

One RQ job per webhook would cost ~7 ms of RQ overhead each; instead a worker process
runs this engine beside its RQ loop. Each slot picks one lease at a time, so a
slot blocked on a slow endpoint holds exactly one lease and the endpoint caps bound
how many slots slow endpoints can hold.
"""

import logging
import threading
import time
import uuid

import redis
from django.conf import settings
from django.db import close_old_connections, connection

from delivery.enqueueing import get_scheduler
from delivery.scheduler import Lease, Scheduler
from delivery.sending import send
from delivery.transport import new_session

logger = logging.getLogger(__name__)
IDLE_WAIT_SECONDS = 2.0
ERROR_BACKOFF_SECONDS = 1.0


class DeliveryEngine:
    """Start with start(); stop(graceful=True) finishes in-flight deliveries first."""

    def __init__(
        self,
        *,
        slots: int | None = None,
        scheduler: Scheduler | None = None,
        worker_id: str | None = None,
    ) -> None:
        self.slots = slots or settings.DELIVERY_SLOTS
        self.scheduler = scheduler or get_scheduler()
        self.worker_id = worker_id or f"engine-{uuid.uuid4().hex[:12]}"
        self.session = new_session(
            pool_maxsize=self.slots, allow_private=settings.ALLOW_PRIVATE_DESTINATIONS
        )
        self._stopping = threading.Event()  # slots stop picking
        self._closed = threading.Event()  # the renewer stops once no delivery is running
        self._leases: dict[str, Lease] = {}
        self._leases_lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._renewer: threading.Thread | None = None
        self.sent = 0

    def start(self) -> None:
        for index in range(self.slots):
            self._threads.append(self._spawn(self._slot_loop, f"delivery-slot-{index}"))
        self._renewer = self._spawn(self._renew_loop, "lease-renewer")
        logger.info("delivery engine %s started with %d slots", self.worker_id, self.slots)

    @staticmethod
    def _spawn(target, name: str) -> threading.Thread:
        # Daemon threads: a cold shutdown must not wait for a hung request.
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        return thread

    def stop(self, *, graceful: bool = True, timeout: float | None = None) -> bool:
        """Stop picking; wait for in-flight deliveries (graceful). True if all finished.
        Whatever is still running when the wait ends comes back through its lease."""
        self._stopping.set()
        if not graceful:
            self._closed.set()
            return not self.in_flight()
        deadline = time.monotonic() + (timeout if timeout is not None else self._max_wait())
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        finished = not any(thread.is_alive() for thread in self._threads)
        self._closed.set()
        if finished:
            self.session.close()
        return finished

    def _max_wait(self) -> float:
        return float(max(settings.LEASE_SECONDS, 35))

    def in_flight(self) -> list[str]:
        with self._leases_lock:
            return list(self._leases)

    def _slot_loop(self) -> None:
        try:
            while not self._stopping.is_set():
                self._run_one_turn()
        finally:
            connection.close()

    def _run_one_turn(self) -> None:
        try:
            picked = self.scheduler.pick(self.worker_id, 1)
        except redis.RedisError as exc:
            logger.warning("scheduler unavailable: %s", exc)
            self._stopping.wait(ERROR_BACKOFF_SECONDS)
            return
        if not picked.leases:
            self.scheduler.wait(min(picked.wait_seconds or IDLE_WAIT_SECONDS, IDLE_WAIT_SECONDS))
            return
        for lease in picked.leases:
            self._deliver(lease)

    def _deliver(self, lease: Lease) -> None:
        with self._leases_lock:
            self._leases[lease.delivery_id] = lease
        try:
            close_old_connections()
            send(lease, self.scheduler, self.session)
            self.sent += 1
        except Exception:
            # The lease is not acked: it expires and the delivery is tried again.
            logger.exception("delivery %s failed inside the worker", lease.delivery_id)
            self._stopping.wait(ERROR_BACKOFF_SECONDS)
        finally:
            with self._leases_lock:
                self._leases.pop(lease.delivery_id, None)

    def _renew_loop(self) -> None:
        """Keep leases of long requests alive; a dead process stops renewing and its work returns."""
        interval = max(1.0, settings.LEASE_SECONDS / 3)
        while not self._closed.wait(interval):
            with self._leases_lock:
                leases = list(self._leases.values())
            if not leases:
                continue
            try:
                lost = self.scheduler.renew(leases)
            except redis.RedisError as exc:
                logger.warning("could not renew leases: %s", exc)
                continue
            if lost:
                logger.warning("%d leases expired before renewal: %s", len(lost), lost[:5])

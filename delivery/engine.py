"""N delivery slots (threads) fed from the fair scheduler, sharing one HTTP session.

One RQ job per webhook would cost ~7 ms of RQ overhead each; instead a worker process
runs this engine beside its RQ loop, as a small pipeline:

* a feeder leases as many deliveries as there are idle slots (one scheduler call) and
  loads them all (one query; signing secrets come from a cache of a few seconds). It
  never leases more than it can start at once, so a slot blocked on a slow endpoint
  holds exactly one lease and the endpoint caps bound how many slots slow endpoints can
  hold. Under load it lets idle slots wait up to BATCH_WAIT_SECONDS to be filled
  together: per pick and per query the cost is mostly fixed;
* each slot signs and POSTs one delivery at a time, and touches neither the database
  nor Redis (except to pause an endpoint that answered 429/503 with Retry-After, at once);
* a releaser frees the endpoint slots of requests that are over, a batch per scheduler
  call, so that an endpoint's cap counts open requests, not outcomes waiting to be
  recorded (the leases themselves stay until the recorder acknowledges them);
* a recorder writes what finished as one group (waiting up to GROUP_WAIT_SECONDS for
  requests still running): one transaction for the Attempts and status changes, then
  one scheduler call to acknowledge them. The database is always written before the
  scheduler is told, so a crash in between sends a delivery again rather than losing it.

A delivery picked but not yet acknowledged keeps its lease, renewed while the process
lives; if the process dies, the lease expires and the delivery is handed out again.
"""

import logging
import queue
import threading
import time
import uuid

import redis
from django.conf import settings
from django.db import close_old_connections, connection

from delivery import sending
from delivery.enqueueing import get_scheduler
from delivery.policy import DISABLE_ENDPOINT
from delivery.scheduler import Lease, Scheduler
from delivery.transport import new_session

logger = logging.getLogger(__name__)
IDLE_WAIT_SECONDS = 2.0
ERROR_BACKOFF_SECONDS = 1.0
MAX_GROUP = 256  # deliveries recorded in one transaction, at most
CONNECTION_CHECK_SECONDS = 1.0  # how often a thread applies the database's CONN_MAX_AGE
BATCH_WAIT_SECONDS = 0.002  # how long idle slots may wait to be filled together
GROUP_WAIT_SECONDS = 0.005  # how long finished deliveries may wait to be recorded together
# How long answered requests may wait to give their endpoint slots back together: each
# scheduler call has a fixed cost in Redis, and a slot freed 2 ms later costs nobody much.
RELEASE_WAIT_SECONDS = 0.002
# Leases a worker may hold per slot, counting those sent and waiting to be recorded:
# room for the slots to run ahead of a recorder waiting for SQLite's write lock
# (bench/delivery.py: 71-84% of the bare loop at 8 against 59-66% at 2). The releaser
# frees an answered lease's endpoint slot at once, so these cost no endpoint any
# capacity (before it did, 8 broke per-tenant fairness on a shared capped endpoint; see
# docs/BENCHMARKS.md). A worker killed mid-way has at most this many per slot sent again
# once their leases expire.
UNRECORDED_LEASES_PER_SLOT = 8
_STOP = object()


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
        self._stopping = threading.Event()  # the feeder stops picking
        self._closed = threading.Event()  # the renewer stops once no delivery is running
        self._leases: dict[str, Lease] = {}  # picked and not yet released to the scheduler
        self._leases_lock = threading.Lock()
        self._room = threading.Condition()  # guards _busy; the feeder waits on it for room
        self._busy = 0  # deliveries handed to the slots and not yet posted
        self._batch = max(1, self.slots // 2)  # idle slots worth a pick without waiting
        self._secrets = sending.SecretCache()
        # Endpoints a slot saw answer 410, until the recorder has disabled them in the
        # database: the feeder holds their deliveries meanwhile instead of sending more
        # requests to an endpoint that said it is gone.
        self._disabling: set[int] = set()
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()  # (lease, delivery, secrets), _STOP
        self._finished: queue.SimpleQueue = queue.SimpleQueue()  # sending.Finished or _STOP
        self._answered: queue.SimpleQueue = queue.SimpleQueue()  # Lease or _STOP
        self._feeder: threading.Thread | None = None
        self._threads: list[threading.Thread] = []
        self._recorder: threading.Thread | None = None
        self._releaser: threading.Thread | None = None
        self._renewer: threading.Thread | None = None
        self.sent = 0

    def start(self) -> None:
        for index in range(self.slots):
            self._threads.append(self._spawn(self._slot_loop, f"delivery-slot-{index}"))
        self._recorder = self._spawn(self._record_loop, "delivery-recorder")
        self._releaser = self._spawn(self._release_loop, "slot-releaser")
        self._feeder = self._spawn(self._feed_loop, "delivery-feeder")
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
        with self._room:
            self._room.notify_all()
        if not graceful:
            self._closed.set()
            return not self.in_flight()
        deadline = time.monotonic() + (timeout if timeout is not None else self._max_wait())

        def join(thread: threading.Thread | None) -> None:
            if thread is not None:
                thread.join(max(0.0, deadline - time.monotonic()))

        # Each stage ends after the one feeding it, so everything picked is sent and
        # everything sent is recorded and acknowledged.
        join(self._feeder)
        for _ in self._threads:
            self._jobs.put(_STOP)
        for thread in self._threads:
            join(thread)
        self._answered.put(_STOP)
        self._finished.put(_STOP)
        join(self._recorder)
        join(self._releaser)
        finished = not self.in_flight() and not any(
            thread is not None and thread.is_alive()
            for thread in (self._feeder, self._recorder, self._releaser, *self._threads)
        )
        self._closed.set()
        if finished:
            self.session.clear()
        return finished

    def _max_wait(self) -> float:
        return float(max(settings.LEASE_SECONDS, 35))

    def in_flight(self) -> list[str]:
        with self._leases_lock:
            return list(self._leases)

    # --- feeder: lease as many as there are idle slots, load them in one query -------

    def _feed_loop(self) -> None:
        checked = 0.0
        try:
            while not self._stopping.is_set():
                room = self._wait_for_room()
                if not room:
                    continue
                checked = _check_connection(checked)
                try:
                    self._feed(room)
                except Exception:
                    # The feeder must outlive any outage (Redis restarting, say): a dead
                    # feeder leaves a live-looking worker that delivers nothing.
                    logger.exception("delivery feeder error; retrying")
                    close_old_connections()
                    self._stopping.wait(ERROR_BACKOFF_SECONDS)
        finally:
            connection.close()

    def _wait_for_room(self) -> int:
        """Idle slots to fill, bounded so that leases waiting to be recorded stay within
        UNRECORDED_LEASES_PER_SLOT per slot. Under load it waits a moment for half the
        slots to be idle: one pick and one query for several deliveries cost far less
        than one each."""
        settle_by = None
        with self._room:
            while not self._stopping.is_set():
                room = min(
                    self.slots - self._busy,
                    UNRECORDED_LEASES_PER_SLOT * self.slots - len(self._leases),
                )
                now = time.monotonic()
                if room >= self._batch or (room > 0 and settle_by is not None and now >= settle_by):
                    return room
                if room > 0 and settle_by is None:
                    settle_by = now + BATCH_WAIT_SECONDS
                self._room.wait(settle_by - now if settle_by is not None else IDLE_WAIT_SECONDS)
        return 0

    def _feed(self, room: int) -> None:
        try:
            picked = self.scheduler.pick(self.worker_id, room)
        except redis.RedisError as exc:
            logger.warning("scheduler unavailable: %s", exc)
            self._stopping.wait(ERROR_BACKOFF_SECONDS)
            return
        if not picked.leases:
            if picked.wait_seconds <= 0:
                # The pick spent its budget parking lanes: more may be ready at once.
                self._stopping.wait(0.005)
                return
            try:
                self.scheduler.wait(min(picked.wait_seconds, IDLE_WAIT_SECONDS))
            except redis.RedisError as exc:
                logger.warning("scheduler unavailable: %s", exc)
                self._stopping.wait(ERROR_BACKOFF_SECONDS)
            return
        with self._leases_lock:
            self._leases.update((lease.delivery_id, lease) for lease in picked.leases)
        try:
            deliveries, failed = sending.load(picked.leases)
            secrets = self._secrets_for(deliveries.values())
        except Exception:
            # The database is down (sending.load raises nothing else): not acknowledged,
            # the leases expire and the deliveries are handed out again once it is back.
            logger.exception("could not load %d deliveries", len(picked.leases))
            self._forget(picked.leases)
            close_old_connections()
            self._stopping.wait(ERROR_BACKOFF_SECONDS)
            return
        for done in failed:
            self._answered.put(done.lease)
            self._finished.put(done)
        unloadable = {done.lease.delivery_id for done in failed}
        for lease in picked.leases:
            if lease.delivery_id in unloadable:
                continue
            delivery = deliveries.get(lease.delivery_id)
            done = sending.triage(lease, delivery)
            if done is None and delivery.endpoint_id in self._disabling:
                done = sending.Finished(lease, held=delivery)  # its row says so soon
            if done is None and isinstance(secrets[delivery.endpoint_id], Exception):
                done = sending.failed_inside(
                    lease, delivery, sending.SIGN, secrets[delivery.endpoint_id]
                )
                self._answered.put(lease)
            if done is not None:
                self._finished.put(done)
                continue
            with self._room:
                self._busy += 1
            self._jobs.put((lease, delivery, secrets[delivery.endpoint_id]))

    def _secrets_for(self, deliveries) -> dict[int, list[str] | Exception]:
        """Each endpoint's signing secrets; an endpoint whose secrets cannot be read has
        the exception instead, for its deliveries to record (the rest go out)."""
        endpoint_ids = {delivery.endpoint_id for delivery in deliveries}
        try:
            return dict(self._secrets.active(endpoint_ids))
        except sending.DATABASE_DOWN:
            raise
        except Exception:
            logger.exception("reading signing secrets failed; reading them per endpoint")
        found: dict[int, list[str] | Exception] = {}
        for endpoint_id in endpoint_ids:
            try:
                found.update(self._secrets.active([endpoint_id]))
            except sending.DATABASE_DOWN:
                raise
            except Exception as exc:
                found[endpoint_id] = exc
        return found

    # --- slots: one POST at a time ---------------------------------------------------

    def _slot_loop(self) -> None:
        while (job := self._jobs.get()) is not _STOP:
            lease, delivery, secrets = job
            try:
                finished = sending.attempt(lease, delivery, secrets, self.session)
            except Exception as exc:
                # attempt() records its own failures; this is a bug in that safety net.
                # Still this delivery's failure, never a stuck slot.
                logger.exception("delivery %s failed inside the worker", lease.delivery_id)
                finished = sending.failed_inside(lease, delivery, sending.SEND, exc)
            try:
                sending.pause_if_asked(finished.sent, self.scheduler)
            except Exception as exc:
                # The attempt itself stands; its retry still waits for the Retry-After.
                logger.warning("could not pause endpoint %s: %s", delivery.endpoint_id, exc)
            try:
                if finished.sent.decision.action == DISABLE_ENDPOINT:
                    # Its slot stays taken until the disable is recorded: other workers
                    # then send no more to an endpoint that said it is gone meanwhile.
                    self._disabling.add(delivery.endpoint_id)
                else:
                    self._answered.put(lease)
                self._finished.put(finished)
            finally:
                with self._room:
                    self._busy -= 1
                    # Wake the feeder when there is room at all (it starts its short wait
                    # for more) and when there is enough to pick at once, not every time.
                    if self.slots - self._busy in (1, self._batch):
                        self._room.notify()

    # --- releaser: free the endpoint slots of requests that are over -----------------

    def _release_loop(self) -> None:
        """One scheduler call for everything answered within RELEASE_WAIT_SECONDS of
        the first, or while the previous call was under way."""
        stopping = False
        while not stopping:
            leases = [self._answered.get()]
            if leases[0] is not _STOP:
                time.sleep(RELEASE_WAIT_SECONDS)  # one wake-up per batch, not per lease
            while True:
                try:
                    leases.append(self._answered.get_nowait())
                except queue.Empty:
                    break
            leases, stopping = _without_stop(leases)
            try:
                self.scheduler.answered(leases)
            except redis.RedisError as exc:
                # Nothing is lost: the recorder's acknowledgement frees the slots too.
                logger.warning("could not free %d endpoint slots early: %s", len(leases), exc)

    # --- recorder: group commits, then one acknowledgement per group -----------------

    def _record_loop(self) -> None:
        checked = 0.0
        stopping = False
        try:
            while not stopping:
                group = self._next_group()
                group, stopping = _without_stop(group)
                if group:
                    checked = _check_connection(checked)
                    self._settle(group)
        finally:
            connection.close()

    def _next_group(self) -> list:
        """What has finished, waiting up to GROUP_WAIT_SECONDS for requests still running
        to finish too: one commit for many deliveries costs far less than one each."""
        group = [self._finished.get()]
        until = time.monotonic() + GROUP_WAIT_SECONDS
        while len(group) < MAX_GROUP:
            try:
                group.append(self._finished.get_nowait())
                continue
            except queue.Empty:
                pass
            left = until - time.monotonic()
            if left <= 0 or not self._busy or len(group) >= self.slots:
                break
            # One blocking wait, not a poll: polling cost the recorder ~12% of the
            # worker's CPU, each wake-up a fight for the GIL with the slots.
            try:
                group.append(self._finished.get(timeout=left))
            except queue.Empty:
                break
        return group

    def _settle(self, group: list[sending.Finished]) -> None:
        leases = [item.lease for item in group]
        try:
            sending.settle(group, self.scheduler)
            self.sent += sum(item.sent is not None for item in group)
        except Exception:
            # Whatever was not acknowledged comes back when its lease expires; a delivery
            # already recorded as finished is then acknowledged without being sent.
            logger.exception("could not record %d finished deliveries", len(group))
            close_old_connections()
            self._stopping.wait(ERROR_BACKOFF_SECONDS)
        finally:
            # Recorded, the rows now say disabled (or an operator re-enabled since); not
            # recorded, the 410'd delivery comes back and is tried again: either way the
            # rows decide from here, never a stale entry.
            self._disabling.difference_update(
                item.sent.delivery.endpoint_id
                for item in group
                if item.sent is not None and item.sent.decision.action == DISABLE_ENDPOINT
            )
            self._forget(leases)

    def _forget(self, leases: list[Lease]) -> None:
        with self._leases_lock:
            for lease in leases:
                self._leases.pop(lease.delivery_id, None)
        with self._room:
            self._room.notify()

    # --- renewer ---------------------------------------------------------------------

    def _renew_loop(self) -> None:
        """Keep leases of long requests alive; a dead process stops renewing, its work returns."""
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


def _without_stop(items: list) -> tuple[list, bool]:
    """What was taken from a queue, less the stop marker; and whether it was there."""
    kept = [item for item in items if item is not _STOP]
    return kept, len(kept) < len(items)


def _check_connection(checked: float) -> float:
    """Apply CONN_MAX_AGE and drop a broken connection, at most once a second per thread
    (not per delivery: with SQLite's CONN_MAX_AGE=0 that would reconnect every time)."""
    now = time.monotonic()
    if now - checked < CONNECTION_CHECK_SECONDS:
        return checked
    close_old_connections()
    return now

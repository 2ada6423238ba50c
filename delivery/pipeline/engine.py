"""One worker process's delivery pipeline: the fair scheduler in, HTTP out, records after.

One RQ job per webhook would pay RQ's per-job overhead for every delivery, more than the
delivery itself costs (docs/ARCHITECTURE.md); instead a worker process runs this engine
beside its RQ loop, as a small pipeline of threads:

* a feeder leases as many deliveries as there is room for (one scheduler call, at most
  MAX_PICK) and loads them all (one query; signing secrets come from a cache of a few
  seconds). It never leases more than the request loop may start at once, so the
  endpoint caps bound what slow endpoints can hold. Under load it waits up to
  BATCH_WAIT_SECONDS for room to gather: per pick and per query the cost is mostly fixed;
* one request loop signs each delivery and drives up to `concurrency` POSTs at once
  through libcurl's multi interface (delivery.pipeline.curl_loop): a hung endpoint holds a socket
  and a handle, not a thread. It touches neither the database nor Redis;
* a releaser frees the endpoint slots of requests that are over, a batch per scheduler
  call, so that an endpoint's cap counts open requests, not outcomes waiting to be
  recorded (the leases themselves stay until the recorder acknowledges them). It applies
  a Retry-After pause before it frees that request's slot;
* a recorder writes what finished as one group (waiting up to GROUP_WAIT_SECONDS for
  requests still running): one transaction for the Attempts and status changes, then
  one scheduler call to acknowledge them. The database is always written before the
  scheduler is told, so a crash in between sends a delivery again rather than losing it.

Whatever one delivery raises on the way is that delivery's recorded failure (see
delivery.pipeline.sending), so nothing waits for a lease to expire but a crashed process's work.

A delivery picked but not yet acknowledged keeps its lease, renewed while the process
lives; if the process dies, the lease expires and the delivery is handed out again.
"""

import logging
import queue
import resource
import threading
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass

import pycurl
import redis
from django.conf import settings
from django.db import close_old_connections, connection

from core import tracing
from core.outage_log import OutageLog
from delivery.models import Delivery
from delivery.pipeline import attempt_trace, sending
from delivery.pipeline.attempt_trace import AttemptTrace
from delivery.pipeline.curl_loop import CurlLoop
from delivery.pipeline.transport import Transport
from delivery.scheduler import EndpointAnswers, Lease, Scheduler, get_scheduler

logger = logging.getLogger(__name__)
IDLE_WAIT_SECONDS = 2.0
ERROR_BACKOFF_SECONDS = 1.0
MAX_GROUP = 256  # deliveries recorded in one transaction, at most
# Deliveries leased by one scheduler call, at most: a pick is one Lua script, and Redis
# runs nothing else meanwhile, so a pick of thousands would stall every other worker.
MAX_PICK = 64
CONNECTION_CHECK_SECONDS = 1.0  # how often a thread applies the database's CONN_MAX_AGE
BATCH_WAIT_SECONDS = 0.002  # how long room may gather before a pick
GROUP_WAIT_SECONDS = 0.005  # how long finished deliveries may wait to be recorded together
# How long answered requests may wait to give their endpoint slots back together: each
# scheduler call has a fixed cost in Redis, and a slot freed a moment later costs nobody
# much.
RELEASE_WAIT_SECONDS = 0.002
# Leases a worker may hold beyond those under way: answered requests waiting to be
# recorded, so the loop can run ahead of a recorder waiting for SQLite's write lock. The
# releaser frees an answered lease's endpoint slot at once, so these cost no endpoint any
# capacity. A worker killed mid-way has at most this many sent again once they expire.
UNRECORDED_AHEAD = 256
# Idle keep-alive connections one worker keeps, across all endpoints (least recently used
# first out): bounds idle file descriptors without reconnecting to every endpoint anew.
IDLE_CONNECTIONS = 256
# Curl handles kept between requests (each a few KB): reused, they skip setting up anew.
IDLE_HANDLES = 256
_STOP = object()


@dataclass(frozen=True)
class _Pause:
    """An endpoint that asked (Retry-After) not to be sent to before `until`."""

    endpoint_id: int
    until: float


@dataclass(frozen=True)
class _Answer:
    """How one request to an endpoint went, for its adaptive limit (answered's signal)."""

    endpoint_id: int
    overloaded: bool
    latency_ms: float


class DeliveryEngine:
    """Start with start(); stop(graceful=True) finishes in-flight deliveries first."""

    def __init__(
        self,
        *,
        concurrency: int | None = None,
        scheduler: Scheduler | None = None,
        worker_id: str | None = None,
    ) -> None:
        self.concurrency = concurrency or settings.DELIVERY_CONCURRENCY
        self.scheduler = scheduler or get_scheduler()
        self.worker_id = worker_id or f"engine-{uuid.uuid4().hex[:12]}"
        # A Redis restart is expected: said once a minute with a count, not per call.
        self._redis_down = OutageLog(logger)
        self.transport = Transport(
            allow_private=settings.ALLOW_PRIVATE_DESTINATIONS,
            max_idle_handles=min(self.concurrency, IDLE_HANDLES),
        )
        # libcurl's cache holds every connection, busy ones included, and closes the
        # oldest idle one whenever it holds more than this: sized by the busy ones alone,
        # hundreds of hung requests would leave no room to keep any healthy endpoint's
        # connection alive (a new connection per delivery; docs/BENCHMARKS.md).
        self._curl = CurlLoop(max_connections=self.concurrency + IDLE_CONNECTIONS)
        self._stopping = threading.Event()  # the feeder stops picking
        self._closed = threading.Event()  # the loop and renewer stop (cold, or all done)
        self._leases: dict[str, Lease] = {}  # picked and not yet released to the scheduler
        # Leases being acknowledged now: a renewal racing their ack finds them gone, and
        # that is their release, not a lost lease.
        self._releasing: set[str] = set()
        self._leases_lock = threading.Lock()
        self._room = threading.Condition()  # guards _busy; the feeder waits on it for room
        self._busy = 0  # deliveries handed to the request loop and not yet answered
        self._batch = max(1, min(self.concurrency, MAX_PICK) // 2)  # room worth a pick at once
        self._secrets = sending.SecretCache()
        # Endpoints that answered 410, until the recorder has disabled them in the
        # database: the feeder holds their deliveries meanwhile instead of sending more
        # requests to an endpoint that said it is gone.
        self._disabling: set[int] = set()
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()  # (lease, delivery, secrets), _STOP
        self._finished: queue.SimpleQueue = queue.SimpleQueue()  # sending.Finished or _STOP
        # Lease, _Answer, _Pause or _STOP
        self._answered: queue.SimpleQueue = queue.SimpleQueue()
        self._feeder: threading.Thread | None = None
        self._loop: threading.Thread | None = None
        self._recorder: threading.Thread | None = None
        self._releaser: threading.Thread | None = None
        self._renewer: threading.Thread | None = None
        # Each attempt's spans while tracing is on, by delivery id; empty while off.
        self._traces: dict[str, AttemptTrace] = {}
        self.sent = 0

    def start(self) -> None:
        _allow_open_files(self.concurrency + IDLE_CONNECTIONS + 256)
        self._loop = self._spawn(self._request_loop, "delivery-requests")
        self._recorder = self._spawn(self._record_loop, "delivery-recorder")
        self._releaser = self._spawn(self._release_loop, "slot-releaser")
        self._feeder = self._spawn(self._feed_loop, "delivery-feeder")
        self._renewer = self._spawn(self._renew_loop, "lease-renewer")
        logger.info(
            "delivery engine %s started: up to %d requests at once",
            self.worker_id,
            self.concurrency,
        )

    @staticmethod
    def _spawn(target, name: str) -> threading.Thread:
        # Daemon threads: a cold shutdown must not wait for a hung request.
        thread = threading.Thread(target=tracing.untraced(target), name=name, daemon=True)
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
            self._curl.wake()
            return not self.in_flight()
        deadline = time.monotonic() + (timeout if timeout is not None else self._max_wait())

        def join(thread: threading.Thread | None) -> None:
            if thread is not None:
                thread.join(max(0.0, deadline - time.monotonic()))

        # Each stage ends after the one feeding it, so everything picked is sent and
        # everything sent is recorded and acknowledged.
        join(self._feeder)
        self._jobs.put(_STOP)
        self._curl.wake()
        join(self._loop)
        self._answered.put(_STOP)
        self._finished.put(_STOP)
        join(self._recorder)
        join(self._releaser)
        finished = not self.in_flight() and not any(
            thread is not None and thread.is_alive()
            for thread in (self._feeder, self._loop, self._recorder, self._releaser)
        )
        self._closed.set()
        if finished:
            self._curl.close()
            self.transport.clear()
        return finished

    def alive(self) -> bool:
        """Every stage's thread runs (a worker beats only then: delivery/worker/heartbeats)."""
        stages = (self._loop, self._recorder, self._releaser, self._feeder, self._renewer)
        return not self._stopping.is_set() and all(
            getattr(thread, "is_alive", lambda: False)() for thread in stages
        )

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
        """How many deliveries to lease now: the room the request loop has, at most
        MAX_PICK, bounded so that leases waiting to be recorded stay within
        UNRECORDED_AHEAD. Under load it waits a moment for room to gather: one pick and
        one query for several deliveries cost far less than one each."""
        settle_by = None
        with self._room:
            while not self._stopping.is_set():
                room = min(
                    self.concurrency - self._busy,
                    self.concurrency + UNRECORDED_AHEAD - len(self._leases),
                    MAX_PICK,
                )
                now = time.monotonic()
                if room >= self._batch or (room > 0 and settle_by is not None and now >= settle_by):
                    return room
                if room > 0 and settle_by is None:
                    settle_by = now + BATCH_WAIT_SECONDS
                self._room.wait(settle_by - now if settle_by is not None else IDLE_WAIT_SECONDS)
        return 0

    def _feed(self, room: int) -> None:
        picked_ns = time.time_ns()
        try:
            picked = self.scheduler.pick(self.worker_id, room)
        except redis.RedisError as exc:
            self._redis_down.warn("scheduler unavailable: %s", exc)
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
                self._redis_down.warn("scheduler unavailable: %s", exc)
                self._stopping.wait(ERROR_BACKOFF_SECONDS)
            return
        with self._leases_lock:
            self._leases.update((lease.delivery_id, lease) for lease in picked.leases)
        try:
            deliveries, failed = sending.load(picked.leases)
            secrets = sending.secrets_for(self._secrets, deliveries.values())
        except Exception:
            # The database is down (sending.load raises nothing else): not acknowledged,
            # the leases expire and the deliveries are handed out again once it is back.
            logger.exception("could not load %d deliveries", len(picked.leases))
            self._forget(picked.leases)
            close_old_connections()
            self._stopping.wait(ERROR_BACKOFF_SECONDS)
            return
        for done in failed:
            self._done_without_sending(done)
        unloadable = {done.lease.delivery_id for done in failed}
        tracer, loaded_ns = tracing.tracer(), time.time_ns()
        handed = False
        for lease in picked.leases:
            if lease.delivery_id in unloadable:
                continue
            delivery = deliveries.get(lease.delivery_id)
            endpoint_secrets = secrets[delivery.endpoint_id] if delivery is not None else []
            done = sending.triage(lease, delivery, endpoint_secrets, self._disabling)
            if done is not None:
                self._done_without_sending(done)
                continue
            if tracer is not None:
                trace = attempt_trace.begin(tracer, lease, delivery, picked_ns, loaded_ns)
                if trace is not None:
                    self._traces[lease.delivery_id] = trace
            with self._room:
                self._busy += 1
            self._jobs.put((lease, delivery, endpoint_secrets))
            handed = True
        if handed:
            self._curl.wake()

    def _done_without_sending(self, done: sending.Finished) -> None:
        """To the recorder; a recorded failure frees its endpoint slot at once, as an
        answered request does (the rest give theirs back with their ack)."""
        if done.sent is not None:
            self._answered.put(done.lease)
        self._finished.put(done)

    # --- the request loop: every POST of this process, at once --------------------

    def _request_loop(self) -> None:
        under_way: dict[pycurl.Curl, sending.Outgoing] = {}
        stopping = False
        while not self._closed.is_set():
            stopping = self._start_requests(under_way) or stopping
            if stopping and not under_way:
                break
            try:
                completed = self._curl.run_once()
            except Exception:
                # libcurl or epoll failing as a whole is no delivery's doing: whatever it
                # dropped comes back through its lease.
                logger.exception("request loop error; going on")
                self._stopping.wait(ERROR_BACKOFF_SECONDS)
                continue
            for handle, errno, message in completed:
                outgoing = under_way.pop(handle)
                self._answer(outgoing.delivery, sending.conclude(outgoing, errno, message))
                self.transport.release(outgoing.exchange)

    def _start_requests(self, under_way: dict[pycurl.Curl, sending.Outgoing]) -> bool:
        """Start every request handed over since the last turn; True once told to stop."""
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                return False
            if job is _STOP:
                return True
            lease, delivery, secrets = job
            trace = self._traces.get(lease.delivery_id) if self._traces else None
            header = trace.request_started(delivery.endpoint.url) if trace is not None else None
            started = sending.start(lease, delivery, secrets, self.transport, header)
            if isinstance(started, sending.Finished):  # failed, or nothing to send
                self._answer(delivery, started)
                continue
            try:
                self._curl.add(started.exchange.handle)
            except Exception as exc:
                logger.exception("delivery %s could not be started", lease.delivery_id)
                self.transport.release(started.exchange)
                self._answer(delivery, sending.failed_inside(lease, delivery, sending.SEND, exc))
                continue
            under_way[started.exchange.handle] = started

    def _answer(self, delivery: Delivery, finished: sending.Finished) -> None:
        """A request is over (or never started): pause its endpoint if it asked, free its
        endpoint slot, and hand it to the recorder."""
        if self._traces:
            trace = self._traces.get(finished.lease.delivery_id)
            if trace is not None:
                trace.answered(finished)
        sent = finished.sent
        # Only an endpoint whose limit adapts is told of: the scheduler would read any
        # other's row for nothing.
        if sent is not None and delivery.endpoint.adapts_concurrency:
            result = sent.result
            # The receiver's own time where libcurl has it: a limit that grows opens new
            # connections, and their handshakes must not read as the receiver slowing.
            latency_ms = result.duration_ms if result.answer_ms is None else result.answer_ms
            self._answered.put(
                _Answer(delivery.endpoint_id, sending.overloaded(result), latency_ms)
            )
        until = sending.pause_until(sent)
        if until is not None:
            # The releaser pauses the endpoint, and only then frees this request's room:
            # the feeder must not pick for that endpoint before the pause is in place.
            self._answered.put(_Pause(delivery.endpoint_id, until))
        if sending.disables_endpoint(finished):
            # Its slot stays taken until the disable is recorded: other workers then
            # send no more to an endpoint that said it is gone meanwhile.
            self._disabling.add(delivery.endpoint_id)
        else:
            self._answered.put(finished.lease)
        self._finished.put(finished)
        if until is None:
            self._free_room()

    def _free_room(self) -> None:
        with self._room:
            self._busy -= 1
            # Wake the feeder when there is room at all (it starts its short wait for
            # more) and when there is enough to pick at once, not every time.
            if self.concurrency - self._busy in (1, self._batch):
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
            items, stopping = _without_stop(leases)
            # Pauses first: a slot freed before its endpoint's pause would let another
            # request into the wall that asked for it.
            for pause in (item for item in items if isinstance(item, _Pause)):
                try:
                    self.scheduler.pause_endpoint(pause.endpoint_id, pause.until)
                except redis.RedisError as exc:
                    # The attempt stands, and its retry still waits for the Retry-After.
                    logger.warning("could not pause endpoint %s: %s", pause.endpoint_id, exc)
                finally:
                    self._free_room()
            leases = self._unsettled([item for item in items if isinstance(item, Lease)])
            answers = _answers_by_endpoint(item for item in items if isinstance(item, _Answer))
            if not leases and not answers:
                continue
            try:
                self.scheduler.answered(leases, answers)
            except redis.RedisError as exc:
                # Nothing is lost: the recorder's acknowledgement frees the slots too.
                self._redis_down.warn(
                    "could not free %d endpoint slots early: %s", len(leases), exc
                )

    def _unsettled(self, leases: list[Lease]) -> list[Lease]:
        """The leases the recorder has not acknowledged yet. Acknowledged, their slots
        are free already, and the recorder often gets there first: the releaser's call
        would look each such lease up for nothing. (One the recorder is still recording
        stays: a busy database must not hold its slot.)"""
        with self._leases_lock:
            return [lease for lease in leases if self._leases.get(lease.delivery_id) is lease]

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
            if left <= 0 or not self._busy or len(group) >= self.concurrency:
                break
            # One blocking wait, not a poll: every polling wake-up fights the request
            # loop for the GIL.
            try:
                group.append(self._finished.get(timeout=left))
            except queue.Empty:
                break
        return group

    def _settle(self, group: list[sending.Finished]) -> None:
        leases = [item.lease for item in group]
        with self._leases_lock:
            self._releasing.update(lease.delivery_id for lease in leases)
        started_ns, stored = time.time_ns(), False
        try:
            sending.settle(group, self.scheduler)
            stored = True
            self.sent += sum(item.sent is not None for item in group)
        except redis.RedisError as exc:
            # Recorded in the database, not acknowledged in the schedule: the leases expire
            # and the rows, already final, are acknowledged then without being sent.
            self._redis_down.warn(
                "could not acknowledge %d recorded deliveries (Redis: %s); their leases "
                "bring them back, already recorded",
                len(group),
                exc,
            )
            self._stopping.wait(ERROR_BACKOFF_SECONDS)
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
                item.sent.delivery.endpoint_id for item in group if sending.disables_endpoint(item)
            )
            if self._traces:
                self._end_traces(group, started_ns, stored)
            self._forget(leases)

    def _end_traces(self, group: list[sending.Finished], started_ns: int, stored: bool) -> None:
        ended_ns = time.time_ns()
        for item in group:
            trace = self._traces.pop(item.lease.delivery_id, None)
            if trace is not None:
                trace.recorded(item, started_ns, ended_ns, stored)

    def _forget(self, leases: list[Lease]) -> None:
        with self._leases_lock:
            for lease in leases:
                self._leases.pop(lease.delivery_id, None)
                self._releasing.discard(lease.delivery_id)
        with self._room:
            self._room.notify()

    # --- renewer ---------------------------------------------------------------------

    def _renew_loop(self) -> None:
        """Keep leases of long requests alive; a dead process stops renewing, its work returns."""
        interval = max(1.0, settings.LEASE_SECONDS / 3)
        while not self._closed.wait(interval):
            self.renew_leases()

    def renew_leases(self) -> list[str]:
        """One renewal of every lease held; returns (and logs) the ids truly lost."""
        with self._leases_lock:
            leases = list(self._leases.values())
        if not leases:
            return []
        try:
            lost = self.scheduler.renew(leases)
        except redis.RedisError as exc:
            self._redis_down.warn("could not renew leases: %s", exc)
            return []
        with self._leases_lock:
            lost = [i for i in lost if i in self._leases and i not in self._releasing]
        if lost:
            logger.warning("%d leases expired before renewal: %s", len(lost), lost[:5])
        return lost


def _answers_by_endpoint(answers: Iterable[_Answer]) -> list[EndpointAnswers]:
    """One EndpointAnswers per endpoint: its requests' answers, summed."""
    summed: dict[int, list] = {}  # endpoint -> [ok, overloaded, latency_ms]
    for answer in answers:
        counts = summed.setdefault(answer.endpoint_id, [0, 0, 0.0])
        if answer.overloaded:
            counts[1] += 1
        else:
            counts[0] += 1
            counts[2] += answer.latency_ms
    return [EndpointAnswers(e, ok, over, ms) for e, (ok, over, ms) in summed.items()]


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


def _allow_open_files(wanted: int) -> None:
    """Raise this process's open-file limit toward `wanted` (one socket per request under
    way, plus idle connections and the rest), as far as the hard limit allows: many
    systems start processes at 1,024."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))

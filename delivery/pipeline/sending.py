"""Deliveries start to finish: load them, sign, POST, record, tell the scheduler.

The steps are separate so that a worker can run each at its own grain: one query loads
every delivery of a pick, each POST runs in its own slot, and the deliveries that finish
together are recorded in one transaction and acknowledged in one scheduler call.

Poison-proof: whatever one delivery raises at any step (loading, building its headers,
signing, sending, judging, recording) becomes that delivery's own recorded failure, an
Attempt with error kind `internal` naming the step, and then takes the retry schedule to
a dead letter like any failure (policy.INTERNAL). Nothing is left to a lease expiry, so
no delivery loops unrecorded, and its endpoint slot is free as soon as the step failed.
Only a fault of the database itself (it is down) is nobody's delivery's: the leases then
expire and the work comes back when it is up.
"""

import logging
import threading
import time
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from urllib.parse import quote

import redis
from django.conf import settings
from django.db import InterfaceError, OperationalError, close_old_connections
from django.utils import timezone

from core.signatures import sign_standard_webhooks
from delivery.models import Delivery
from delivery.pipeline import loading, records, transport
from delivery.pipeline.policy import INTERNAL, Action, Decision, decide
from delivery.pipeline.transport import Exchange, HttpResult, Transport
from delivery.scheduler import Lease, Scheduler
from tenants.models import Endpoint, EndpointSecret

logger = logging.getLogger(__name__)
USER_AGENT = "fairhooks/0.1 (+webhook delivery)"
SECRETS_TTL_SECONDS = 5.0
RECORD_TRIES = 3
RECORD_RETRY_SECONDS = 0.1
# Faults of the database as a whole (down, restarting, a lock timeout): no one delivery's.
DATABASE_DOWN = (OperationalError, InterfaceError)

# The steps of one delivery inside a worker, named in the error recorded when one raises.
LOAD = "load"
HEADERS = "build headers"
SIGN = "sign"
SEND = "send"
JUDGE = "judge"
RECORD = "record"

# Printable ASCII but "%": what a header value may carry as it is. Everything else (a
# non-Latin-1 event type such as "注文.作成", a control character) is percent-encoded as
# UTF-8, so every value is a plain token on the wire and a receiver decodes it with any
# URL-decoding function. "%" itself is encoded, so decoding is never ambiguous.
_HEADER_SAFE = "".join(chr(c) for c in range(0x20, 0x7F) if chr(c) != "%")


@dataclass(frozen=True)
class Finished:
    """A leased delivery we are done with: attempted (`sent`), held because its endpoint
    is disabled (`held`), or neither: already finished elsewhere, or deleted."""

    lease: Lease
    sent: records.Sent | None = None
    held: Delivery | None = None


def header_value(value: str) -> str:
    """`value` as it goes on the wire: unchanged if printable ASCII without "%", else
    percent-encoded UTF-8 (docs/ARCHITECTURE.md, "Header values")."""
    if value.isascii() and value.isprintable() and "%" not in value:
        return value
    return quote(value, safe=_HEADER_SAFE)


def unsigned_headers(delivery: Delivery, now: float) -> dict[str, str]:
    """Standard Webhooks headers but the signature (sign() adds it). webhook-id is the
    event id: the same on every try and for every endpoint, so receivers can drop
    duplicates."""
    event = delivery.event
    headers = {
        "Content-Type": header_value(event.content_type or "application/octet-stream"),
        "User-Agent": USER_AGENT,
        "webhook-id": event.id,
        "webhook-timestamp": str(int(now)),
    }
    if event.event_type:
        headers["webhook-event-type"] = header_value(event.event_type)
    return headers


class NoSigningSecret(Exception):
    """The endpoint signs its requests but has no active secret (all expired or removed)."""


def sign(headers: dict[str, str], delivery: Delivery, secrets: list[str]) -> None:
    """Add webhook-signature over the id, timestamp and body already in `headers`. An
    endpoint that signs but has no secret left fails the delivery (recorded, retried)
    rather than sending it unsigned: unsigned is an explicit choice, never an accident."""
    if not delivery.endpoint.sign_requests:
        return
    if not secrets:
        raise NoSigningSecret(
            "the endpoint signs its requests but has no active signing secret: "
            "add one in the admin, or turn off its signing"
        )
    headers["webhook-signature"] = sign_standard_webhooks(
        headers["webhook-id"],
        int(headers["webhook-timestamp"]),
        bytes(delivery.event.payload),
        secrets,
    )


class SecretCache:
    """Endpoints' signing secrets, read at most every `ttl` seconds per endpoint: a
    rotation or a revocation reaches deliveries within `ttl` seconds."""

    def __init__(self, ttl: float = SECRETS_TTL_SECONDS) -> None:
        self.ttl = ttl
        self._entries: dict[int, tuple[float, list[tuple[str, datetime | None]]]] = {}
        self._lock = threading.Lock()

    def active(self, endpoint_ids: Iterable[int]) -> dict[int, list[str]]:
        """endpoint id -> its active secrets, for each of endpoint_ids."""
        now = time.monotonic()
        wanted = set(endpoint_ids)
        with self._lock:
            known = {pk: self._entries.get(pk) for pk in wanted}
        stale = [pk for pk, entry in known.items() if entry is None or entry[0] <= now]
        if stale:
            fresh: dict[int, list[tuple[str, datetime | None]]] = {pk: [] for pk in stale}
            rows = EndpointSecret.objects.filter(endpoint_id__in=stale).order_by("-created_at")
            for pk, secret, expires_at in rows.values_list("endpoint_id", "secret", "expires_at"):
                fresh[pk].append((secret, expires_at))
            with self._lock:
                for pk, secrets in fresh.items():
                    self._entries[pk] = (now + self.ttl, secrets)
                    known[pk] = self._entries[pk]
        moment = timezone.now()
        return {
            pk: [secret for secret, expires in entry[1] if expires is None or expires > moment]
            for pk, entry in known.items()
        }


def load(leases: Sequence[Lease]) -> tuple[dict[str, Delivery], list[Finished]]:
    """The leased deliveries, loaded in one query; and the failures of those that could
    not be loaded, each recorded as its own (step LOAD). A delivery deleted meanwhile is
    simply absent. Raises only DATABASE_DOWN: then nothing is any one delivery's fault."""
    ids = [lease.delivery_id for lease in leases]
    try:
        return loading.load_many(ids), []
    except DATABASE_DOWN:
        raise
    except Exception:
        logger.exception("loading %d deliveries failed; loading them one by one", len(ids))
    loaded: dict[str, Delivery] = {}
    failed: list[Finished] = []
    for lease in leases:
        try:
            loaded.update(loading.load_many([lease.delivery_id]))
        except DATABASE_DOWN:
            raise
        except Exception as exc:
            logger.exception("delivery %s could not be loaded", lease.delivery_id)
            bare = _bare_delivery(lease.delivery_id)
            if bare is not None:
                failed.append(failed_inside(lease, bare, LOAD, exc))
    return loaded, failed


def _bare_delivery(delivery_id: str) -> Delivery | None:
    """The columns recording a failure needs and nothing else (the rest failed to load)."""
    row = Delivery.objects.filter(pk=delivery_id).values("attempts", "endpoint_id").first()
    if row is None:
        return None
    delivery = Delivery(id=delivery_id, attempts=row["attempts"], endpoint_id=row["endpoint_id"])
    delivery.endpoint = Endpoint(pk=row["endpoint_id"])
    return delivery


def triage(
    lease: Lease,
    delivery: Delivery | None,
    secrets: list[str] | Exception,
    disabling: Collection[int] = (),
) -> Finished | None:
    """None if the delivery is to be sent; else what is done with it without sending.

    `secrets` are its endpoint's (or the exception reading them raised, which becomes
    this delivery's failed attempt); `disabling` holds the endpoints that answered 410
    and whose disable is not recorded yet: their deliveries are held, not sent again."""
    if delivery is None or delivery.status not in Delivery.OPEN_STATUSES:
        # Already finished (a duplicate after a lease expiry) or deleted: nothing to send.
        return Finished(lease)
    if not delivery.endpoint.enabled or delivery.endpoint_id in disabling:
        return Finished(lease, held=delivery)
    if isinstance(secrets, Exception):
        return failed_inside(lease, delivery, SIGN, secrets)
    return None


def disables_endpoint(finished: Finished) -> bool:
    """The endpoint answered that it is gone (410): it is disabled once this is recorded."""
    return finished.sent is not None and finished.sent.decision.action == Action.DISABLE_ENDPOINT


def secrets_for(
    cache: SecretCache, deliveries: Iterable[Delivery]
) -> dict[int, list[str] | Exception]:
    """Each endpoint's signing secrets; an endpoint whose secrets cannot be read has the
    exception instead, for its deliveries to record (the rest go out). Raises only
    DATABASE_DOWN: then nothing is any one endpoint's fault."""
    endpoint_ids = {delivery.endpoint_id for delivery in deliveries}
    try:
        return dict(cache.active(endpoint_ids))
    except DATABASE_DOWN:
        raise
    except Exception:
        logger.exception("reading signing secrets failed; reading them per endpoint")
    found: dict[int, list[str] | Exception] = {}
    for endpoint_id in endpoint_ids:
        try:
            found.update(cache.active([endpoint_id]))
        except DATABASE_DOWN:
            raise
        except Exception as exc:
            found[endpoint_id] = exc
    return found


@dataclass(frozen=True)
class Outgoing:
    """A delivery whose request is under way: `exchange.handle` is being driven."""

    lease: Lease
    delivery: Delivery
    exchange: Exchange
    started_at: datetime
    headers: dict[str, str]


def start(
    lease: Lease,
    delivery: Delivery,
    secrets: list[str],
    transport: Transport,
    traceparent: str | None = None,
) -> Outgoing | Finished:
    """Sign and prepare one POST: an Outgoing for the caller to drive, or, when no request
    is to be made, what is Finished already. Never raises: a step that does is this
    delivery's recorded failure. `traceparent`: the request span's W3C traceparent, sent
    when the endpoint opted in (delivery.pipeline.attempt_trace)."""
    started_at = timezone.now()
    step, headers = HEADERS, {}
    try:
        headers = unsigned_headers(delivery, time.time())
        if traceparent:
            headers["traceparent"] = traceparent
        step = SIGN
        sign(headers, delivery, secrets)
        step = SEND
        endpoint = delivery.endpoint
        exchange = transport.exchange(
            endpoint.url,
            bytes(delivery.event.payload),
            headers,
            connect_timeout=min(settings.DELIVERY_CONNECT_TIMEOUT, endpoint.timeout_seconds),
            total_timeout=endpoint.timeout_seconds,
            response_cap_bytes=settings.DELIVERY_RESPONSE_CAP_BYTES,
        )
        if exchange.handle is None:  # nothing to send (an invalid URL): judged as it is
            step = JUDGE
            return judged(lease, delivery, exchange.result, started_at, headers)
        return Outgoing(lease, delivery, exchange, started_at, headers)
    except Exception as exc:
        logger.exception("delivery %s failed inside the worker (%s)", lease.delivery_id, step)
        return failed_inside(lease, delivery, step, exc, started_at=started_at, headers=headers)


def conclude(outgoing: Outgoing, errno: int, message: str) -> Finished:
    """The verdict on a request libcurl has completed (`errno` 0) or failed. Never raises."""
    lease, delivery = outgoing.lease, outgoing.delivery
    step = SEND
    try:
        result = outgoing.exchange.finish(errno, message)
        step = JUDGE
        return judged(lease, delivery, result, outgoing.started_at, outgoing.headers)
    except Exception as exc:
        logger.exception("delivery %s failed inside the worker (%s)", lease.delivery_id, step)
        return failed_inside(
            lease, delivery, step, exc, started_at=outgoing.started_at, headers=outgoing.headers
        )


def judged(
    lease: Lease,
    delivery: Delivery,
    result: HttpResult,
    started_at: datetime,
    headers: dict[str, str],
) -> Finished:
    """Policy's verdict on one request's result, ready to record."""
    decision = decide(
        result,
        delivery.attempts + 1,
        schedule=settings.RETRY_SCHEDULE_SECONDS,
        jitter=settings.RETRY_JITTER,
        retry_after_max=settings.RETRY_AFTER_MAX_SECONDS,
    )
    return Finished(
        lease, sent=records.Sent(delivery, result, decision, started_at, _shown(headers))
    )


def failed_inside(
    lease: Lease,
    delivery: Delivery,
    step: str,
    exc: BaseException,
    *,
    started_at: datetime | None = None,
    headers: dict[str, str] | None = None,
) -> Finished:
    """`exc`, raised at `step`, as this delivery's failed attempt (error kind INTERNAL)."""
    result = HttpResult(
        status_code=None,
        duration_ms=0,
        error=f"{step} failed inside the worker: {type(exc).__name__}: {exc}"[:300],
        error_kind=INTERNAL,
        response_excerpt="",
        retry_after_seconds=None,
    )
    try:
        return judged(lease, delivery, result, started_at or timezone.now(), headers or {})
    except Exception:
        # The policy itself raised (a broken schedule setting?): the same verdict it gives
        # an internal failure, decided here, so that this delivery still ends somewhere.
        logger.exception("judging delivery %s failed", lease.delivery_id)
        schedule = settings.RETRY_SCHEDULE_SECONDS
        action = Action.RETRY if delivery.attempts < len(schedule) else Action.DEAD
        delay = float(schedule[delivery.attempts]) if action == Action.RETRY else 0.0
        decision = Decision(action, delay, result.error, counts_as_failure=False)
        sent = records.Sent(delivery, result, decision, started_at or timezone.now(), {})
        return Finished(lease, sent=sent)


def _shown(headers: dict[str, str]) -> dict[str, str]:
    """The request's headers as the attempt log keeps them: never the signature."""
    return {k: v for k, v in headers.items() if k != "webhook-signature"}


def settle(finished: Sequence[Finished], scheduler: Scheduler) -> list[str]:
    """Record a group in one transaction, then release its leases: retries each to its
    due time, all the rest in one ack. The database is written before the scheduler
    hears of it, so a crash in between only sends a delivery again (at least once).
    Returns the new status of each attempted delivery, in order.

    A group that cannot be recorded for a reason of its own (not DATABASE_DOWN) is
    recorded one delivery at a time; a delivery that still cannot be is recorded as a
    failure at step RECORD, without the response that would not go in."""
    attempted = [item for item in finished if item.sent is not None]
    held = [item.held for item in finished if item.held is not None]
    try:
        recorded = _record(attempted, held)
    except DATABASE_DOWN:
        raise
    except Exception:
        logger.exception("recording %d deliveries failed; recording one by one", len(finished))
        attempted, recorded = _record_one_by_one(attempted, held)
    # Acks are counted by outcome in Redis (the /metrics counters): one call per outcome.
    acks: dict[str, list[Lease]] = {}
    retries: list[tuple[Lease, float]] = []
    for item in finished:
        if item.sent is None:
            acks.setdefault("held" if item.held is not None else "stale", []).append(item.lease)
    for item, outcome in zip(attempted, recorded, strict=True):
        if (
            outcome.status == Delivery.Status.RETRY_SCHEDULED
            and outcome.next_attempt_at is not None
        ):
            retries.append((item.lease, outcome.next_attempt_at.timestamp()))
        else:
            acks.setdefault(outcome.status, []).append(item.lease)
        if outcome.status != Delivery.Status.DELIVERED:
            reason = item.sent.decision.reason
            logger.info("delivery %s: %s (%s)", item.lease.delivery_id, outcome.status, reason)
    # The group's retries in one round trip (a retry storm is mostly retries), then its
    # acks by outcome. Each is tried even when one before it failed (a scheduler shard
    # down): a lease not released expires and comes back, so the less of that the better.
    calls = [lambda: scheduler.retry_later_many(retries)]
    calls += [
        lambda name=name, leases=leases: scheduler.ack(leases, outcome=name)
        for name, leases in acks.items()
    ]
    failure: Exception | None = None
    for call in calls:
        try:
            call()
        except redis.RedisError as exc:
            failure = failure or exc
    if failure is not None:
        raise failure
    return [outcome.status for outcome in recorded]


def _record(attempted: Sequence[Finished], held: Sequence[Delivery]) -> list[records.Recorded]:
    for tries_left in reversed(range(RECORD_TRIES)):
        try:
            return records.record_many([item.sent for item in attempted], held=held)
        except OperationalError as exc:
            # A deadlock or lock timeout rolled the whole group back: write it again,
            # rather than let every lease in it expire and every delivery go out twice.
            if not tries_left:
                raise
            logger.warning("recording %d deliveries failed, retrying: %s", len(attempted), exc)
            close_old_connections()
            time.sleep(RECORD_RETRY_SECONDS)
    raise AssertionError("unreachable")


def _record_one_by_one(
    attempted: Sequence[Finished], held: Sequence[Delivery]
) -> tuple[list[Finished], list[records.Recorded]]:
    """Each of a group that failed as a whole, alone: the bad one is found and recorded
    as its own failure, and the rest of the group as it was."""
    if held:
        _record([], held)
    kept: list[Finished] = []
    recorded: list[records.Recorded] = []
    for item in attempted:
        try:
            [outcome] = _record([item], ())
        except DATABASE_DOWN:
            raise
        except Exception as exc:
            logger.exception("delivery %s could not be recorded", item.lease.delivery_id)
            item = failed_inside(item.lease, item.sent.delivery, RECORD, exc)
            try:
                [outcome] = _record([item], ())
            except DATABASE_DOWN:
                raise
            except Exception:
                # Not even a bare failure goes in: its lease expires and it comes back.
                logger.exception(
                    "delivery %s: not even its failure could be recorded", item.lease.delivery_id
                )
                continue
        kept.append(item)
        recorded.append(outcome)
    return kept, recorded


# Answers that say an endpoint is past its capacity: its adaptive limit goes down on them.
OVERLOAD_STATUSES = frozenset({429, 503})
OVERLOAD_ERRORS = frozenset({transport.TIMEOUT, transport.DEADLINE, transport.CONNECTION})


def overloaded(result: HttpResult) -> bool:
    """Whether a request's result says its endpoint is past its capacity: 429, 503, a
    timeout, or a connection refused or reset."""
    return result.status_code in OVERLOAD_STATUSES or result.error_kind in OVERLOAD_ERRORS


def pause_until(sent: records.Sent | None) -> float | None:
    """When the endpoint may be sent to again, if its answer asks for a pause: a 429 or
    503 with Retry-After pauses the whole endpoint, not just this delivery, since its
    other queued work would only hit the same wall. The engine applies it as soon as the
    answer arrives, before the attempt is recorded and before the request's endpoint slot
    is given back: every pick before the pause would be another request into the wall."""
    if sent is None:
        return None
    wait = sent.result.retry_after_seconds
    if sent.result.status_code in (429, 503) and wait:
        return time.time() + min(wait, settings.RETRY_AFTER_MAX_SECONDS)
    return None

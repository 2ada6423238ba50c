"""A tenant's status, one way for every surface: the operators' overview, the tenant's
own dashboard, `manage.py lanes` and the Prometheus metrics all call `read`.

The facts come from one scheduler snapshot plus the database counts a status needs:
held deliveries per disabled endpoint, dead letters, retries waiting when nothing is
queued, and deliveries over the last minute and the last few seconds. The words come
from `pacing` (pure).

A status is steady. The reasons that rest on one instant's numbers (at the concurrency
cap, at a rate limit, paced behind other tenants) are judged over the last
WINDOW_SECONDS: every reading records in Redis what it saw for each tenant, and such a
reason applies when at least half of the window's readings (this one included) saw it,
and the tenant still has work queued. So two surfaces read a moment apart name the
same status, and one free slot does not flip "at its cap" to "on pace". Reasons that are
states rather than instants (paused, disabled, waiting for a Retry-After, failing) apply
as soon as they are true. Readings come from whoever looks: the dashboards' polls and
Prometheus' scrapes keep the window filled; with no reading in the window, this one
decides alone.
"""

import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, tzinfo

import redis
from django.db.models import Count, Min
from django.utils import timezone

from core import redis_connection
from dashboards import history, pacing
from dashboards.pacing import Status
from delivery.models import Delivery
from delivery.scheduler import EndpointRow, Snapshot, TenantRow, get_scheduler
from delivery.upkeep import sampling
from tenants.models import Endpoint, Tenant
from webhooks.models import Event

WINDOW_SECONDS = 30
STEADY = frozenset({Status.AT_CAP, Status.RATE_LIMITED, Status.PACED})
MEMORY_KEY = redis_connection.KEY_PREFIX + "status:"  # + the tenant's id, or "fallback"
RECENT_EVENTS = 50  # a tenant's latest events show which shared destinations it uses

TenantKey = int | None  # None: the fallback lane (events without a tenant key)


@dataclass(frozen=True)
class TenantStatus:
    tenant_id: TenantKey
    tenant: Tenant | None
    row: TenantRow | None  # the scheduler's (or, past its top-N, the database's) queue
    facts: pacing.TenantFacts
    assessed: pacing.Pacing
    endpoints: tuple[Endpoint, ...]  # in the order of facts.endpoints

    @property
    def code(self) -> str:
        return str(self.assessed.status)

    def holding_endpoint(self) -> Endpoint | None:
        """The endpoint whose cap, rate or Retry-After holds this tenant back, when that is
        its status. Judged over a window, so its slots may happen to be free this instant:
        then the fullest endpoint is the one."""
        test = {
            Status.AT_CAP: lambda fact: fact.at_cap,
            Status.RATE_LIMITED: lambda fact: fact.at_rate,
            Status.ENDPOINT_WAIT: lambda fact: fact.waiting_for_retry_after,
        }.get(self.assessed.status)
        if test is None or not self.endpoints:
            return None
        facts = self.facts.endpoints
        chosen = next((fact for fact in facts if test(fact)), None) or pacing.busiest(self.facts)
        return next(e for e, fact in zip(self.endpoints, facts, strict=True) if fact is chosen)


def tenants_of(keys: Iterable[TenantKey]) -> list[Tenant | None]:
    """The tenants for `keys` in their order (None stays: the fallback lane), leaving out
    a tenant deleted while its work was still in Redis."""
    keys = list(keys)
    known = Tenant.objects.in_bulk([key for key in keys if key is not None])
    return [known[key] if key is not None else None for key in keys if key is None or key in known]


def take_snapshot() -> Snapshot | None:
    """One scheduler snapshot for a whole page; None when Redis does not answer."""
    try:
        return get_scheduler().snapshot(top_n=sampling.top_n())
    except redis.RedisError:
        return None


def read(
    tenants: Sequence[Tenant | None],
    snapshot: Snapshot | None,
    *,
    now: datetime | None = None,
    tz: tzinfo | None = None,
    label: Callable[[Endpoint], str] = lambda endpoint: endpoint.url,
    last_errors: dict[int, str] | None = None,
    detail: bool = False,
) -> dict[TenantKey, TenantStatus]:
    """Each tenant's (None: the fallback lane's) status from one snapshot. `detail` adds
    what only the tenant's own page explains (next retry times, events received
    recently); `label` names an endpoint for the reader (a tenant never sees a shared
    destination's URL); `last_errors` maps endpoint ids to their latest error."""
    now = now or timezone.now()
    keys = [tenant.pk if tenant else None for tenant in tenants]
    reading = _gather(
        tenants, keys, snapshot, now=now, detail=detail, label=label, last_errors=last_errors
    )
    facts = {
        key: reading.tenant_facts(tenant, key) for tenant, key in zip(tenants, keys, strict=True)
    }
    platform = pacing.platform_facts(snapshot)
    seen = {key: pacing.reasons(facts[key], platform) for key in keys}
    judged = judge(seen, facts, live=snapshot is not None)
    return {
        key: TenantStatus(
            tenant_id=key,
            tenant=tenant,
            row=reading.rows.get(key),
            facts=facts[key],
            assessed=pacing.assess(facts[key], platform, now=now, tz=tz, found=judged[key]),
            endpoints=tuple(reading.own(key)),
        )
        for tenant, key in zip(tenants, keys, strict=True)
    }


def judge(
    seen: dict[TenantKey, list[Status]],
    facts: dict[TenantKey, pacing.TenantFacts],
    *,
    live: bool = True,
) -> dict[TenantKey, list[Status]]:
    """Record this reading's reasons and judge the steady ones over the window (see the
    module's docstring). Without Redis (or `live` False) this reading decides alone."""
    if not live or not seen:
        return seen
    try:
        windows = _remember(seen)
    except redis.RedisError:
        return seen
    return {
        key: _over_window(reasons, readings, queued=facts[key].queued > 0)
        for (key, reasons), readings in zip(seen.items(), windows, strict=True)
    }


def _remember(seen: dict[TenantKey, list[Status]]) -> list[list[bytes]]:
    """Record each tenant's steady reasons of this reading; return, per tenant in `seen`'s
    order, the readings of the window (this one included)."""
    now = time.time()
    pipe = redis_connection.shared().pipeline(transaction=False)
    for key, reasons in seen.items():
        name = MEMORY_KEY + ("fallback" if key is None else str(key))
        steady = ",".join(sorted(reason.value for reason in reasons if reason in STEADY))
        pipe.zadd(name, {f"{now!r}|{steady}": now})
        pipe.zremrangebyscore(name, "-inf", now - WINDOW_SECONDS)
        pipe.zrange(name, 0, -1)
        pipe.expire(name, WINDOW_SECONDS * 2)
    answers = pipe.execute()
    return answers[2::4]  # each tenant's zrange, of its four commands


def _over_window(reasons: list[Status], readings: list[bytes], *, queued: bool) -> list[Status]:
    """A state applies as soon as it is true; a steady reason when at least half of the
    window's readings saw it and the tenant still has work queued."""
    tally = Counter(
        code for member in readings for code in member.decode().partition("|")[2].split(",") if code
    )
    return [
        status
        for status in Status
        if (status in reasons and status not in STEADY)
        or (status in STEADY and queued and tally[status.value] * 2 >= len(readings))
    ]


# A tenant with no row in the snapshot has nothing queued (its in-flight count comes from
# its endpoints: _Reading.queue).
_NOTHING_QUEUED = TenantRow(
    tenant_id=None,
    fresh=0,
    retry=0,
    delayed=0,
    in_flight=0,
    oldest_age_seconds=0.0,
    weight=1,
    paused=False,
)


@dataclass(frozen=True)
class _Reading:
    """What one reading knows of all its tenants at once: the snapshot's rows and
    endpoints, and the database's counts, each asked once for the whole page; and how
    `read`'s caller wants endpoints named."""

    now: datetime
    detail: bool
    label: Callable[[Endpoint], str]
    last_errors: dict[int, str]
    rows: dict[TenantKey, TenantRow]
    endpoints: dict[int, list[Endpoint]]  # each tenant's own, then its shared destinations
    capacity: dict[int, EndpointRow]  # the snapshot's endpoints
    held: dict[tuple[TenantKey, int], int]
    dead: dict[TenantKey, int]
    retrying: dict[TenantKey, int]  # only for tenants without a row
    last_minute: dict[TenantKey, int]
    last_window: dict[TenantKey, int]
    next_retry: dict[tuple[TenantKey, int], tuple[datetime | None, int]]

    def own(self, key: TenantKey) -> list[Endpoint]:
        return self.endpoints.get(key, []) if key is not None else []

    def queue(self, tenant: Tenant | None, key: TenantKey) -> TenantRow:
        """The tenant's row; without one, nothing is queued, so every retry the database
        knows of waits for its time."""
        row = self.rows.get(key)
        if row is not None:
            return row
        return replace(
            _NOTHING_QUEUED,
            tenant_id=key,
            delayed=self.retrying.get(key, 0),
            weight=tenant.weight if tenant else 1,
            # The snapshot rows only tenants with work queued; what is in flight to the
            # tenant's own endpoints is its own (a shared destination's is everyone's).
            in_flight=sum(
                self.capacity[e.pk].in_flight
                for e in self.own(key)
                if e.tenant_id == key and e.pk in self.capacity
            ),
        )

    def tenant_facts(self, tenant: Tenant | None, key: TenantKey) -> pacing.TenantFacts:
        queue = self.queue(tenant, key)
        own = self.own(key)
        last_minute = self.last_minute.get(key, 0)
        return pacing.TenantFacts(
            weight=queue.weight,
            paused=queue.paused or bool(tenant and not tenant.is_active),
            fresh=queue.fresh,
            retry=queue.retry,
            delayed=queue.delayed,
            in_flight=queue.in_flight,
            held=sum(self.held.get((key, e.pk), 0) for e in own),
            oldest_age_seconds=queue.oldest_age_seconds,
            delivered_last_minute=last_minute,
            rate_per_second=pacing.recent_rate(last_minute, self.last_window.get(key, 0)),
            received_recently=_received_recently(key, self.now) if self.detail else 0,
            dead=self.dead.get(key, 0),
            endpoints=tuple(self.endpoint_facts(key, e) for e in own),
            rate_limit_per_second=tenant.effective_rate_per_second() if tenant else None,
            rate_limited=queue.rate_limited,
        )

    def endpoint_facts(self, key: TenantKey, endpoint: Endpoint) -> pacing.EndpointFacts:
        return pacing.EndpointFacts(
            label=self.label(endpoint),
            enabled=endpoint.enabled,
            max_in_flight=endpoint.in_flight_cap,
            consecutive_failures=endpoint.consecutive_failures,
            held=self.held.get((key, endpoint.pk), 0),
            disabled_reason=endpoint.disabled_reason,
            failing_since=endpoint.failing_since,
            last_error=self.last_errors.get(endpoint.pk, ""),
            next_retry_at=self.next_retry.get((key, endpoint.pk), (None, 0))[0],
            retries_due=self.next_retry.get((key, endpoint.pk), (None, 0))[1],
            **pacing.live_endpoint_fields(self.capacity.get(endpoint.pk)),
        )


def _gather(
    tenants: Sequence[Tenant | None],
    keys: list[TenantKey],
    snapshot: Snapshot | None,
    *,
    now: datetime,
    detail: bool,
    label: Callable[[Endpoint], str],
    last_errors: dict[int, str] | None,
) -> _Reading:
    rows = _rows(tenants, snapshot, now)
    endpoints = _endpoints_of([tenant for tenant in tenants if tenant is not None])
    return _Reading(
        now=now,
        detail=detail,
        label=label,
        last_errors=last_errors or {},
        rows=rows,
        endpoints=endpoints,
        capacity={e.endpoint_id: e for e in snapshot.endpoints} if snapshot else {},
        held=_held(endpoints),
        dead=_counts(Delivery.Status.DEAD, keys),
        retrying=_counts(Delivery.Status.RETRY_SCHEDULED, [k for k in keys if k not in rows]),
        last_minute=history.delivered_recently(keys),
        last_window=history.delivered_recently(keys, pacing.RECENT_WINDOW_SECONDS),
        next_retry=_next_retries(endpoints, now) if detail else {},
    )


def _rows(
    tenants: Sequence[Tenant | None], snapshot: Snapshot | None, now: datetime
) -> dict[TenantKey, TenantRow]:
    """The snapshot's rows by tenant. It holds only the top-N oldest backlogs: when there
    are more, a tenant it leaves out is asked of the database."""
    rows: dict[TenantKey, TenantRow] = (
        {r.tenant_id: r for r in snapshot.tenants} if snapshot else {}
    )
    if snapshot is None or snapshot.backlogged_tenants <= len(snapshot.tenants):
        return rows
    for tenant in tenants:
        if tenant is not None and tenant.pk not in rows:
            row = _row_from_database(tenant, now)
            if row is not None:
                rows[tenant.pk] = row
    return rows


def _row_from_database(tenant: Tenant, now: datetime) -> TenantRow | None:
    pending = Delivery.objects.filter(
        tenant=tenant, status=Delivery.Status.PENDING, endpoint__enabled=True
    )
    oldest = pending.aggregate(at=Min("enqueued_at"))["at"]
    if oldest is None:
        return None
    return TenantRow(
        tenant_id=tenant.pk,
        fresh=history.capped_count(pending),
        retry=0,
        delayed=history.capped_count(
            Delivery.objects.filter(tenant=tenant, status=Delivery.Status.RETRY_SCHEDULED)
        ),
        in_flight=0,
        oldest_age_seconds=(now - oldest).total_seconds(),
        weight=tenant.weight,
        paused=not tenant.is_active,
    )


def _endpoints_of(tenants: list[Tenant]) -> dict[int, list[Endpoint]]:
    """Each tenant's own endpoints, then the shared destinations its latest events went to
    (a gateway's tenants all deliver to one: its cap and health are theirs too)."""
    found: dict[int, list[Endpoint]] = {tenant.pk: [] for tenant in tenants}
    for endpoint in Endpoint.objects.filter(tenant_id__in=list(found)).order_by("pk"):
        found[endpoint.tenant_id].append(endpoint)
    shared = {e.pk: e for e in Endpoint.objects.filter(tenant__isnull=True).order_by("pk")}
    if not shared:
        return found
    for tenant in tenants:
        found[tenant.pk] += [shared[pk] for pk in _shared_ids(tenant) if pk in shared]
    return found


# Which shared destinations a tenant's events go to changes only when a source's
# destinations do; the overview and the metrics ask every few seconds for dozens of
# tenants, one query each, so each answer is kept for a short while.
SHARED_IDS_TTL_SECONDS = 30.0
# Keyed by id and creation time: a database that reuses ids (SQLite after a flush) must
# not inherit another tenant's answer.
_shared_ids_seen: dict[tuple[int, datetime], tuple[float, list[int]]] = {}


def _shared_ids(tenant: Tenant) -> list[int]:
    now = time.monotonic()
    key = (tenant.pk, tenant.created_at)
    cached = _shared_ids_seen.get(key)
    if cached is not None and now - cached[0] < SHARED_IDS_TTL_SECONDS:
        return cached[1]
    recent = Event.objects.filter(tenant_id=tenant.pk).order_by("-received_at")
    ids = sorted(
        set(
            Delivery.objects.filter(
                event__in=recent[:RECENT_EVENTS], endpoint__tenant__isnull=True
            ).values_list("endpoint_id", flat=True)
        )
    )
    if len(_shared_ids_seen) > 10_000:  # bounded: a forgotten answer is only asked again
        _shared_ids_seen.clear()
    _shared_ids_seen[key] = (now, ids)
    return ids


def _held(endpoints: dict[int, list[Endpoint]]) -> dict[tuple[TenantKey, int], int]:
    """Held deliveries per (tenant, disabled endpoint): held work waits only there. Each
    count is capped (history.LIVE_COUNT_CAP), so an endpoint holding millions stays cheap."""
    held = {}
    for tenant_id, own in endpoints.items():
        for endpoint in own:
            if not endpoint.enabled:
                n = history.capped_count(
                    Delivery.objects.filter(
                        endpoint=endpoint, tenant_id=tenant_id, status=Delivery.Status.HELD
                    )
                )
                if n:
                    held[(tenant_id, endpoint.pk)] = n
    return held


def _counts(status: str, keys: Iterable[TenantKey]) -> dict[TenantKey, int]:
    """Deliveries in `status` per tenant (None: the fallback lane)."""
    keys = list(keys)
    ids = [key for key in keys if key is not None]
    found: dict[TenantKey, int] = {}
    if ids:
        found.update(
            Delivery.objects.filter(status=status, tenant_id__in=ids)
            .order_by()
            .values_list("tenant_id")
            .annotate(n=Count("pk"))
        )
    if None in keys:
        found[None] = history.capped_count(
            Delivery.objects.filter(status=status, tenant__isnull=True)
        )
    return found


def _next_retries(
    endpoints: dict[int, list[Endpoint]], now: datetime
) -> dict[tuple[TenantKey, int], tuple[datetime | None, int]]:
    """Per (tenant, failing endpoint): when its next retry falls due, and how many are
    due already. A retry whose time has passed waits for its turn and a free slot, so
    its time is never shown as the next one."""
    found = {}
    for tenant_id, own in endpoints.items():
        for endpoint in own:
            if endpoint.enabled and endpoint.consecutive_failures:
                retries = Delivery.objects.filter(
                    endpoint=endpoint,
                    tenant_id=tenant_id,
                    status=Delivery.Status.RETRY_SCHEDULED,
                )
                due = history.capped_count(retries.filter(next_attempt_at__lte=now))
                upcoming = (
                    retries.filter(next_attempt_at__gt=now)
                    .order_by("next_attempt_at")
                    .values_list("next_attempt_at", flat=True)
                    .first()
                )
                if due or upcoming is not None:
                    found[(tenant_id, endpoint.pk)] = (upcoming, due)
    return found


def _received_recently(key: TenantKey, now: datetime) -> int:
    if key is None:
        return 0
    return history.received_since(key, now - timedelta(minutes=pacing.RECEIVED_WINDOW_MINUTES))

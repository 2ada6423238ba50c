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
from dataclasses import dataclass
from datetime import datetime, timedelta, tzinfo

import redis
from django.db.models import Count, Min
from django.utils import timezone

from core import redis_connection
from dashboards import history, pacing
from dashboards.pacing import Status
from delivery.models import Delivery
from delivery.scheduler import Snapshot, TenantRow, get_scheduler
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
    rows: dict[TenantKey, TenantRow] = (
        {r.tenant_id: r for r in snapshot.tenants} if snapshot else {}
    )
    beyond_top_n = snapshot is not None and snapshot.backlogged_tenants > len(snapshot.tenants)
    for tenant in tenants:
        if tenant is not None and tenant.pk not in rows and beyond_top_n:
            row = _row_from_database(tenant, now)  # past the top-N oldest: ask the truth
            if row is not None:
                rows[tenant.pk] = row
    endpoints = _endpoints_of([tenant for tenant in tenants if tenant is not None])
    capacity = {e.endpoint_id: e for e in snapshot.endpoints} if snapshot else {}
    held = _held(endpoints)
    dead = _counts(Delivery.Status.DEAD, keys)
    # No row: nothing is queued, so every retry the database knows of waits for its time.
    retrying = _counts(Delivery.Status.RETRY_SCHEDULED, [k for k in keys if k not in rows])
    last_minute = history.delivered_recently(keys)
    last_window = history.delivered_recently(keys, pacing.RECENT_WINDOW_SECONDS)
    next_retry = _next_retries(endpoints) if detail else {}
    platform = pacing.platform_facts(snapshot)
    facts: dict[TenantKey, pacing.TenantFacts] = {}
    for tenant, key in zip(tenants, keys, strict=True):
        row = rows.get(key)
        own = endpoints.get(key, []) if key is not None else []
        facts[key] = pacing.TenantFacts(
            weight=row.weight if row else (tenant.weight if tenant else 1),
            paused=bool(row and row.paused) or bool(tenant and not tenant.is_active),
            fresh=row.fresh if row else 0,
            retry=row.retry if row else 0,
            delayed=row.delayed if row else retrying.get(key, 0),
            in_flight=row.in_flight if row else 0,
            held=sum(held.get((key, e.pk), 0) for e in own),
            oldest_age_seconds=row.oldest_age_seconds if row else 0.0,
            delivered_last_minute=last_minute.get(key, 0),
            rate_per_second=pacing.recent_rate(last_minute.get(key, 0), last_window.get(key, 0)),
            received_recently=_received_recently(key, now) if detail else 0,
            dead=dead.get(key, 0),
            endpoints=tuple(
                pacing.EndpointFacts(
                    label=label(e),
                    enabled=e.enabled,
                    max_in_flight=e.max_in_flight,
                    consecutive_failures=e.consecutive_failures,
                    held=held.get((key, e.pk), 0),
                    disabled_reason=e.disabled_reason,
                    failing_since=e.failing_since,
                    last_error=(last_errors or {}).get(e.pk, ""),
                    next_retry_at=next_retry.get((key, e.pk)),
                    **pacing.live_endpoint_fields(capacity.get(e.pk)),
                )
                for e in own
            ),
            rate_limit_per_second=tenant.effective_rate_per_second() if tenant else None,
            rate_limited=bool(row and row.rate_limited),
        )
    seen = {key: pacing.reasons(facts[key], platform) for key in keys}
    judged = judge(seen, facts, live=snapshot is not None)
    return {
        key: TenantStatus(
            tenant_id=key,
            tenant=tenant,
            row=rows.get(key),
            facts=facts[key],
            assessed=pacing.assess(facts[key], platform, now=now, tz=tz, found=judged[key]),
            endpoints=tuple(endpoints.get(key, []) if key is not None else []),
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
    now = time.time()
    try:
        pipe = redis_connection.shared().pipeline(transaction=False)
        for key, reasons in seen.items():
            name = MEMORY_KEY + ("fallback" if key is None else str(key))
            steady = ",".join(sorted(reason.value for reason in reasons if reason in STEADY))
            pipe.zadd(name, {f"{now!r}|{steady}": now})
            pipe.zremrangebyscore(name, "-inf", now - WINDOW_SECONDS)
            pipe.zrange(name, 0, -1)
            pipe.expire(name, WINDOW_SECONDS * 2)
        answers = pipe.execute()
    except redis.RedisError:
        return seen
    judged = {}
    for index, (key, reasons) in enumerate(seen.items()):
        readings = answers[index * 4 + 2]
        tally = Counter(
            code
            for member in readings
            for code in member.decode().partition("|")[2].split(",")
            if code
        )
        queued = facts[key].queued > 0
        judged[key] = [
            status
            for status in Status
            if (status in reasons and status not in STEADY)
            or (status in STEADY and queued and tally[status.value] * 2 >= len(readings))
        ]
    return judged


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


def _next_retries(endpoints: dict[int, list[Endpoint]]) -> dict[tuple[TenantKey, int], datetime]:
    """When the next retry is due, per (tenant, failing endpoint)."""
    due_at = {}
    for tenant_id, own in endpoints.items():
        for endpoint in own:
            if endpoint.enabled and endpoint.consecutive_failures:
                due = (
                    Delivery.objects.filter(
                        endpoint=endpoint,
                        tenant_id=tenant_id,
                        status=Delivery.Status.RETRY_SCHEDULED,
                    )
                    .order_by("next_attempt_at")
                    .values_list("next_attempt_at", flat=True)
                    .first()
                )
                if due is not None:
                    due_at[(tenant_id, endpoint.pk)] = due
    return due_at


def _received_recently(key: TenantKey, now: datetime) -> int:
    if key is None:
        return 0
    return history.received_since(key, now - timedelta(minutes=pacing.RECEIVED_WINDOW_MINUTES))

"""Turn the snapshot script's reply into a Snapshot. No Redis calls here."""

from collections.abc import Sequence
from typing import Any

from .keys import tenant_id_of
from .values import EndpointRow, Snapshot, TenantRow

# Prometheus-style upper bounds (seconds) for the tenants' backlog-age histogram.
DEFAULT_AGE_BUCKETS = (1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0, 4 * 3600.0, 24 * 3600.0)


def text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def count(value: Any) -> int:
    return 0 if value is None else int(value)


def optional(value: Any) -> float | None:
    """A stored number ("" or missing = none): a rate, or a pause's end."""
    if value is None or not text(value):
        return None
    return float(text(value))


def age_seconds(now_ms: int, oldest_ms: Any) -> float:
    return max(0.0, (now_ms - int(float(text(oldest_ms)))) / 1000)


def decode(reply: list[Any], buckets: Sequence[float]) -> Snapshot:
    (
        stats,
        delayed,
        leases,
        fallback,
        oldest,
        tenant_rows,
        endpoint_rows,
        histogram,
        backlogged,
        now_ms,
    ) = reply
    now = int(text(now_ms))
    fresh, retry, fallback_total, deferrals, tenants, rate_waits = map(count, stats)
    tenants_out = [
        TenantRow(
            tenant_id=tenant_id_of(text(row[0])),
            oldest_age_seconds=age_seconds(now, row[1]),
            fresh=count(row[2]),
            retry=count(row[3]),
            delayed=count(row[4]),
            in_flight=count(row[5]),
            weight=count(row[6]) or 1,
            paused=bool(row[7]),
            rate_per_second=optional(row[8]),
            rate_limited=bool(row[9]),
        )
        for row in tenant_rows
    ]
    endpoints_out = [
        EndpointRow(
            endpoint_id=int(text(row[0])),
            in_flight=int(float(text(row[1]))),
            max_in_flight=count(row[2]),
            retry_max_in_flight=count(row[3]),
            retry_in_flight=count(row[4]),
            parked_lanes=count(row[5]),
            rate_per_second=optional(row[6]),
            paused_until=optional(row[7]),
            rate_limited=bool(row[8]),
            adaptive_limit=optional(row[9]),
            retry_budget=optional(row[10]),
        )
        for row in endpoint_rows
    ]
    return Snapshot(
        active_tenants=tenants,
        backlogged_tenants=int(backlogged),
        fresh_depth=fresh,
        retry_depth=retry,
        delayed_depth=int(delayed),
        in_flight=int(leases),
        fallback_enqueued_total=fallback_total,
        fallback_depth=sum(count(value) for value in fallback),
        deferrals_total=deferrals,
        oldest_age_seconds=age_seconds(now, oldest) if text(oldest) else 0.0,
        tenants=tenants_out,
        endpoints=endpoints_out,
        age_histogram=dict(zip(buckets, (int(n) for n in histogram), strict=True)),
        rate_waits_total=rate_waits,
    )

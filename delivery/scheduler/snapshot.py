"""Turn the snapshot script's reply into a Snapshot. No Redis calls here."""

from collections.abc import Sequence
from typing import Any

from . import protocol
from .keys import tenant_id_of
from .values import ADAPTIVE_FIELDS, EndpointRow, Snapshot, TenantRow

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
    tenants_out = [_tenant_row(now, protocol.SNAPSHOT_TENANT.unpack(row)) for row in tenant_rows]
    endpoints_out = [_endpoint_row(protocol.SNAPSHOT_ENDPOINT.unpack(row)) for row in endpoint_rows]
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


def _tenant_row(now_ms: int, row: dict[str, Any]) -> TenantRow:
    return TenantRow(
        tenant_id=tenant_id_of(text(row["tenant"])),
        oldest_age_seconds=age_seconds(now_ms, row["oldest_ms"]),
        fresh=count(row["fresh"]),
        retry=count(row["retry"]),
        delayed=count(row["delayed"]),
        in_flight=count(row["in_flight"]),
        weight=count(row["weight"]) or 1,
        paused=bool(row["paused"]),
        rate_per_second=optional(row["rate"]),
        rate_limited=bool(row["rate_limited"]),
    )


def _endpoint_row(row: dict[str, Any]) -> EndpointRow:
    return EndpointRow(
        endpoint_id=int(text(row["endpoint"])),
        in_flight=int(float(text(row["in_flight"]))),
        max_in_flight=count(row["max_in_flight"]),
        retry_max_in_flight=count(row["retry_max_in_flight"]),
        retry_in_flight=count(row["retry_in_flight"]),
        parked_lanes=count(row["parked_lanes"]),
        rate_per_second=optional(row["rate"]),
        paused_until=optional(row["paused_until"]),
        rate_limited=bool(row["rate_limited"]),
        retry_budget=optional(row["retry_budget"]),
        **adaptive_fields(row),
    )


def adaptive_fields(row: dict[str, Any]) -> dict[str, float | None]:
    """An adaptive limit's fields from a reply decoded by name (none: its limit is fixed)."""
    return {name: optional(row[name]) for name in ADAPTIVE_FIELDS}

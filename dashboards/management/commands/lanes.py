import json
import time
from dataclasses import asdict
from datetime import UTC

import redis
from django.conf import settings
from django.core.management.base import BaseCommand
from django.utils import timezone

from core import redis_connection
from dashboards import status
from dashboards.endpoint_pace import last_move
from delivery.scheduler import EndpointRow, Snapshot, get_scheduler
from delivery.worker import heartbeats
from tenants.models import Endpoint


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f}s"
    if seconds < 7200:
        return f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.1f}h"


class Command(BaseCommand):
    help = (
        "Show the schedule: the tenants with the oldest backlog (age, depth per lane, "
        "in flight, weight, status) and the endpoints at their concurrency cap. "
        "--watch refreshes; --json prints one snapshot for scripts."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument(
            "--top",
            type=int,
            default=settings.METRICS_TOP_N,
            help="How many tenants and endpoints.",
        )
        parser.add_argument(
            "--watch", type=float, nargs="?", const=2.0, help="Refresh every N seconds (default 2)."
        )
        parser.add_argument(
            "--json", action="store_true", help="Print the snapshot as JSON and exit."
        )

    def handle(self, *args, top: int, watch: float | None, json: bool, **options) -> None:
        scheduler = get_scheduler()
        if json:
            self.stdout.write(self._as_json(scheduler.snapshot(top_n=top)))
            return
        while True:
            snapshot = scheduler.snapshot(top_n=top)
            if watch:
                self.stdout.write("\033[2J\033[H", ending="")
            self.stdout.write(self._table(snapshot))
            if not watch:
                return
            try:
                time.sleep(watch)
            except KeyboardInterrupt:
                return

    def _as_json(self, snapshot: Snapshot) -> str:
        data = asdict(snapshot)
        data["workers"] = _workers()
        statuses = _statuses(snapshot)
        for row in data["tenants"]:
            found = statuses.get(row["tenant_id"])
            row["tenant_key"] = (
                "(fallback)" if row["tenant_id"] is None else (found.tenant.key if found else None)
            )
            row["status"] = found.code if found else None
        data["age_histogram"] = {
            f"{bound:g}": count for bound, count in snapshot.age_histogram.items()
        }
        return json.dumps(data, indent=2)

    def _table(self, snapshot: Snapshot) -> str:
        statuses = _statuses(snapshot)
        lines = [
            f"{snapshot.backlogged_tenants} tenants backlogged, oldest {_age(snapshot.oldest_age_seconds)}; "
            f"queued fresh {snapshot.fresh_depth}, retry {snapshot.retry_depth}, delayed {snapshot.delayed_depth}; "
            f"in flight {snapshot.in_flight}; fallback lane {snapshot.fallback_depth} "
            f"({snapshot.fallback_enqueued_total} ever); deferrals {snapshot.deferrals_total}",
            _workers_line(_workers()),
            "",
            f"{'tenant':<32} {'age':>8} {'fresh':>8} {'retry':>7} {'delayed':>8} {'flight':>6} {'weight':>6}  status",
        ]
        for row in snapshot.tenants:
            found = statuses.get(row.tenant_id)
            if row.tenant_id is None:
                name = "(fallback lane)"
            else:
                name = found.tenant.key if found else f"#{row.tenant_id}"
            # The same status the overview and the tenant's own page show (dashboards.status).
            label = found.assessed.label if found else "deleted tenant"
            lines.append(
                f"{name[:32]:<32} {_age(row.oldest_age_seconds):>8} {row.fresh:>8} {row.retry:>7} "
                f"{row.delayed:>8} {row.in_flight:>6} {row.weight:>6}  {label}"
            )
        capped = [
            row
            for row in snapshot.endpoints
            if row.in_flight_limit and row.in_flight >= row.in_flight_limit
        ]
        lines += ["", f"endpoints at their cap or adaptive limit: {len(capped)}"]
        urls = dict(
            Endpoint.objects.filter(pk__in=[r.endpoint_id for r in capped]).values_list("pk", "url")
        )
        for row in capped:
            adaptive = (
                f" (adaptive limit {row.adaptive_limit:.1f} of cap {row.max_in_flight})"
                if row.adaptive_limit is not None
                else ""
            )
            lines.append(
                f"  #{row.endpoint_id} {urls.get(row.endpoint_id, '?')[:60]}: {row.in_flight}/{row.in_flight_limit} "
                f"in flight{adaptive}, {row.parked_lanes} lanes waiting" + _why(row)
            )
        lines += _budget_lines(snapshot)
        return "\n".join(lines) + "\n"


def _why(row: EndpointRow) -> str:
    """Why an endpoint at its adaptive limit is there: the limit's last backoff."""
    if row.adaptive_limit is None:
        return ""
    return ". " + last_move(row, timezone.now(), UTC)


def _budget_lines(snapshot) -> list[str]:
    """Endpoints whose queued retries wait for their retry budget: the retries into them
    failed, so more go only as the clock or accepted deliveries earn tokens."""
    waiting = [
        row
        for row in snapshot.endpoints
        if row.retry_budget is not None and row.retry_budget < 1 and row.parked_lanes
    ]
    lines = ["", f"endpoints whose retries wait for their retry budget: {len(waiting)}"]
    for row in waiting:
        lines.append(
            f"  #{row.endpoint_id}: {row.retry_budget:.1f} tokens, {row.parked_lanes} lanes waiting"
        )
    return lines


def _workers() -> dict[str, float] | None:
    """Delivery workers that beat lately: name -> seconds since; None if Redis is down."""
    try:
        return heartbeats.live(redis_connection.shared())
    except redis.RedisError:
        return None


def _workers_line(workers: dict[str, float] | None) -> str:
    if workers is None:
        return "delivery workers: unknown (Redis did not answer)"
    if not workers:
        return "delivery workers: none beating: nothing is being delivered"
    beats = ", ".join(f"{name} {age:.0f}s ago" for name, age in sorted(workers.items()))
    return f"delivery workers: {len(workers)} ({beats})"


def _statuses(snapshot: Snapshot) -> dict[int | None, status.TenantStatus]:
    """The snapshot's tenants' statuses; a tenant deleted while its work was in Redis has none."""
    return status.read(status.tenants_of(r.tenant_id for r in snapshot.tenants), snapshot)

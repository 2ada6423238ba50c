"""Events arriving over time, through the platform's real accept path.

A plan is a list of events with the second (from the start of the run) at which each
is sent. The publisher thread walks it in ticks: each tick, the events now due from one
group of senders are accepted together by `ingest.accept.accept_many`, the function
behind both the publish API (sender side) and ingest (gateway side), with its
transaction, its Delivery rows and its enqueue on commit. Only HTTP and signature
checking are skipped: a bulk in-process publish, so that the load generator does not
eat the CPU the workers are measured on.

Acceptance time is stamped by an on_commit callback registered before accept_many's
own: it runs right after the commit and before the deliveries enter Redis, so it is
the instant a provider would get its 202, and no delivery can arrive before it.
"""

import json
import threading
import time
from dataclasses import dataclass, field

from django.db import close_old_connections, connection, transaction

from ingest.accept import accept_many
from tenants.models import Tenant
from webhooks.models import Source

TICK_SECONDS = 0.02
# Events per accept_many call (one transaction) when publishing falls behind. SQLite
# has one writer: big back-to-back transactions would starve the workers' recorders.
MAX_BATCH = 100


@dataclass(frozen=True)
class Sender:
    """Who sends: the tenant, its group in the report, and for the gateway case the
    source whose destinations receive it (None: the tenant's own endpoints)."""

    tenant: Tenant
    group: str
    source: Source | None = None


@dataclass(frozen=True)
class Planned:
    at: float  # seconds after the run's start
    sender: Sender


@dataclass
class Accepted:
    group: str
    tenant: str
    planned_at: float
    accepted_at: float  # Unix time of the commit


@dataclass
class Publisher:
    plan: list[Planned]
    started_at: float = 0.0  # Unix time; set by start()
    accepted: dict[str, Accepted] = field(default_factory=dict)  # event id -> acceptance
    published: int = 0
    max_lag: float = 0.0  # how late the latest-sent event left, at worst (seconds)
    error: BaseException | None = None
    _thread: threading.Thread | None = None
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        self.plan.sort(key=lambda one: one.at)
        self.started_at = time.time()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @property
    def done(self) -> bool:
        return self.published >= len(self.plan) or self.error is not None

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        try:
            next_index = 0
            while next_index < len(self.plan) and not self._stop.is_set():
                elapsed = time.time() - self.started_at
                due = next_index
                while due < len(self.plan) and self.plan[due].at <= elapsed:
                    due += 1
                batch, next_index = self.plan[next_index:due], due
                by_group: dict[str, list[Planned]] = {}
                for planned in batch:
                    by_group.setdefault(planned.sender.group, []).append(planned)
                for group in by_group.values():
                    for start in range(0, len(group), MAX_BATCH):
                        self._publish(group[start : start + MAX_BATCH])
                if batch:
                    self.max_lag = max(self.max_lag, time.time() - self.started_at - batch[-1].at)
                self._stop.wait(TICK_SECONDS)
        except BaseException as exc:  # reported by the runner, which stops the run
            self.error = exc
        finally:
            close_old_connections()
            connection.close()

    def _publish(self, batch: list[Planned]) -> None:
        items = [
            _item(planned.sender, self.published + index) for index, planned in enumerate(batch)
        ]
        stamp: list[float] = []
        with transaction.atomic():
            transaction.on_commit(lambda: stamp.append(time.time()))
            results = accept_many(items)
        for planned, result in zip(batch, results, strict=True):
            self.accepted[result.event.id] = Accepted(
                planned.sender.group, planned.sender.tenant.key, planned.at, stamp[0]
            )
        self.published += len(batch)


def _item(sender: Sender, number: int) -> dict:
    """accept_many's keyword arguments for one event: a small order webhook."""
    body = {"type": "orders/create", "shop_id": sender.tenant.key, "order": {"id": number}}
    return {
        "source": sender.source,
        "tenant": sender.tenant,
        "event_type": "orders/create",
        "headers": {},
        "content_type": "application/json",
        "payload": json.dumps(body, separators=(",", ":")).encode(),
        "idempotency_key": None,
    }

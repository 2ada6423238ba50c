"""Writing what happened: Attempt rows and the Deliveries' new status, in one transaction.

A worker records the deliveries that finished while its previous write ran as one
group (a group commit): one INSERT for their Attempts (core.plain_insert), one
UPDATE for all that were delivered, a row-by-row UPDATE only for the rarer failures,
whose values differ.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

from core import operational, plain_insert
from core.operational import Announcement, endpoint_data
from delivery.models import Attempt, Delivery
from delivery.pipeline import endpoint_health
from delivery.pipeline.policy import Action, Decision
from delivery.pipeline.transport import HttpResult

_STATUS_FOR_ACTION = {
    Action.DELIVERED: Delivery.Status.DELIVERED,
    Action.RETRY: Delivery.Status.RETRY_SCHEDULED,
    Action.DEAD: Delivery.Status.DEAD,
    Action.DISABLE_ENDPOINT: Delivery.Status.HELD,
}
_OUTCOME_FOR_ACTION = {
    Action.DELIVERED: Attempt.Outcome.DELIVERED,
    Action.RETRY: Attempt.Outcome.RETRY,
    Action.DEAD: Attempt.Outcome.FAILED,
    Action.DISABLE_ENDPOINT: Attempt.Outcome.FAILED,
}


@dataclass(frozen=True)
class Sent:
    """One finished HTTP request for a delivery, and policy's verdict on it."""

    delivery: Delivery  # with its endpoint loaded
    result: HttpResult
    decision: Decision
    started_at: datetime
    request_headers: dict[str, str]


@dataclass(frozen=True)
class Recorded:
    status: str
    next_attempt_at: datetime | None
    endpoint_disabled: bool


def record_many(sent: Sequence[Sent], held: Sequence[Delivery] = ()) -> list[Recorded]:
    """Persist a group of attempts, and hold `held` (their endpoint is disabled), in one
    transaction; returns what became of each of `sent`, in order.

    Only an open delivery changes status, so a late duplicate (a lease that expired while
    its request was still running) cannot undo a success.
    """
    now = timezone.now()
    plans = [_plan(item.decision, now) for item in sent]
    delivered_ids = [
        item.delivery.pk
        for item, (status, _) in zip(sent, plans, strict=True)
        if status == Delivery.Status.DELIVERED
    ]
    # Built before the transaction: on SQLite it holds the one write lock.
    attempts = plain_insert.prepare_values(Attempt, [_attempt(item) for item in sent])
    dead: list[Announcement] = []
    with transaction.atomic():
        plain_insert.execute([attempts])
        if delivered_ids:
            _mark_delivered(delivered_ids, now)
        for item, (status, next_attempt_at) in zip(sent, plans, strict=True):
            if status != Delivery.Status.DELIVERED:
                changes = {
                    "status": status,
                    "attempts": F("attempts") + 1,
                    "last_error": _text(item.decision.reason[:500]),
                    "next_attempt_at": next_attempt_at,
                    "updated_at": now,
                }
                if status == Delivery.Status.RETRY_SCHEDULED:
                    changes["lane"] = Delivery.Lane.RETRY
                changed = _open([item.delivery.pk]).update(**changes)
                if changed and status == Delivery.Status.DEAD:
                    dead.extend(_dead_letter(item))
        if held:
            _open([delivery.pk for delivery in held]).update(
                status=Delivery.Status.HELD, updated_at=now
            )
        disabled = endpoint_health.record_outcomes(
            [(item.delivery.endpoint, item.decision) for item in sent], now
        )
        operational.announce(dead)  # published if this commits, with one write for all
    return [
        Recorded(status=status, next_attempt_at=next_attempt_at, endpoint_disabled=off)
        for (status, next_attempt_at), off in zip(plans, disabled, strict=True)
    ]


def _dead_letter(item: Sent) -> list[Announcement]:
    """delivery.dead, unless the delivery was itself an operational event's (to an
    endpoint that takes them): news of its death would go the same way."""
    delivery = item.delivery
    if delivery.endpoint.operational_events:
        return []
    data = {
        "delivery_id": delivery.pk,
        "event_id": delivery.event_id,
        # A delivery that failed to load is recorded bare (sending.failed_inside): no event.
        "event_type": delivery.event.event_type if Delivery.event.is_cached(delivery) else "",
        "endpoint": endpoint_data(delivery.endpoint),
        "attempts": delivery.attempts + 1,
        "last_error": item.decision.reason[:500],
    }
    return [Announcement(operational.DELIVERY_DEAD, delivery.tenant_id, data)]


def _plan(decision: Decision, now: datetime) -> tuple[str, datetime | None]:
    status = _STATUS_FOR_ACTION[decision.action]
    if status == Delivery.Status.RETRY_SCHEDULED:
        return status, now + timedelta(seconds=decision.delay_seconds)
    return status, None


def _attempt(item: Sent) -> dict[str, Any]:
    """The Attempt row for `item`, by field attname (plain_insert.prepare_values)."""
    result = item.result
    return {
        "delivery_id": item.delivery.pk,
        "endpoint_id": item.delivery.endpoint_id,
        "number": item.delivery.attempts + 1,
        "started_at": item.started_at,
        "duration_ms": result.duration_ms,
        "status_code": result.status_code,
        "outcome": _OUTCOME_FOR_ACTION[item.decision.action],
        "error": _text(result.error[:500]),
        "response_excerpt": _text(result.response_excerpt),
        "request_headers": {name: _text(value) for name, value in item.request_headers.items()},
    }


def _text(value: str) -> str:
    """`value` without NUL characters, which PostgreSQL's text and jsonb refuse (a whole
    group's transaction with them): a receiver may well answer with one."""
    return value.replace("\x00", "\ufffd") if "\x00" in value else value


# The fields _mark_delivered's UPDATE names.
_DELIVERED_COLUMNS = (
    "id",
    "status",
    "attempts",
    "last_error",
    "next_attempt_at",
    "delivered_at",
    "updated_at",
)


def _mark_delivered(ids: Sequence[str], now: datetime) -> None:
    """One UPDATE for all the group's delivered rows that are still open (see _open for
    the NOT IN). Plain SQL: the ORM compiles this statement anew for every group, at
    more CPU than the write."""
    quote = connection.ops.quote_name
    column = {name: quote(Delivery._meta.get_field(name).column) for name in _DELIVERED_COLUMNS}
    stamp = connection.ops.adapt_datetimefield_value(now)
    sql = (
        f"UPDATE {quote(Delivery._meta.db_table)} SET "  # noqa: S608 - quoted model metadata
        f"{column['status']} = %s, {column['attempts']} = {column['attempts']} + 1, "
        f"{column['last_error']} = '', {column['next_attempt_at']} = NULL, "
        f"{column['delivered_at']} = %s, {column['updated_at']} = %s "
        f"WHERE {column['id']} IN ({', '.join(['%s'] * len(ids))}) "
        f"AND {column['status']} NOT IN ({', '.join(['%s'] * len(Delivery.CLOSED_STATUSES))})"
    )
    with connection.cursor() as cursor:
        cursor.execute(
            sql, [Delivery.Status.DELIVERED, stamp, stamp, *ids, *Delivery.CLOSED_STATUSES]
        )


def _open(ids: Sequence[str]):
    """The rows of `ids` still open. Written as "status NOT IN closed" (the same rows: the
    two sets partition the statuses) because no index can answer a NOT IN: PostgreSQL
    then has only the primary key to find the rows by. With "status IN open" and table
    statistics older than a fast-growing backlog, it may combine the primary key with the
    status index and read the whole backlog's index entries for every group recorded."""
    return Delivery.objects.filter(pk__in=ids).exclude(status__in=Delivery.CLOSED_STATUSES)

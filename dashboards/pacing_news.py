"""tenant.paced and tenant.caught_up: operational events (core.operational) when a
tenant's status changes, judged once per maintenance sweep.

A tenant is *paced* when its status (dashboards.status, the one every surface shows)
says the fair scheduler holds it to its share of turns because others wait too; it has
*caught up* when, after that, nothing of its own is queued any more. Each is said once
per change: the tenants currently paced are a Redis set, and only a tenant entering or
leaving it is news. The platform's own lane for operational events is never news.
"""

import logging

from core import operational, redis_connection
from core.operational import Announcement
from dashboards import status
from dashboards.pacing import Status
from delivery.upkeep.maintenance import swept
from ingest.operational import OPERATIONAL_TENANT_KEY

logger = logging.getLogger(__name__)
PACED_KEY = redis_connection.KEY_PREFIX + "news:paced"


def announce_changes() -> list[Announcement]:
    """Compare the tenants' statuses with those last announced; announce and return
    what changed."""
    snapshot = status.take_snapshot()
    if snapshot is None:
        return []  # Redis is away: nothing is known to have changed
    connection = redis_connection.shared()
    known = {int(member) for member in connection.smembers(PACED_KEY)}
    news = _changes(_statuses(snapshot), known)
    paced = [a.tenant_id for a in news if a.event_type == operational.TENANT_PACED]
    caught_up = [a.tenant_id for a in news if a.event_type == operational.TENANT_CAUGHT_UP]
    if paced:
        connection.sadd(PACED_KEY, *paced)
    if caught_up:
        connection.srem(PACED_KEY, *caught_up)
    operational.announce(news)
    return news


def _statuses(snapshot) -> dict[int, status.TenantStatus]:
    """The backlogged tenants' statuses (the scheduler's top-N), but the platform's lane."""
    keys = [row.tenant_id for row in snapshot.tenants if row.tenant_id is not None]
    tenants = [
        tenant
        for tenant in status.tenants_of(keys)
        if tenant is not None and tenant.key != OPERATIONAL_TENANT_KEY
    ]
    return status.read(tenants, snapshot)


def _changes(read: dict[int, status.TenantStatus], known: set[int]) -> list[Announcement]:
    news = [
        _news(operational.TENANT_PACED, tenant_id, state)
        for tenant_id, state in read.items()
        if state.assessed.status == Status.PACED and tenant_id not in known
    ]
    for tenant_id in known:
        state = read.get(tenant_id)
        if state is None or state.facts.queued == 0:
            news.append(_news(operational.TENANT_CAUGHT_UP, tenant_id, state))
    return news


def _news(event_type: str, tenant_id: int, state: status.TenantStatus | None) -> Announcement:
    data: dict = {}
    if state is not None:
        data = {
            "status": state.code,
            "summary": state.assessed.label,
            "queued": state.facts.queued,
            "oldest_age_seconds": round(state.facts.oldest_age_seconds, 3),
            "share_of_turns": round(state.assessed.share_of_turns, 4),
            "other_tenants_waiting": state.assessed.other_backlogged,
        }
    return Announcement(event_type, tenant_id, data)


def _on_swept(sender: object, **kwargs: object) -> None:
    announce_changes()


swept.connect(_on_swept, dispatch_uid="dashboards.pacing_news")

"""Publishing operational events (core.operational) to the endpoints that subscribe.

They are events of one tenant of the platform's own (`OPERATIONAL_TENANT_KEY`, made on
first use), so they wait in a lane of their own in the fair scheduler: a burst of them
(an outage killing thousands of deliveries at once) takes that lane's turns and no
tenant's. Each is signed and sent as every delivery is (Standard Webhooks), with its type
in `webhook-event-type`.

Who receives one: endpoints without a tenant (the operator's) whose `operational_events`
names its type (or `*`), and, when it concerns a tenant, that tenant's own endpoints
that name it; never another tenant's. Announcements made in a transaction are published
after it commits, all of that transaction's in one write; a rolled-back change says
nothing.
"""

import json
import logging
from collections.abc import Sequence

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from core import operational
from core.operational import Announcement, announced
from ingest.accept import EventFields, accept_many
from tenants.models import Endpoint, Tenant

logger = logging.getLogger(__name__)
OPERATIONAL_TENANT_KEY = operational.TENANT_KEY


def operational_tenant() -> Tenant:
    tenant, _ = Tenant.objects.get_or_create(
        key=OPERATIONAL_TENANT_KEY,
        defaults={"name": "Operational events (the platform's own lane)"},
    )
    return tenant


def payload(announcement: Announcement, tenant_keys: dict[int, str]) -> bytes:
    body = {
        "type": announcement.event_type,
        "timestamp": timezone.now().isoformat(),
        "tenant": tenant_keys.get(announcement.tenant_id) if announcement.tenant_id else None,
        "data": announcement.data,
    }
    return json.dumps(body, separators=(",", ":"), default=str).encode()


def publish(announcements: Sequence[Announcement]) -> int:
    """Store and enqueue one event per announcement that has a subscriber; returns how
    many. One transaction for all (ingest.accept.accept_many)."""
    tenant_ids = {a.tenant_id for a in announcements if a.tenant_id is not None}
    subscribers = list(
        Endpoint.objects.exclude(operational_events="").filter(
            Q(tenant=None) | Q(tenant_id__in=tenant_ids)
        )
    )
    if not subscribers:
        return 0
    keys = dict(Tenant.objects.filter(pk__in=tenant_ids).values_list("pk", "key"))
    lane = operational_tenant()
    items: list[EventFields] = []
    for announcement in announcements:
        to = [
            endpoint
            for endpoint in subscribers
            if endpoint.receives_operational(announcement.event_type)
            and endpoint.tenant_id in (None, announcement.tenant_id)
        ]
        if not to:
            continue
        items.append(
            {
                "source": None,
                "tenant": lane,
                "event_type": announcement.event_type,
                "headers": {},
                "content_type": "application/json",
                "payload": payload(announcement, keys),
                "idempotency_key": None,
                "to": to,
            }
        )
    if items:
        accept_many(items)
    return len(items)


def _publish_after_commit(announcements: list[Announcement]) -> None:
    try:
        publish(announcements)
    except Exception:
        # What was announced happened and is recorded; only the news of it is lost.
        logger.exception("could not publish %d operational events", len(announcements))


def _on_announced(sender: object, announcements: list[Announcement], **kwargs: object) -> None:
    transaction.on_commit(lambda: _publish_after_commit(announcements))


announced.connect(_on_announced, dispatch_uid="ingest.operational")

"""Operational events: what the platform says about itself, to endpoints that subscribe.

Any layer announces them; ingest.operational publishes them as events of the platform's
own lane once the announcing transaction commits (nothing is said of a change that rolled
back). The lower layers cannot import ingest, hence a signal: they send, ingest listens.
docs/OPERATIONAL_EVENTS.md has the catalogue of types and payloads.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.dispatch import Signal

# The platform's own tenant, whose lane the operational events wait in (ingest.operational).
# Reserved: no provider's key or publisher may name it.
TENANT_KEY = "fairhooks.operational"

ENDPOINT_DISABLED = "endpoint.disabled"
ENDPOINT_FAILING = "endpoint.failing"
ENDPOINT_RECOVERED = "endpoint.recovered"
DELIVERY_DEAD = "delivery.dead"
SOURCE_KEY_UNBOUNDED = "source.key_unbounded"
REPLAY_FINISHED = "replay.finished"
TENANT_PACED = "tenant.paced"
TENANT_CAUGHT_UP = "tenant.caught_up"
TYPES = (
    ENDPOINT_DISABLED,
    ENDPOINT_FAILING,
    ENDPOINT_RECOVERED,
    DELIVERY_DEAD,
    SOURCE_KEY_UNBOUNDED,
    REPLAY_FINISHED,
    TENANT_PACED,
    TENANT_CAUGHT_UP,
)

# Sent with `announcements`: a list of Announcement.
announced = Signal()


@dataclass(frozen=True)
class Announcement:
    event_type: str
    # Whose it is: that tenant's endpoints may subscribe; None: the operator's alone.
    tenant_id: int | None
    data: dict[str, Any]


def announce(announcements: Sequence[Announcement]) -> None:
    if announcements:
        announced.send(sender=Announcement, announcements=list(announcements))


def announce_endpoint(event_type: str, endpoint: Any, data: dict[str, Any]) -> None:
    """News about one endpoint, with the endpoint in `data`; never about an endpoint that
    takes operational events itself (its own trouble would be news sent to itself)."""
    if endpoint.operational_events:
        return
    body = {"endpoint": endpoint_data(endpoint), **data}
    announce([Announcement(event_type, endpoint.tenant_id, body)])


def endpoint_data(endpoint: Any) -> dict[str, Any]:
    """An endpoint as the payloads show it: its URL without the query, which may hold the
    receiver's secret."""
    return {
        "id": endpoint.pk,
        "url": endpoint.url.split("?", 1)[0],
        "tenant_id": endpoint.tenant_id,
    }

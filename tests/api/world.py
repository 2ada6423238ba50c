"""What the isolation suite and the contract run share: the operations the OpenAPI
document lists, as the API serves it now (every route another module adds is in it), and
a tenant's world of rows for the calls to reach: endpoints and their secrets, events,
deliveries (one dead), attempts, a replay, a portal link and an audit entry."""

from dataclasses import dataclass
from datetime import timedelta
from functools import cache

from django.utils import timezone

from api.models import PortalLink
from delivery.models import Attempt, Delivery, ReplayJob
from delivery.replays.window import Window
from tenants import audit
from tenants.models import AuditEntry, Endpoint, EndpointSecret, Tenant
from tests.factories import make_endpoint, make_tenant
from webhooks.models import Event, EventType, hash_token

METHODS = ("get", "post", "put", "patch", "delete")
CATALOGUED_TYPE = "order.created"


@dataclass(frozen=True)
class Operation:
    """One operation of the OpenAPI document, with what a caller needs to call it."""

    id: str
    method: str
    path: str
    spec: dict

    @property
    def path_parameters(self) -> list[str]:
        return [p["name"] for p in self.spec.get("parameters", []) if p["in"] == "path"]

    @property
    def tenant_scoped(self) -> bool:
        return "{key}" in self.path

    @property
    def takes_body(self) -> bool:
        return "requestBody" in self.spec


@cache
def openapi_document() -> dict:
    """The document GET /api/v1/openapi.json serves, generated in this process."""
    from drf_spectacular.generators import SchemaGenerator

    return SchemaGenerator().get_schema(request=None, public=True)


def api_operations() -> list[Operation]:
    document = openapi_document()
    return [
        Operation(op["operationId"], method.upper(), path, op)
        for path, item in document["paths"].items()
        for method, op in item.items()
        if method in METHODS
    ]


@dataclass(frozen=True)
class World:
    """One tenant's rows, each of a kind some route names by id."""

    tenant: Tenant
    endpoint: Endpoint
    second_endpoint: Endpoint
    event: Event
    delivered: Delivery
    dead: Delivery
    pending: Delivery
    attempt: Attempt
    replay: ReplayJob
    link: PortalLink


def make_world(key: str) -> World:
    """A tenant with something of every kind, its endpoints on 127.0.0.1 (port 9: the
    discard port, nothing listens)."""
    tenant = make_tenant(key, name=f"{key} name")
    endpoint = make_endpoint(tenant, url=f"http://127.0.0.1:9/{key}", description=key)
    second = make_endpoint(tenant, url=f"http://127.0.0.1:9/{key}/second")
    EndpointSecret.objects.create(endpoint=endpoint)
    events = [
        Event.objects.create(tenant=tenant, event_type=f"order.{n}", payload=b'{"n": 1}')
        for n in ("created", "paid", "shipped")
    ]
    delivered = Delivery.objects.create(
        event=events[0],
        endpoint=endpoint,
        tenant=tenant,
        status=Delivery.Status.DELIVERED,
        attempts=1,
        delivered_at=timezone.now(),
    )
    dead = Delivery.objects.create(
        event=events[1],
        endpoint=endpoint,
        tenant=tenant,
        status=Delivery.Status.DEAD,
        attempts=3,
        last_error="HTTP 500",
    )
    pending = Delivery.objects.create(event=events[2], endpoint=second, tenant=tenant)
    Attempt.objects.create(
        delivery=delivered, endpoint=endpoint, number=1, outcome=Attempt.Outcome.DELIVERED
    )
    attempt = None
    for number in (1, 2, 3):
        attempt = Attempt.objects.create(
            delivery=dead,
            endpoint=endpoint,
            number=number,
            status_code=500,
            outcome=Attempt.Outcome.FAILED if number == 3 else Attempt.Outcome.RETRY,
            error="HTTP 500",
        )
    now = timezone.now()
    window = Window(start=now - timedelta(days=1), end=now, endpoint_id=endpoint.pk)
    replay = ReplayJob.objects.create(
        tenant=tenant, filters=window.to_json(), created_by_name="fixture", matched=1
    )
    link = PortalLink.objects.create(
        tenant=tenant,
        role="viewer",
        visitor=f"visitor@{key}",
        token_hash=hash_token(f"link-{key}"),
        expires_at=now + timedelta(hours=1),
    )
    audit.record(
        actor=None,
        action=AuditEntry.Action.ENDPOINT_CREATED,
        via=AuditEntry.Via.API,
        tenant=tenant,
        target=f"endpoint {endpoint.pk}",
    )
    return World(
        tenant, endpoint, second, events[1], delivered, dead, pending, attempt, replay, link
    )


def make_catalogue() -> EventType:
    """The platform's event type catalogue: one type, which every tenant may read."""
    return EventType.objects.create(name=CATALOGUED_TYPE, description="An order was placed.")

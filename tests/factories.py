"""Small builders for test data: each returns a saved object with safe defaults."""

from datetime import timedelta

from django.contrib.auth.models import User
from django.utils import timezone

from core.ids import new_ulid
from delivery.models import Delivery
from tenants.models import Endpoint, Membership, Tenant
from webhooks.models import Event, Source, SourceSecret


def make_tenant(key: str = "shop-a.example", **fields) -> Tenant:
    return Tenant.objects.create(key=key, name=fields.pop("name", key), **fields)


def make_endpoint(
    tenant: Tenant | None, url: str = "http://127.0.0.1:9/hook", **fields
) -> Endpoint:
    return Endpoint.objects.create(tenant=tenant, url=url, **fields)


def make_source(slug: str = "shop", secret: str = "s3cret", **fields) -> Source:
    fields.setdefault("scheme", Source.HMAC_SHA256)
    fields.setdefault("fairness_key", "body.shop_id")
    source = Source.objects.create(slug=slug, **fields)
    if secret:
        SourceSecret.objects.create(source=source, secret=secret)
    return source


def make_user(
    username: str,
    *,
    tenant: Tenant | None = None,
    staff: bool = False,
    role: str = Membership.VIEWER,
) -> User:
    """A user (password "pw-<username>"), a member of `tenant` with `role` if given."""
    user = User.objects.create_user(username, password="pw-" + username, is_staff=staff)
    if tenant is not None:
        Membership.objects.create(user=user, tenant=tenant, role=role)
    return user


def make_backlog(count: int) -> list[Delivery]:
    """`count` pending deliveries to one endpoint, inserted in bulk the way a flood
    arrives: no ANALYZE has seen them."""
    tenant = make_tenant()
    endpoint = make_endpoint(tenant)
    events = Event.objects.bulk_create(
        [Event(tenant=tenant, event_type="order.created", payload=b"{}") for _ in range(count)]
    )
    return Delivery.objects.bulk_create(
        [Delivery(event=event, endpoint=endpoint, tenant=tenant) for event in events]
    )


def published_fields(tenant: Tenant, key: str | None) -> dict:
    """accept()'s keyword arguments for an event published by `tenant` (no source)."""
    return {
        "source": None,
        "tenant": tenant,
        "event_type": "order.created",
        "headers": {},
        "content_type": "application/json",
        "payload": b"{}",
        "idempotency_key": key,
    }


def event_days_ago(tenant: Tenant, key: str, days: int) -> Event:
    """A published event stored `days` ago: its id carries that time, so on PostgreSQL it
    lies in that day's partition (or the one holding that day's ids)."""
    made = timezone.now() - timedelta(days=days)
    return Event.objects.create(
        id=new_ulid(int(made.timestamp() * 1000)),
        tenant=tenant,
        payload=b"{}",
        idempotency_key=key,
        received_at=made,
    )

"""Model rules the rest of the platform relies on."""

import pytest
from django.db import IntegrityError, transaction

from core.ids import new_ulid, ulid_time_ms
from delivery.models import Delivery
from tenants.models import EndpointSecret, Membership, mask_secret
from tests.factories import make_endpoint, make_source, make_tenant, make_user
from webhooks.models import ApiToken, Event, hash_token

pytestmark = pytest.mark.django_db


def test_tenant_key_is_unique() -> None:
    make_tenant("shop.example")
    with pytest.raises(IntegrityError), transaction.atomic():
        make_tenant("shop.example")


def test_one_membership_per_user_and_tenant() -> None:
    tenant = make_tenant()
    user = make_user("ann", tenant=tenant)
    with pytest.raises(IntegrityError), transaction.atomic():
        Membership.objects.create(user=user, tenant=tenant, role=Membership.ADMIN)


def test_idempotency_key_is_unique_per_source_only() -> None:
    first, second = make_source("one"), make_source("two")
    Event.objects.create(source=first, payload=b"{}", idempotency_key="evt-1")
    Event.objects.create(source=second, payload=b"{}", idempotency_key="evt-1")
    Event.objects.create(source=first, payload=b"{}", idempotency_key=None)
    Event.objects.create(source=first, payload=b"{}", idempotency_key=None)
    with pytest.raises(IntegrityError), transaction.atomic():
        Event.objects.create(source=first, payload=b"{}", idempotency_key="evt-1")


def test_published_event_idempotency_is_per_tenant() -> None:
    tenant, other = make_tenant("a"), make_tenant("b")
    Event.objects.create(tenant=tenant, payload=b"{}", idempotency_key="k")
    Event.objects.create(tenant=other, payload=b"{}", idempotency_key="k")
    with pytest.raises(IntegrityError), transaction.atomic():
        Event.objects.create(tenant=tenant, payload=b"{}", idempotency_key="k")


def test_ids_are_time_ordered_ulids() -> None:
    earlier, later = new_ulid(now_ms=1_700_000_000_000), new_ulid(now_ms=1_700_000_000_001)
    assert len(earlier) == 26 and earlier < later
    assert ulid_time_ms(earlier) == 1_700_000_000_000
    event = Event.objects.create(payload=b"{}")
    delivery = Delivery.objects.create(event=event, endpoint=make_endpoint(None))
    assert len(event.id) == 26 and len(delivery.id) == 26


def test_endpoint_event_type_filter() -> None:
    endpoint = make_endpoint(make_tenant(), event_types="orders/create,\norders/paid")
    assert endpoint.accepts("orders/paid")
    assert not endpoint.accepts("products/update")
    assert make_endpoint(None).accepts("anything")


def test_endpoint_secret_defaults_to_a_standard_webhooks_secret_and_masks() -> None:
    secret = EndpointSecret.objects.create(endpoint=make_endpoint(None))
    assert secret.secret.startswith("whsec_")
    masked = mask_secret(secret.secret)
    assert secret.secret not in masked and secret.secret[6:] not in masked
    assert str(secret) == masked


def test_api_token_stores_only_a_hash() -> None:
    token, plain = ApiToken.issue("ci")
    assert token.token_hash == hash_token(plain)
    assert plain not in (token.prefix, token.token_hash)


def test_open_and_closed_statuses_partition_the_choices() -> None:
    """Recording finds open rows as "not closed" (delivery/pipeline/records.py): that is only the
    same set while every status is in exactly one of the two."""
    every = {value for value, _ in Delivery.Status.choices}
    assert set(Delivery.OPEN_STATUSES) | set(Delivery.CLOSED_STATUSES) == every
    assert not set(Delivery.OPEN_STATUSES) & set(Delivery.CLOSED_STATUSES)

"""Endpoint.enable: tenants re-enables an endpoint and lets the apps above resume its held
work through a signal, without importing them (tenants sits at the bottom of the layers)."""

import pytest
from django.utils import timezone

from delivery.models import Delivery
from ingest.publish import publish
from tenants.models import Endpoint
from tenants.signals import endpoint_enabled
from tests.factories import make_endpoint, make_tenant

pytestmark = pytest.mark.django_db(transaction=True)


def test_enable_clears_the_failure_state_and_counts_what_receivers_resumed() -> None:
    tenant = make_tenant("acme")
    endpoint = make_endpoint(
        tenant,
        enabled=False,
        disabled_reason="Disabled: HTTP 410",
        disabled_at=timezone.now(),
        consecutive_failures=7,
        failing_since=timezone.now(),
    )
    heard: list[int] = []

    def another_app(sender, endpoint: Endpoint, **kwargs) -> int:
        heard.append(endpoint.pk)
        return 3

    endpoint_enabled.connect(another_app)
    try:
        resumed = endpoint.enable()
    finally:
        endpoint_enabled.disconnect(another_app)
    assert heard == [endpoint.pk]
    assert resumed == 3  # delivery's receiver resumed nothing (nothing was held), ours 3
    fresh = Endpoint.objects.get(pk=endpoint.pk)
    assert (fresh.enabled, fresh.disabled_reason, fresh.disabled_at) == (True, "", None)
    assert (fresh.consecutive_failures, fresh.failing_since) == (0, None)


def test_held_deliveries_resume_in_their_lane_through_deliverys_receiver() -> None:
    tenant = make_tenant("acme")
    endpoint = make_endpoint(tenant, enabled=False)
    for i in range(2):
        publish(tenant, "orders/create", {"i": i})
    assert set(Delivery.objects.values_list("status", flat=True)) == {Delivery.Status.HELD}
    assert endpoint.enable() == 2
    assert set(Delivery.objects.values_list("status", flat=True)) == {Delivery.Status.PENDING}

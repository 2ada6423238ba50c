"""The decisions a worker makes about a picked delivery before any request, without its
threads: sending.triage (send, hold, skip or fail at signing), sending.secrets_for (an
endpoint whose secrets cannot be read fails alone) and sending.disables_endpoint."""

import pytest
from django.utils import timezone

from delivery.models import Delivery
from delivery.pipeline import sending
from delivery.pipeline.loading import load_many
from delivery.pipeline.transport import HttpResult
from delivery.scheduler import Lease
from ingest.publish import publish_to_endpoint
from tests.factories import make_endpoint, make_tenant

pytestmark = pytest.mark.django_db


def leased(endpoint) -> tuple[Lease, Delivery]:
    """A delivery to `endpoint`, loaded as the worker loads a pick's rows."""
    publish_to_endpoint(endpoint, "order.created", {"n": 1})
    row = Delivery.objects.filter(endpoint=endpoint).latest("pk")
    lease = Lease(row.pk, endpoint.tenant_id, endpoint.pk, "fresh", deadline=0.0)
    return lease, load_many([row.pk])[row.pk]


def test_an_open_delivery_with_its_secrets_is_sent():
    lease, delivery = leased(make_endpoint(make_tenant("acme")))

    assert sending.triage(lease, delivery, ["whsec_x"]) is None


def test_a_delivery_finished_elsewhere_or_deleted_is_skipped_without_an_attempt():
    lease, delivery = leased(make_endpoint(make_tenant("acme")))
    delivery.status = Delivery.Status.DELIVERED

    for gone in (delivery, None):
        done = sending.triage(lease, gone, ["whsec_x"])
        assert done == sending.Finished(lease)


def test_a_disabled_endpoints_delivery_is_held():
    endpoint = make_endpoint(make_tenant("acme"))
    lease, delivery = leased(endpoint)
    delivery.endpoint.enabled = False

    done = sending.triage(lease, delivery, ["whsec_x"])

    assert done is not None and done.held is delivery and done.sent is None


def test_an_endpoint_that_answered_410_is_held_until_its_disable_is_recorded():
    endpoint = make_endpoint(make_tenant("acme"))
    lease, delivery = leased(endpoint)

    done = sending.triage(lease, delivery, ["whsec_x"], disabling={endpoint.pk})

    assert done is not None and done.held is delivery
    assert sending.triage(lease, delivery, ["whsec_x"], disabling={endpoint.pk + 1}) is None


def test_secrets_that_could_not_be_read_are_that_deliverys_failed_attempt():
    lease, delivery = leased(make_endpoint(make_tenant("acme")))

    done = sending.triage(lease, delivery, RuntimeError("vault sealed"))

    assert done is not None and done.sent is not None
    assert done.sent.result.error_kind == "internal"
    assert "sign failed inside the worker: RuntimeError: vault sealed" in done.sent.result.error


def test_an_endpoint_whose_secrets_fail_to_read_fails_alone(monkeypatch):
    tenant = make_tenant("acme")
    broken, fine = make_endpoint(tenant), make_endpoint(tenant)
    deliveries = [leased(broken)[1], leased(fine)[1]]
    cache = sending.SecretCache()
    real_active = cache.active

    def active(endpoint_ids):
        if broken.pk in set(endpoint_ids):
            raise ValueError("undecodable secret")
        return real_active(endpoint_ids)

    monkeypatch.setattr(cache, "active", active)

    found = sending.secrets_for(cache, deliveries)

    assert isinstance(found[broken.pk], ValueError)
    assert found[fine.pk] == [secret.secret for secret in fine.secrets.all()]


def test_only_a_410_answer_disables_its_endpoint():
    lease, delivery = leased(make_endpoint(make_tenant("acme")))

    def answered(status: int) -> sending.Finished:
        result = HttpResult(status, 5, "", "", "", None)
        return sending.judged(lease, delivery, result, timezone.now(), {})

    assert sending.disables_endpoint(answered(410))
    assert not any(sending.disables_endpoint(answered(s)) for s in (200, 404, 500, 503))
    assert not sending.disables_endpoint(sending.Finished(lease, held=delivery))

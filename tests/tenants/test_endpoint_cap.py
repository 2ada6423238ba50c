"""An endpoint's cap is its own or, left empty, the platform's: fixed where limits are
fixed, the adaptive limit's ceiling where they adapt."""

import pytest
from django.urls import reverse

from tenants.models import Endpoint
from tests.factories import make_endpoint, make_tenant
from tests.tenants.test_endpoint_signing import ENDPOINT_FORM, secret_rows

pytestmark = pytest.mark.django_db


@pytest.fixture
def platform(settings):
    settings.DELIVERY_MAX_IN_FLIGHT, settings.DELIVERY_ADAPTIVE_CEILING = 3, 48
    settings.DELIVERY_ADAPTIVE_CONCURRENCY = "off"
    return settings


def test_the_cap_that_applies_is_its_own_or_the_platforms(platform) -> None:
    own = Endpoint(max_in_flight=20)
    none = Endpoint()
    assert none.max_in_flight is None
    assert (own.in_flight_cap, none.in_flight_cap) == (20, 3)
    assert not own.adapts_concurrency and not none.adapts_concurrency
    platform.DELIVERY_ADAPTIVE_CONCURRENCY = "all"
    assert (own.in_flight_cap, none.in_flight_cap) == (20, 48)
    assert own.adapts_concurrency and none.adapts_concurrency
    # A fixed cap does not adapt, so the platform's fixed cap is the one it gets.
    assert Endpoint(fixed_max_in_flight=True).in_flight_cap == 3
    assert not Endpoint(fixed_max_in_flight=True).adapts_concurrency


def test_by_default_only_an_endpoint_without_a_cap_of_its_own_adapts(platform) -> None:
    platform.DELIVERY_ADAPTIVE_CONCURRENCY = "uncapped"
    own, none = Endpoint(max_in_flight=20), Endpoint()
    # A cap someone typed is their statement of the receiver's capacity: kept, fixed.
    assert (own.in_flight_cap, own.adapts_concurrency) == (20, False)
    # Nobody stated this one's: its limit finds its pace under the ceiling.
    assert (none.in_flight_cap, none.adapts_concurrency) == (48, True)
    fixed = Endpoint(fixed_max_in_flight=True)
    assert (fixed.in_flight_cap, fixed.adapts_concurrency) == (3, False)


def test_the_admin_leaves_the_cap_empty_and_lists_the_platforms(platform, staff_client) -> None:
    platform.ALLOW_PRIVATE_DESTINATIONS = True  # the endpoint points at 127.0.0.1
    form = {**ENDPOINT_FORM, "max_in_flight": "", **secret_rows()}
    staff_client.post(reverse("admin:tenants_endpoint_add"), form)
    assert Endpoint.objects.get().max_in_flight is None
    listing = staff_client.get(reverse("admin:tenants_endpoint_changelist")).content.decode()
    assert "3 (platform)" in listing
    platform.DELIVERY_ADAPTIVE_CONCURRENCY = "uncapped"
    listing = staff_client.get(reverse("admin:tenants_endpoint_changelist")).content.decode()
    assert "48 (platform, adapts)" in listing  # a ceiling, the limit under it moves


def test_the_admin_refuses_a_retry_cap_over_the_platforms_cap(platform, staff_client) -> None:
    platform.ALLOW_PRIVATE_DESTINATIONS = True
    endpoint = make_endpoint(make_tenant("acme"))
    [secret] = endpoint.secrets.all()
    form = {
        **ENDPOINT_FORM,
        "max_in_flight": "",
        "retry_max_in_flight": 4,
        **secret_rows({"id": secret.pk, "endpoint": endpoint.pk}, initial=1),
    }
    page = staff_client.post(reverse("admin:tenants_endpoint_change", args=[endpoint.pk]), form)
    assert page.status_code == 200  # the form again, with its error
    assert "Cannot exceed the endpoint&#x27;s cap (3)." in page.content.decode()
    assert Endpoint.objects.get().retry_max_in_flight == 1

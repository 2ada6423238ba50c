"""Every sign-in is throttled (django-axes): after LOGIN_FAILURE_LIMIT failures for a
username, or from one address, signing in is refused for LOGIN_LOCKOUT_MINUTES, even
with the right password; the pause ends by itself, a success clears the count, and
operators see the attempts in the admin. Portal links' landing counts bad links by
address (PORTAL_LINK_FAILURE_LIMIT), and past it refuses even a good link."""

from datetime import timedelta
from urllib.parse import urlsplit

import pytest
from axes.models import AccessAttempt
from django.test import Client

from tests.api.helpers import Api, tenant_token
from tests.factories import make_tenant, make_user

pytestmark = pytest.mark.django_db

FORMS = ["/admin/login/", "/accounts/login/"]
LIMIT = 5
LINK_LIMIT = 8


@pytest.fixture(autouse=True)
def limits(settings):
    settings.LOGIN_FAILURE_LIMIT = LIMIT
    settings.PORTAL_LINK_FAILURE_LIMIT = LINK_LIMIT
    settings.AXES_COOLOFF_TIME = timedelta(minutes=15)


def sign_in(form: str, username: str, password: str, address: str = "127.0.0.1"):
    client = Client(REMOTE_ADDR=address)
    answer = client.post(form, {"username": username, "password": password})
    return answer, client


def signed_in(client: Client) -> bool:
    return "_auth_user_id" in client.session


@pytest.fixture
def people():
    tenant = make_tenant("acme")
    return {
        "/admin/login/": make_user("ops", staff=True),
        "/accounts/login/": make_user("jane", tenant=tenant),
    }


@pytest.mark.parametrize("form", FORMS)
def test_after_the_limit_even_the_right_password_is_refused(form, people) -> None:
    user = people[form]
    for _ in range(LIMIT - 1):
        answer, _ = sign_in(form, user.username, "wrong")
        assert answer.status_code == 200  # the form again, with its error
    assert sign_in(form, user.username, "wrong")[0].status_code == 429  # the last one allowed
    answer, client = sign_in(form, user.username, "pw-" + user.username)
    assert answer.status_code == 429
    assert "Too many sign-in attempts" in answer.content.decode()
    assert "15 minutes" in answer.content.decode()
    assert answer["Retry-After"] == "900"
    assert not signed_in(client)


@pytest.mark.parametrize("form", FORMS)
def test_one_address_guessing_many_usernames_is_stopped_too(form, people) -> None:
    for n in range(LIMIT):
        sign_in(form, f"guess-{n}", "wrong", address="203.0.113.7")
    user = people[form]
    answer, _ = sign_in(form, user.username, "pw-" + user.username, address="203.0.113.7")
    assert answer.status_code == 429
    # The same person from elsewhere is not held by that address's guesses.
    answer, client = sign_in(form, user.username, "pw-" + user.username, address="198.51.100.1")
    assert answer.status_code == 302 and signed_in(client)


def test_the_pause_ends_by_itself(people) -> None:
    form, user = "/accounts/login/", people["/accounts/login/"]
    for _ in range(LIMIT):
        sign_in(form, user.username, "wrong")
    assert sign_in(form, user.username, "pw-jane")[0].status_code == 429
    # Fifteen minutes and a second later, as the clock would have it.
    AccessAttempt.objects.update(
        attempt_time=AccessAttempt.objects.get().attempt_time - timedelta(minutes=15, seconds=1)
    )
    answer, client = sign_in(form, user.username, "pw-jane")
    assert answer.status_code == 302 and signed_in(client)


def test_a_success_clears_the_count(people) -> None:
    form, user = "/accounts/login/", people["/accounts/login/"]
    for _ in range(LIMIT - 1):
        sign_in(form, user.username, "wrong")
    assert sign_in(form, user.username, "pw-jane")[0].status_code == 302
    for _ in range(LIMIT - 1):
        sign_in(form, user.username, "wrong")
    assert sign_in(form, user.username, "pw-jane")[0].status_code == 302


def test_operators_see_the_attempts(people, staff_client) -> None:
    for _ in range(2):
        sign_in("/accounts/login/", "jane", "wrong", address="203.0.113.9")
    page = staff_client.get("/admin/axes/accessattempt/")
    assert page.status_code == 200
    assert "jane" in page.content.decode() and "203.0.113.9" in page.content.decode()
    failures = staff_client.get("/admin/axes/accessfailurelog/")
    assert failures.status_code == 200 and "jane" in failures.content.decode()


def portal_link(tenant) -> str:
    answer = Api(tenant_token(tenant)).post(f"/api/v1/tenants/{tenant.key}/portal-links", {})
    assert answer.status_code == 201, answer.json()
    return urlsplit(answer.json()["url"]).path


def test_bad_portal_links_from_one_address_pause_its_landing() -> None:
    tenant = make_tenant("acme")
    guesser = Client(REMOTE_ADDR="203.0.113.7")
    for attempt in range(LINK_LIMIT - 1):
        assert guesser.get(f"/portal/enter/guess-{attempt}").status_code == 403
    assert guesser.get("/portal/enter/guess-last").status_code == 429
    # Now even a good link is refused from there (and stays unused)...
    good = portal_link(tenant)
    answer = guesser.get(good)
    assert answer.status_code == 429 and "Too many sign-in attempts" in answer.content.decode()
    assert not signed_in(guesser)
    # ...while another address is not held up by it.
    visitor = Client(REMOTE_ADDR="198.51.100.2")
    assert visitor.get(good).status_code == 303 and signed_in(visitor)
    assert AccessAttempt.objects.get(ip_address="203.0.113.7").failures_since_start == LINK_LIMIT


def test_a_few_stale_links_do_not_pause_a_visitor() -> None:
    tenant = make_tenant("acme")
    visitor = Client(REMOTE_ADDR="198.51.100.3")
    used = portal_link(tenant)
    assert visitor.get(used).status_code == 303
    for _ in range(LIMIT):  # more than a password allows, fewer than LINK_LIMIT
        assert visitor.get(used).status_code == 403
    assert visitor.get(portal_link(tenant)).status_code == 303

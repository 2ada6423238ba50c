"""Every password form is throttled (django-axes): after LOGIN_FAILURE_LIMIT failures for
a username, or from one address, signing in is refused for LOGIN_LOCKOUT_MINUTES, even
with the right password; the pause ends by itself, a success clears the count, and
operators see the attempts in the admin."""

from datetime import timedelta

import pytest
from axes.models import AccessAttempt
from django.test import Client

from tests.factories import make_tenant, make_user

pytestmark = pytest.mark.django_db

FORMS = ["/admin/login/", "/accounts/login/"]
LIMIT = 5


@pytest.fixture(autouse=True)
def limits(settings):
    settings.AXES_FAILURE_LIMIT = LIMIT
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

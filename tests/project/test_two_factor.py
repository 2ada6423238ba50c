"""Operators' second factor (project/two_factor/): with ADMIN_REQUIRE_2FA on, staff signed
in by password reach nothing until they type a code; the first sign-in enrols an
authenticator and hands out recovery codes once; wrong codes are throttled; tenants'
own users are never asked."""

import os
import re
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client
from django.utils import timezone
from django_otp.oath import TOTP
from django_otp.plugins.otp_static.models import StaticToken
from django_otp.plugins.otp_totp.models import TOTPDevice

from project.two_factor import devices
from tenants.models import Membership
from tests.factories import make_tenant, make_user

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]
PASSWORD = "a-long-operator-password-1"


@pytest.fixture
def required(settings) -> None:
    settings.ADMIN_REQUIRE_2FA = True


@pytest.fixture
def operator() -> User:
    return User.objects.create_superuser("op", "op@example.com", PASSWORD)


def code_for(device: TOTPDevice, steps_ahead: int = 0) -> str:
    """What the operator's authenticator app shows now (or a step later)."""
    totp = TOTP(device.bin_key, device.step, device.t0, device.digits, device.drift)
    totp.time = time.time() + steps_ahead * device.step
    return f"{totp.token():0{device.digits}d}"


def signed_in_by_password() -> Client:
    client = Client()
    answer = client.post("/admin/login/", {"username": "op", "password": PASSWORD})
    assert answer.status_code == 302, answer.content[:500]
    return client


def enrolled(operator: User) -> tuple[TOTPDevice, list[str]]:
    device = TOTPDevice.objects.create(user=operator, name="authenticator", confirmed=True)
    return device, devices.new_recovery_codes(operator)


def test_on_by_default_outside_debug_and_off_in_debug() -> None:
    script = "from django.conf import settings; print(settings.ADMIN_REQUIRE_2FA)"
    seen = {}
    for debug in ("false", "true"):
        env = {**os.environ, "DEBUG": debug, "DJANGO_SETTINGS_MODULE": "project.settings"}
        env.pop("ADMIN_REQUIRE_2FA", None)
        result = subprocess.run(
            [sys.executable, "-c", "import django; django.setup(); " + script],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        seen[debug] = result.stdout.strip()
    assert seen == {"false": "True", "true": "False"}


@pytest.mark.usefixtures("required")
def test_a_password_alone_opens_nothing(operator: User) -> None:
    tenant = make_tenant()
    client = signed_in_by_password()
    for path in (
        "/admin/",
        "/admin/overview/",
        "/admin/tenants/tenant/",
        "/admin/django-rq/",
        f"/t/{tenant.key}/",
        "/admin/2fa/recovery-codes/",
    ):
        answer = client.get(path)
        assert answer.status_code == 302, path
        assert answer["Location"].startswith("/admin/2fa/"), (path, answer["Location"])
    # Nor does a write: the change is never made.
    answer = client.post(
        f"/admin/tenants/tenant/{tenant.pk}/change/", {"key": tenant.key, "name": "Renamed"}
    )
    assert answer.status_code == 302 and answer["Location"].startswith("/admin/2fa/")
    tenant.refresh_from_db()
    assert tenant.name != "Renamed"


@pytest.mark.usefixtures("required")
def test_first_sign_in_enrols_then_hands_out_recovery_codes_once(operator: User) -> None:
    client = signed_in_by_password()
    answer = client.get("/admin/", follow=True)
    assert answer.redirect_chain[-1][0].startswith("/admin/2fa/enrol/")
    page = answer.content.decode()
    assert "<svg" in page and "otpauth" not in page  # the QR code, not the URL in clear
    device = TOTPDevice.objects.get(user=operator, confirmed=False)
    secret_shown = re.search(r'class="otp-secret">([A-Z2-7 ]+)<', page).group(1)
    assert secret_shown.replace(" ", "")  # the key, for typing in by hand

    # A reload keeps the same secret: the QR code already scanned stays good.
    client.get("/admin/2fa/enrol/")
    assert TOTPDevice.objects.filter(user=operator).count() == 1

    wrong = client.post("/admin/2fa/enrol/", {"code": "000000", "next": "/admin/overview/"})
    assert wrong.status_code == 400
    assert "not right" in wrong.content.decode()
    assert client.get("/admin/").status_code == 302

    device.refresh_from_db()
    device.throttling_failure_timestamp = None  # the throttle is tested on its own below
    device.throttling_failure_count = 0
    device.save()
    done = client.post("/admin/2fa/enrol/", {"code": code_for(device), "next": "/admin/overview/"})
    assert done.status_code == 200
    codes = re.findall(r"<li>(\w+)</li>", done.content.decode())
    assert len(codes) == devices.RECOVERY_CODE_COUNT
    assert sorted(codes) == sorted(StaticToken.objects.values_list("token", flat=True))
    assert 'href="/admin/overview/"' in done.content.decode()
    assert client.get("/admin/").status_code == 200
    # Enrolment is over: the page cannot be used to swap the authenticator.
    again = client.get("/admin/2fa/enrol/")
    assert again.status_code == 302
    assert TOTPDevice.objects.get(user=operator).confirmed


@pytest.mark.usefixtures("required")
def test_later_sign_ins_ask_for_a_code_and_a_used_code_is_spent(operator: User) -> None:
    device, _ = enrolled(operator)
    client = signed_in_by_password()
    answer = client.get("/admin/overview/")
    assert answer["Location"] == "/admin/2fa/?next=%2Fadmin%2Foverview%2F"
    code = code_for(device)
    answer = client.post("/admin/2fa/", {"code": code, "next": "/admin/overview/"})
    assert answer.status_code == 302 and answer["Location"] == "/admin/overview/"
    assert client.get("/admin/overview/").status_code == 200

    # Someone who saw that code over the shoulder cannot use it for a second session.
    other = signed_in_by_password()
    replayed = other.post("/admin/2fa/", {"code": code})
    assert replayed.status_code == 400
    assert other.get("/admin/").status_code == 302


@pytest.mark.usefixtures("required")
def test_a_recovery_code_works_once_and_says_how_many_are_left(operator: User) -> None:
    _, codes = enrolled(operator)
    client = signed_in_by_password()
    answer = client.post("/admin/2fa/", {"code": codes[0]}, follow=True)
    assert answer.status_code == 200
    assert f"{devices.RECOVERY_CODE_COUNT - 1} left" in answer.content.decode()

    other = signed_in_by_password()
    assert other.post("/admin/2fa/", {"code": codes[0]}).status_code == 400
    assert other.get("/admin/").status_code == 302


@pytest.mark.usefixtures("required")
def test_new_recovery_codes_replace_the_old_ones(operator: User) -> None:
    device, old = enrolled(operator)
    client = signed_in_by_password()
    client.post("/admin/2fa/", {"code": code_for(device)})
    assert "10</strong> unused" in client.get("/admin/2fa/recovery-codes/").content.decode()
    answer = client.post("/admin/2fa/recovery-codes/")
    new = re.findall(r"<li>(\w+)</li>", answer.content.decode())
    assert len(new) == devices.RECOVERY_CODE_COUNT and not set(new) & set(old)
    assert signed_in_by_password().post("/admin/2fa/", {"code": old[1]}).status_code == 400


@pytest.mark.usefixtures("required")
def test_wrong_codes_are_throttled_even_before_the_right_one(operator: User) -> None:
    device, _ = enrolled(operator)
    client = signed_in_by_password()
    for _ in range(3):
        assert client.post("/admin/2fa/", {"code": "123456"}).status_code == 400
    refused = client.post("/admin/2fa/", {"code": code_for(device)})
    assert refused.status_code == 400
    assert "Wait" in refused.content.decode() and "doubles" in refused.content.decode()
    assert client.get("/admin/").status_code == 302

    device.refresh_from_db()
    device.throttling_failure_timestamp = timezone.now() - timedelta(hours=1)
    device.save()
    answer = client.post("/admin/2fa/", {"code": code_for(device)})
    assert answer.status_code == 302
    assert client.get("/admin/").status_code == 200


@pytest.mark.usefixtures("required")
def test_next_never_leaves_the_site(operator: User) -> None:
    device, _ = enrolled(operator)
    client = signed_in_by_password()
    answer = client.post("/admin/2fa/", {"code": code_for(device), "next": "https://evil.example/"})
    assert answer["Location"] == "/admin/"


@pytest.mark.usefixtures("required")
def test_tenant_users_and_api_tokens_are_not_asked(operator: User) -> None:
    tenant = make_tenant()
    make_user("viewer", tenant=tenant, role=Membership.VIEWER)
    client = Client()
    client.post("/accounts/login/", {"username": "viewer", "password": "pw-viewer"})
    assert client.get(f"/t/{tenant.key}/").status_code == 200

    from webhooks.models import ApiToken

    # Nor can they set one up: the pages are for staff.
    assert client.get("/admin/2fa/enrol/")["Location"].startswith("/admin/login/")
    assert not TOTPDevice.objects.exists()

    _, token = ApiToken.issue("ops", access=ApiToken.Access.WRITE)
    staff = signed_in_by_password()  # a session cookie besides the token changes nothing
    answer = staff.get("/api/v1/tenants", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert answer.status_code == 200


def test_an_operator_who_enrolled_is_asked_even_when_not_required(operator: User) -> None:
    device, _ = enrolled(operator)
    client = signed_in_by_password()
    assert client.get("/admin/")["Location"].startswith("/admin/2fa/")
    client.post("/admin/2fa/", {"code": code_for(device)})
    assert client.get("/admin/").status_code == 200


@pytest.mark.usefixtures("required")
def test_reset_2fa_lets_a_locked_out_operator_enrol_again(operator: User, capsys) -> None:
    enrolled(operator)
    call_command("reset_2fa", "op")
    assert "Removed 2 second-factor devices of op" in capsys.readouterr().out
    client = signed_in_by_password()
    assert client.get("/admin/", follow=True).redirect_chain[-1][0].startswith("/admin/2fa/enrol/")

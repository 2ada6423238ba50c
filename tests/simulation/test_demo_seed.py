"""The demo's data: the logins it prints reach the tenants the tour names, with their roles."""

import pytest
from django.test import Client

from simulation import demo
from tenants.models import Membership

pytestmark = pytest.mark.django_db


def test_the_demo_prints_a_login_for_a_failing_shops_admin_and_for_a_viewer(settings, tmp_path):
    settings.VAR_DIR = tmp_path

    logins = demo.seed("http://127.0.0.1:9")

    roles = {
        m.user.username: (m.tenant.key, m.role)
        for m in Membership.objects.select_related("user", "tenant")
    }
    assert roles["charlie"] == ("charlie-shop.example", Membership.ADMIN)
    assert roles["alpha"] == ("alpha-shop.example", Membership.VIEWER)
    assert set(logins) == {"admin", "alpha", "big", "charlie"}
    client = Client()
    signed_in = client.post(
        "/accounts/login/", {"username": "charlie", "password": logins["charlie"]}
    )
    assert signed_in.status_code == 302
    assert client.get("/t/charlie-shop.example/replays/").status_code == 200

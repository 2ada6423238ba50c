"""The front door (/): both doors for anyone, a member's own dashboards, staff's admin links."""

import pytest
from django.contrib.auth.models import User
from django.urls import reverse

from tests.factories import make_tenant, make_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def tenants():
    return (
        make_tenant("mine.example", name="Mine Shop"),
        make_tenant("also-mine.example", name="Second Shop"),
        make_tenant("theirs.example", name="Secret Rival Ltd"),
    )


def landing(client) -> str:
    response = client.get("/")
    assert response.status_code == 200
    assert "no-store" in response["Cache-Control"]
    return response.content.decode()


def test_anonymous_visitors_see_the_way_to_the_admin_and_to_their_dashboard(
    client, tenants
) -> None:
    page = landing(client)
    assert f'Operators: <a href="{reverse("admin:index")}">admin</a>' in page
    assert f'Tenants: <a href="{reverse("tenants:home")}">your dashboard</a>' in page
    assert "Webhook delivery shared fairly" in page
    for tenant in tenants:
        assert tenant.key not in page and tenant.name not in page


def test_a_member_sees_only_their_own_tenants(client, tenants) -> None:
    mine, also_mine, theirs = tenants
    user = make_user("alice", tenant=mine)
    user.memberships.create(tenant=also_mine)
    client.force_login(user)
    page = landing(client)
    for tenant in (mine, also_mine):
        assert reverse("tenants:dashboard", args=[tenant.key]) in page
    assert theirs.key not in page and theirs.name not in page
    assert reverse("admin:index") not in page  # not staff


def test_staff_see_the_admin_and_the_overview(client, tenants) -> None:
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    page = landing(client)
    assert f'href="{reverse("admin:index")}"' in page
    assert f'href="{reverse("admin-overview")}"' in page
    # Its own memberships only: staff find every tenant on /t/ and in the admin.
    for tenant in tenants:
        assert tenant.key not in page


def test_staff_who_may_not_view_tenants_get_no_overview_link(client) -> None:
    client.force_login(make_user("clerk", staff=True))
    page = landing(client)
    assert f'href="{reverse("admin:index")}"' in page
    assert reverse("admin-overview") not in page


def test_a_user_with_no_tenant_is_told_whom_to_ask(client) -> None:
    client.force_login(make_user("newcomer"))
    assert "Ask your administrator for access" in landing(client)


def test_the_admin_view_site_link_lands_here(client) -> None:
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    index = client.get(reverse("admin:index")).content.decode()
    assert f'<a href="{reverse("root")}">View site</a>' in index
    assert client.get(reverse("root")).status_code == 200

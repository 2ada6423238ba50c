"""Who may open a tenant dashboard: members, staff, share links; nobody sees another tenant."""

import json
import time

import pytest
from django.contrib.auth.models import User
from django.urls import reverse

from ingest.publish import publish
from tenants import share
from tests.factories import make_endpoint, make_tenant, make_user

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def two_tenants():
    """Two tenants with traffic, so each page has something of the other's to leak."""
    mine = make_tenant("mine.example", name="Mine Shop")
    theirs = make_tenant("theirs.example", name="Secret Rival Ltd")
    make_endpoint(mine, "http://127.0.0.1:9/mine-hook")
    make_endpoint(theirs, "http://127.0.0.1:9/rival-hook")
    for i in range(3):
        publish(mine, "orders/create", {"i": i})
        publish(theirs, "orders/create", {"i": i})
    return mine, theirs


def urls_of(tenant, token: str | None = None) -> list[str]:
    if token:
        args = [tenant.key, token]
        return [
            reverse("tenants:shared", args=args),
            reverse("tenants:shared-status", args=args),
            reverse("tenants:shared-chart", args=[*args, "backlog-age"]),
        ]
    return [
        reverse("tenants:dashboard", args=[tenant.key]),
        reverse("tenants:status", args=[tenant.key]),
        reverse("tenants:chart", args=[tenant.key, "delivered"]),
    ]


def assert_no_leak(body: str, other) -> None:
    for secret in (other.key, other.name, "rival-hook"):
        assert secret not in body


def test_member_sees_their_own_dashboard_and_nothing_of_others(client, two_tenants) -> None:
    mine, theirs = two_tenants
    client.force_login(make_user("alice", tenant=mine))
    for url in urls_of(mine):
        response = client.get(url)
        assert response.status_code == 200, url
        assert "no-store" in response["Cache-Control"]
        assert_no_leak(response.content.decode(), theirs)
    page = client.get(reverse("tenants:dashboard", args=[mine.key])).content.decode()
    assert "Mine Shop" in page and "mine-hook" in page


def test_member_of_another_tenant_gets_404(client, two_tenants) -> None:
    mine, theirs = two_tenants
    client.force_login(make_user("alice", tenant=mine))
    for url in urls_of(theirs):
        assert client.get(url).status_code == 404, url


def test_unknown_tenant_is_404_like_a_forbidden_one(client, two_tenants) -> None:
    client.force_login(make_user("alice", tenant=two_tenants[0]))
    assert client.get(reverse("tenants:dashboard", args=["nobody.example"])).status_code == 404


def test_anonymous_users_go_to_the_tenant_login_page(client, two_tenants) -> None:
    mine, _ = two_tenants
    for url in [*urls_of(mine), reverse("tenants:dashboard", args=["nobody.example"])]:
        response = client.get(url)
        assert response.status_code == 302, url
        assert response["Location"].startswith(reverse("tenants:login") + "?next=")


def test_login_page_signs_a_member_in_and_lands_on_their_dashboard(client, two_tenants) -> None:
    mine, _ = two_tenants
    make_user("alice", tenant=mine)
    login = client.get(reverse("tenants:login"))
    assert login.status_code == 200
    response = client.post(
        reverse("tenants:login"), {"username": "alice", "password": "pw-alice"}, follow=True
    )
    assert response.redirect_chain[-1][0] == reverse("tenants:dashboard", args=[mine.key])
    assert response.status_code == 200


def test_staff_who_may_view_tenants_open_any_dashboard(client, two_tenants) -> None:
    mine, theirs = two_tenants
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    assert client.get(reverse("tenants:dashboard", args=[theirs.key])).status_code == 200
    plain_staff = make_user("clerk", staff=True)  # staff, but no permission on tenants
    client.force_login(plain_staff)
    assert client.get(reverse("tenants:dashboard", args=[mine.key])).status_code == 404


def test_the_tenant_home_lists_what_each_user_may_open(client, two_tenants) -> None:
    mine, theirs = two_tenants
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    page = client.get(reverse("tenants:home")).content.decode()
    assert mine.key in page and theirs.key in page and "Ask your administrator" not in page
    client.force_login(make_user("clerk", staff=True))  # staff without the permission
    page = client.get(reverse("tenants:home")).content.decode()
    assert mine.key not in page and theirs.key not in page and "Ask your administrator" in page
    member = make_user("member", tenant=mine)
    client.force_login(member)
    assert client.get(reverse("tenants:home"))["Location"] == reverse(
        "tenants:dashboard", args=[mine.key]
    )


def test_inactive_member_gets_nothing(client, two_tenants) -> None:
    mine, _ = two_tenants
    user = make_user("alice", tenant=mine)
    client.force_login(user)
    user.is_active = False
    user.save()
    response = client.get(reverse("tenants:dashboard", args=[mine.key]))
    assert response.status_code in (302, 404)


def test_share_link_opens_a_read_only_view_without_an_account(client, two_tenants) -> None:
    mine, theirs = two_tenants
    token = share.make_token(mine, days=1)
    for url in urls_of(mine, token):
        response = client.get(url)
        assert response.status_code == 200, url
        assert response["Referrer-Policy"] == "no-referrer"
        assert_no_leak(response.content.decode(), theirs)
    page = client.get(reverse("tenants:shared", args=[mine.key, token])).content.decode()
    assert "Shared read-only view" in page
    assert "Sign out" not in page and "<form" not in page  # nothing to act on
    status = client.get(reverse("tenants:shared-status", args=[mine.key, token])).json()
    assert status["tenant"]["key"] == mine.key


def test_share_link_of_one_tenant_does_not_open_another(client, two_tenants) -> None:
    mine, theirs = two_tenants
    token = share.make_token(mine)
    for url in urls_of(theirs, token):
        assert client.get(url).status_code == 404, url


def test_tampered_share_link_is_404(client, two_tenants) -> None:
    mine, _ = two_tenants
    token = share.make_token(mine)
    payload, _, signature = token.rpartition(":")
    forged = payload + ":" + ("A" if signature[0] != "A" else "B") + signature[1:]
    assert client.get(reverse("tenants:shared", args=[mine.key, forged])).status_code == 404
    assert client.get(reverse("tenants:shared", args=[mine.key, "garbage"])).status_code == 404


def test_expired_share_link_is_403_with_a_page_saying_so(client, two_tenants) -> None:
    mine, _ = two_tenants
    token = share.make_token(mine, days=1, now=time.time() - 2 * 86400)
    for url in urls_of(mine, token):
        response = client.get(url)
        assert response.status_code == 403, url
    page = client.get(reverse("tenants:shared", args=[mine.key, token])).content.decode()
    assert "expired" in page
    assert mine.name not in page


def test_share_tokens_are_bound_to_the_signing_key(settings, two_tenants) -> None:
    mine, _ = two_tenants
    token = share.make_token(mine)
    settings.SECRET_KEY = "another-key-" + "x" * 40
    with pytest.raises(share.ShareLinkInvalid):
        share.read_token(token)


def test_admin_action_creates_a_share_link_shown_once(client, two_tenants) -> None:
    mine, theirs = two_tenants
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    response = client.post(
        reverse("admin:tenants_tenant_changelist"),
        {"action": "share_link", "_selected_action": [str(mine.pk)]},
        follow=True,
    )
    page = response.content.decode()
    start = page.index(f"/t/{mine.key}/s/")
    link = page[start : page.index('"', start)]
    client.logout()
    shared = client.get(link)
    assert shared.status_code == 200
    assert_no_leak(shared.content.decode(), theirs)
    again = client.get(reverse("admin:tenants_tenant_changelist"))
    assert "/s/" not in again.content.decode()  # the message was shown once


def test_status_json_holds_only_this_tenants_identifiers(client, two_tenants) -> None:
    mine, theirs = two_tenants
    client.force_login(make_user("alice", tenant=mine))
    data = client.get(reverse("tenants:status", args=[mine.key])).json()
    assert_no_leak(json.dumps(data), theirs)
    assert data["share_of_turns"]["other_backlogged_tenants"] == 1  # a count, never a name


def test_a_refusal_is_a_styled_page_with_its_reason_and_a_way_back(client) -> None:
    tenant = make_tenant("styled.example")
    client.force_login(make_user("viewer-styled", tenant=tenant))

    refused = client.get(reverse("tenants:audit", args=[tenant.key]))
    missing = client.get(reverse("tenants:dashboard", args=["nobody.example"]))

    body = refused.content.decode()
    assert refused.status_code == 403 and refused["Content-Type"].startswith("text/html")
    assert "<h1>Not allowed</h1>" in body and "may read its audit trail" in body
    assert 'href="/t/"' in body and "dashboard.css" in body
    assert missing.status_code == 404 and "<h1>Not found</h1>" in missing.content.decode()
    assert 'href="/t/"' in missing.content.decode()

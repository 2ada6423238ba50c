"""Portal links: an operator's app asks the API for a one-use link, and the browser that
follows it is signed in to that one tenant's portal, with the link's role and no more,
as a dedicated user without a password. Used, expired and altered links sign nobody in;
embedding is allowed only to the origins PORTAL_FRAME_ANCESTORS names."""

import hashlib
from datetime import timedelta
from urllib.parse import urlsplit

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from api.models import PortalLink
from api.portal_entry import visitor_username
from tenants.models import AuditEntry, Membership
from tests.api.helpers import Api, operator_token, tenant_token
from tests.factories import make_endpoint, make_tenant, make_user
from webhooks.models import ApiToken

pytestmark = pytest.mark.django_db(transaction=True)
REFUSED = "This link was used or has expired"


class Shops:
    def __init__(self) -> None:
        self.mine = make_tenant("mine.example")
        self.other = make_tenant("other.example")
        make_endpoint(self.mine, "http://127.0.0.1:9/mine")
        self.api = Api(tenant_token(self.mine))
        self.links = "/api/v1/tenants/mine.example/portal-links"
        self.dashboard = reverse("tenants:dashboard", kwargs={"key": "mine.example"})
        self.other_dashboard = reverse("tenants:dashboard", kwargs={"key": "other.example"})

    def link(self, api: Api | None = None, **body) -> str:
        """The path of a new link (the API answers with an absolute URL)."""
        made = (api or self.api).post(self.links, body)
        assert made.status_code == 201, made.json()
        return urlsplit(made.json()["url"]).path


@pytest.fixture
def shops() -> Shops:
    return Shops()


def signed_in(client: Client) -> bool:
    return "_auth_user_id" in client.session


def test_a_link_signs_its_visitor_in_to_one_tenant_once(shops) -> None:
    made = shops.api.post(shops.links, {"visitor": "ann@shop.example"})
    assert made.status_code == 201, made.json()
    assert made["Cache-Control"] == "no-store"
    body = made.json()
    assert body["role"] == "viewer"
    assert body["url"].startswith("http://testserver/portal/enter/")
    expires = timezone.datetime.fromisoformat(body["expires_at"])
    assert timedelta(seconds=290) < expires - timezone.now() <= timedelta(seconds=300)
    secret = body["url"].rsplit("/", 1)[1]
    link = PortalLink.objects.get()
    assert link.token_hash == hashlib.sha256(secret.encode()).hexdigest()
    created = AuditEntry.objects.get(action=AuditEntry.Action.PORTAL_LINK_CREATED)
    assert (created.via, created.tenant, created.detail["visitor"]) == (
        "api",
        shops.mine,
        "ann@shop.example",
    )
    assert secret not in str(created.detail)

    browser = Client()
    entered = browser.get(urlsplit(body["url"]).path)
    assert entered.status_code == 303
    assert entered["Location"] == shops.dashboard
    assert "no-store" in entered["Cache-Control"]
    assert entered["Referrer-Policy"] == "no-referrer"
    assert browser.get(shops.dashboard).status_code == 200
    assert browser.get(shops.other_dashboard).status_code == 404

    user = User.objects.get(pk=browser.session["_auth_user_id"])
    assert user.username == visitor_username(shops.mine.pk, "ann@shop.example")
    assert user.first_name == "ann@shop.example"
    assert not (user.is_staff or user.is_superuser or user.has_usable_password())
    assert list(Membership.objects.filter(user=user).values_list("tenant__key", "role")) == [
        ("mine.example", "viewer")
    ]
    link.refresh_from_db()
    assert link.used_at is not None and link.used_by == user
    used = AuditEntry.objects.get(action=AuditEntry.Action.PORTAL_LINK_USED)
    assert (used.via, used.tenant, used.actor) == ("portal", shops.mine, user)

    # The same link a second time, in another browser: refused, nobody signed in.
    again = Client()
    refused = again.get(urlsplit(body["url"]).path)
    assert refused.status_code == 403
    assert REFUSED in refused.content.decode()
    assert "no-store" in refused["Cache-Control"]
    assert refused["Referrer-Policy"] == "no-referrer"
    assert not signed_in(again)
    assert again.get(shops.dashboard).status_code == 302  # to the login page
    assert AuditEntry.objects.filter(action=AuditEntry.Action.PORTAL_LINK_USED).count() == 1


def test_expired_altered_and_unknown_links_sign_nobody_in(shops) -> None:
    expired = shops.link(ttl_seconds=10)
    PortalLink.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
    fresh = shops.link()
    altered = fresh[:-1] + ("A" if fresh[-1] != "A" else "B")
    for path in (expired, altered, "/portal/enter/nothing-of-ours", "/portal/enter/" + "x" * 500):
        browser = Client()
        refused = browser.get(path)
        assert refused.status_code == 403, path
        assert REFUSED in refused.content.decode()
        assert not signed_in(browser)
    assert not User.objects.exists()
    assert PortalLink.objects.filter(used_at__isnull=False).count() == 0
    # The genuine link was not spent by the altered one, nor by a link checker's HEAD.
    assert Client().head(fresh).status_code == 405
    assert Client().get(fresh).status_code == 303


def test_a_viewer_link_cannot_act_as_an_admin(shops) -> None:
    replays = reverse("tenants:replays", kwargs={"key": "mine.example"})
    now = timezone.localtime()
    window = {
        "statuses": ["dead"],
        "start": (now - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%S"),
        "end": now.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    viewer = Client()
    assert viewer.get(shops.link(visitor="ann")).status_code == 303
    assert viewer.get(replays).status_code == 200
    assert viewer.post(replays, window).status_code == 403

    # The same visitor, given an admin link later: the same user, now an admin.
    admin = Client()
    assert admin.get(shops.link(visitor="ann", role="admin")).status_code == 303
    assert admin.post(replays, window).status_code == 200
    assert User.objects.count() == 1
    assert Membership.objects.get().role == "admin"


def test_one_visitor_gets_one_user_per_tenant(shops) -> None:
    operator = Api(operator_token())
    mine, theirs = Client(), Client()
    mine.get(shops.link(operator, visitor="bob"))
    made = operator.post("/api/v1/tenants/other.example/portal-links", {"visitor": "bob"})
    theirs.get(urlsplit(made.json()["url"]).path)
    assert mine.get(shops.other_dashboard).status_code == 404
    assert theirs.get(shops.dashboard).status_code == 404
    assert theirs.get(shops.other_dashboard).status_code == 200
    assert sorted(Membership.objects.values_list("user__username", "tenant__key")) == sorted(
        [
            (visitor_username(shops.mine.pk, "bob"), "mine.example"),
            (visitor_username(shops.other.pk, "bob"), "other.example"),
        ]
    )


def test_a_link_never_signs_in_as_a_real_account(shops) -> None:
    # Someone made a person's account with the name a visitor's user would have.
    person = make_user(visitor_username(shops.mine.pk, "eve"), staff=True)
    browser = Client()
    refused = browser.get(shops.link(visitor="eve"))
    assert refused.status_code == 403
    assert not signed_in(browser)
    assert not Membership.objects.filter(user=person).exists()


def test_links_for_another_tenant_are_not_found(shops) -> None:
    answer = shops.api.post("/api/v1/tenants/other.example/portal-links", {})
    assert answer.status_code == 404
    assert (
        answer.json()["detail"]
        == (shops.api.post("/api/v1/tenants/nobody.example/portal-links", {}).json()["detail"])
    )
    assert not PortalLink.objects.exists()


def test_read_only_tokens_make_viewer_links_only(shops) -> None:
    reader = Api(tenant_token(shops.mine, access=ApiToken.Access.READ))
    assert reader.post(shops.links, {}).status_code == 201
    admin = reader.post(shops.links, {"role": "admin"})
    assert admin.status_code == 403
    assert admin["Content-Type"] == "application/problem+json"
    publisher = Api(tenant_token(shops.mine, access=ApiToken.Access.PUBLISH))
    assert publisher.post(shops.links, {}).status_code == 403
    assert Api(None).post(shops.links, {}).status_code == 401
    assert list(PortalLink.objects.values_list("role", flat=True)) == ["viewer"]


@pytest.mark.parametrize(
    "body, field",
    [
        ({"ttl_seconds": 5}, "ttl_seconds"),
        ({"ttl_seconds": 301}, "ttl_seconds"),
        ({"role": "owner"}, "role"),
        ({"visitor": ""}, "visitor"),
        ({"visitor": "x" * 151}, "visitor"),
        ({"visitor": "tab\there"}, "visitor"),
        ({"rol": "admin"}, "rol"),
    ],
)
def test_bad_requests_name_the_field(shops, body, field) -> None:
    answer = shops.api.post(shops.links, body)
    assert answer.status_code == 422
    assert [error["field"] for error in answer.json()["errors"]] == [field]
    assert not PortalLink.objects.exists()


def test_the_longest_wait_follows_the_setting(shops, settings) -> None:
    settings.PORTAL_LINK_SECONDS = 600
    answer = shops.api.post(shops.links, {"ttl_seconds": 600})
    assert answer.status_code == 201
    waits = PortalLink.objects.get().expires_at - PortalLink.objects.get().created_at
    assert waits == timedelta(seconds=600)


def test_portal_pages_may_be_framed_only_by_the_named_origins(shops, settings) -> None:
    browser = Client()
    browser.get(shops.link())
    closed = browser.get(shops.dashboard)
    assert closed["X-Frame-Options"] == "DENY"
    assert "frame-ancestors 'none'" in closed["Content-Security-Policy"]

    settings.PORTAL_FRAME_ANCESTORS = ["https://app.example", "https://admin.app.example"]
    framed = browser.get(shops.dashboard)
    assert framed.status_code == 200
    policy = framed["Content-Security-Policy"]
    assert "frame-ancestors https://app.example https://admin.app.example" in policy
    # The rest of the page's policy stays as strict.
    assert "script-src 'self'" in policy and "default-src 'none'" in policy
    assert "X-Frame-Options" not in framed
    refused = Client().get("/portal/enter/nothing-of-ours")
    assert "frame-ancestors https://app.example" in refused["Content-Security-Policy"]

    # A value that would add a directive of its own is left out.
    settings.PORTAL_FRAME_ANCESTORS = ["https://app.example; script-src *"]
    assert browser.get(shops.dashboard)["X-Frame-Options"] == "DENY"

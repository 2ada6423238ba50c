"""The tenant portal's endpoint self-service: health, edits, secrets, test events, audit.

Real database, real Redis, the real delivery engine where a delivery must actually go out.
"""

import json
import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission
from django.db import connection, transaction
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from dashboards.endpoint_actions import TEST_EVENTS_PER_MINUTE
from dashboards.endpoint_health import endpoint_health, recent_attempts
from delivery.models import Attempt, Delivery
from delivery.scheduler import get_scheduler
from ingest.publish import publish
from tenants import share
from tenants.models import AuditEntry, Endpoint, EndpointSecret, Membership
from tests.delivery_helpers import wait_until
from tests.factories import make_endpoint, make_tenant, make_user
from tests.http_receivers import Recorder
from tests.signing import standard_webhooks
from webhooks.models import Event

pytestmark = pytest.mark.django_db(transaction=True)

PUBLIC_URL = "https://93.184.215.14/hook"  # an IP literal: no DNS needed to validate it
Action = AuditEntry.Action


def signed_with(secret: str, request) -> bool:
    """As a receiver checks it: one of the offered v1 signatures is this secret's."""
    expected = standard_webhooks(
        secret,
        request.headers["webhook-id"],
        int(request.headers["webhook-timestamp"]),
        request.body,
    )
    return expected in request.headers["webhook-signature"].split()


def member(username: str, tenant, role: str = Membership.VIEWER):
    return make_user(username, tenant=tenant, role=role)


@pytest.fixture
def shop():
    """Tenant A with two endpoints, an admin and a viewer; tenant B with one endpoint."""
    a = make_tenant("a-shop.example", name="A Shop")
    b = make_tenant("b-shop.example", name="B Shop")
    return {
        "a": a,
        "b": b,
        "ep": make_endpoint(a, "http://127.0.0.1:9/a-one", description="main"),
        "ep2": make_endpoint(a, "http://127.0.0.1:9/a-two"),
        "b_ep": make_endpoint(b, "http://127.0.0.1:9/b-only"),
        "admin": member("ada", a, Membership.ADMIN),
        "viewer": member("vic", a),
        "b_admin": member("bob", b, Membership.ADMIN),
    }


def url(name: str, tenant, *args) -> str:
    return reverse(f"tenants:{name}", args=[tenant.key, *args])


def post_urls(tenant, endpoint) -> dict[str, tuple[str, dict]]:
    """Every state-changing POST of the portal, with valid data."""
    return {
        "edit": (url("endpoint", tenant, endpoint.pk), {"url": PUBLIC_URL, "description": "x"}),
        "new": (url("endpoint-new", tenant), {"url": PUBLIC_URL}),
        "disable": (url("endpoint-disable", tenant, endpoint.pk), {"reason": "maintenance"}),
        "enable": (url("endpoint-enable", tenant, endpoint.pk), {}),
        "reveal": (url("endpoint-secret-reveal", tenant, endpoint.pk), {}),
        "rotate": (url("endpoint-secret-rotate", tenant, endpoint.pk), {"overlap_hours": "24"}),
        "test": (url("endpoint-test", tenant, endpoint.pk), {}),
    }


def audit_actions(tenant) -> list[str]:
    return list(
        AuditEntry.objects.filter(tenant=tenant).order_by("id").values_list("action", flat=True)
    )


# --- health ---------------------------------------------------------------------------------


def _attempt(endpoint, minutes_ago: float, ms: int, outcome: str) -> Attempt:
    event = Event.objects.create(tenant=endpoint.tenant, event_type="t", payload=b"{}")
    delivery = Delivery.objects.create(event=event, endpoint=endpoint, tenant=endpoint.tenant)
    return Attempt.objects.create(
        delivery=delivery,
        endpoint=endpoint,
        number=1,
        started_at=timezone.now() - timedelta(minutes=minutes_ago),
        duration_ms=ms,
        outcome=outcome,
    )


def test_health_is_computed_from_the_endpoints_own_attempts_per_window(client, shop) -> None:
    ep, ok, retry, failed = shop["ep"], "delivered", "retry", "failed"
    # Last hour: 3 of 4 delivered; durations 100..400.
    for minutes, ms, outcome in [(5, 300, ok), (10, 100, ok), (20, 400, retry), (50, 200, ok)]:
        _attempt(ep, minutes, ms, outcome)
    _attempt(ep, 5 * 60, 1000, failed)  # in the day, not the hour
    _attempt(ep, 2 * 24 * 60, 5, ok)  # older than a day: in neither
    _attempt(shop["ep2"], 1, 9999, failed)  # another endpoint's
    health = endpoint_health(ep.pk)
    assert (health.hour.attempts, health.hour.delivered) == (4, 3)
    assert (health.hour.p50_ms, health.hour.p95_ms) == (200, 400)  # nearest rank
    assert health.hour.success_text == "75 %"
    assert (health.day.attempts, health.day.delivered) == (5, 3)
    assert (health.day.p50_ms, health.day.p95_ms) == (300, 1000)
    assert health.day.success_text == "60 %"
    assert endpoint_health(shop["ep2"].pk).hour.success_text == "0 %"
    Endpoint.objects.filter(pk=ep.pk).update(consecutive_failures=7)

    client.force_login(shop["viewer"])
    page = client.get(url("endpoints", shop["a"])).content.decode()
    row = page.split(f'data-endpoint="{ep.pk}"')[1].split("</tr>")[0]
    assert "75 %" in row and "200 / 400 ms" in row
    assert "60 %" in row and "300 / 1000 ms" in row
    assert ">7<" in row
    assert "b-only" not in page  # B's endpoint is not listed on A's page


def test_the_health_query_is_a_range_of_the_endpoint_started_index(shop) -> None:
    # Other endpoints' history, so a planner has a reason to prefer the index.
    event = Event.objects.create(tenant=shop["a"], event_type="t", payload=b"{}")
    delivery = Delivery.objects.create(event=event, endpoint=shop["ep2"], tenant=shop["a"])
    Attempt.objects.bulk_create(
        Attempt(delivery=delivery, endpoint=shop["ep2"], number=n, outcome="delivered")
        for n in range(500)
    )
    with transaction.atomic():
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute(f"ANALYZE {connection.ops.quote_name(Attempt._meta.db_table)}")
                # Tiny test tables: price sequential scans out, so the question is only
                # whether an index serves the query, not which is cheaper today.
                cursor.execute("SET LOCAL enable_seqscan = off")
        plan = recent_attempts(shop["ep"].pk, timezone.now()).explain()
    assert "attempt_endpoint_started_idx" in plan, plan


def test_the_list_shows_disabled_endpoints_with_their_reason_and_no_shared_ones(client, shop):
    shared = make_endpoint(None, "http://127.0.0.1:9/shared-gateway")
    Endpoint.objects.filter(pk=shop["ep2"].pk).update(
        enabled=False, disabled_reason="Disabled automatically: 10 consecutive failures"
    )
    client.force_login(shop["viewer"])
    page = client.get(url("endpoints", shop["a"])).content.decode()
    assert "a-one" in page and "a-two" in page
    assert "10 consecutive failures" in page and "disabled" in page
    assert shared.url not in page
    # Viewers get no admin controls.
    assert "Add an endpoint" not in page and "Read-only" in page


def test_attempts_written_by_the_engine_carry_their_endpoint(engine, settings, shop) -> None:
    settings.ALLOW_PRIVATE_DESTINATIONS = True
    with Recorder() as receiver:
        Endpoint.objects.filter(pk=shop["ep"].pk).update(url=receiver.url + "/one")
        Endpoint.objects.filter(pk=shop["ep2"].pk).delete()
        publish(shop["a"], "order.created", {"n": 1})
        engine()
        receiver.wait_for(1)
        assert wait_until(lambda: Attempt.objects.count() == 1)
    assert Attempt.objects.get().endpoint_id == shop["ep"].pk
    assert endpoint_health(shop["ep"].pk).hour.attempts == 1


# --- add and edit ---------------------------------------------------------------------------


def test_an_admin_adds_an_endpoint_with_the_admins_ssrf_rules(client, settings, shop) -> None:
    settings.ALLOW_PRIVATE_DESTINATIONS = False
    client.force_login(shop["admin"])
    assert client.get(url("endpoint-new", shop["a"])).status_code == 200
    refused = client.post(url("endpoint-new", shop["a"]), {"url": "http://127.0.0.1:8000/x"})
    assert refused.status_code == 400
    assert "internal networks are not allowed" in refused.content.decode()
    assert not Endpoint.objects.filter(url__contains="8000").exists()
    assert client.post(url("endpoint-new", shop["a"]), {"url": "not a url"}).status_code == 400

    made = client.post(
        url("endpoint-new", shop["a"]),
        follow=True,
        data={
            "url": PUBLIC_URL,
            "description": "orders",
            "event_types": "order.created\norder.paid, order.created",
            "tenant": shop["b"].pk,  # ignored: the tenant comes from the URL
            "max_in_flight": "999",  # ignored: operator-only
        },
    )
    assert made.redirect_chain[0][1] == 303 and made.status_code == 200
    endpoint = Endpoint.objects.get(url=PUBLIC_URL)
    assert endpoint.tenant == shop["a"] and endpoint.max_in_flight is None
    # The platform's: a limit that adapts to how it answers, under the platform's ceiling.
    assert (
        endpoint.adapts_concurrency and endpoint.in_flight_cap == settings.DELIVERY_ADAPTIVE_CEILING
    )
    assert endpoint.event_types == "order.created, order.paid"
    secret = endpoint.secrets.get().secret
    assert secret in made.content.decode()  # shown once, on the page the POST leads to
    entry = AuditEntry.objects.get(action=Action.ENDPOINT_CREATED)
    assert entry.tenant == shop["a"] and entry.actor == shop["admin"]
    assert entry.detail["new"]["url"] == PUBLIC_URL and secret not in json.dumps(entry.detail)


def test_the_settings_panel_says_whether_the_limit_adapts_or_the_cap_is_fixed(
    client, settings, shop
) -> None:
    settings.DELIVERY_ADAPTIVE_CONCURRENCY = "uncapped"
    settings.DELIVERY_ADAPTIVE_CEILING, settings.DELIVERY_MAX_IN_FLIGHT = 48, 3
    client.force_login(shop["admin"])
    page = client.get(url("endpoint", shop["a"], shop["ep"].pk)).content.decode()
    assert (
        "a limit that adapts to how it answers, at most 48 (the platform's ceiling). That"
        " ceiling is set by the platform's operators." in page
    )
    shop["ep"].rate_limit_per_second = 5
    shop["ep"].save()
    page = client.get(url("endpoint", shop["a"], shop["ep"].pk)).content.decode()
    assert (
        "at most 48 (the platform's ceiling); rate limit 5/s. That ceiling and the rate limit"
        " are set by the platform's operators." in page
    )
    shop["ep"].rate_limit_per_second = None
    shop["ep"].max_in_flight = 5
    shop["ep"].save()
    page = client.get(url("endpoint", shop["a"], shop["ep"].pk)).content.decode()
    assert "Concurrency cap 5:" in page and "adapts" not in page
    settings.DELIVERY_ADAPTIVE_CONCURRENCY = "off"
    page = client.get(url("endpoint", shop["a"], shop["ep2"].pk)).content.decode()
    assert "Concurrency cap 3 (the platform's):" in page


def test_private_destinations_are_accepted_only_when_settings_allow(client, settings, shop):
    client.force_login(shop["admin"])
    edit = url("endpoint", shop["a"], shop["ep"].pk)
    settings.ALLOW_PRIVATE_DESTINATIONS = False
    assert client.post(edit, {"url": "http://127.0.0.1:9/moved"}).status_code == 400
    assert Endpoint.objects.get(pk=shop["ep"].pk).url == "http://127.0.0.1:9/a-one"
    settings.ALLOW_PRIVATE_DESTINATIONS = True
    assert client.post(edit, {"url": "http://127.0.0.1:9/moved"}).status_code == 302
    assert Endpoint.objects.get(pk=shop["ep"].pk).url == "http://127.0.0.1:9/moved"


def test_an_admin_edits_url_description_and_filter_and_it_is_audited(client, settings, shop):
    settings.ALLOW_PRIVATE_DESTINATIONS = False
    client.force_login(shop["admin"])
    edit = url("endpoint", shop["a"], shop["ep"].pk)
    page = client.get(edit).content.decode()
    assert 'name="csrfmiddlewaretoken"' in page and "Rotate secret" in page
    response = client.post(
        edit,
        {
            "url": PUBLIC_URL,
            "description": "renamed",
            "event_types": "order.paid",
            "max_in_flight": "500",
            "rate_limit_per_second": "1000",
        },
    )
    assert response.status_code == 302
    ep = Endpoint.objects.get(pk=shop["ep"].pk)
    assert (ep.url, ep.description, ep.event_types) == (PUBLIC_URL, "renamed", "order.paid")
    assert ep.max_in_flight is None and ep.rate_limit_per_second is None  # unchanged
    assert not ep.accepts("order.created") and ep.accepts("order.paid")
    entry = AuditEntry.objects.get(action=Action.ENDPOINT_CHANGED)
    assert entry.detail == {
        "old": {"url": "http://127.0.0.1:9/a-one", "description": "main", "event_types": ""},
        "new": {"url": PUBLIC_URL, "description": "renamed", "event_types": "order.paid"},
    }
    assert entry.via == AuditEntry.Via.PORTAL and entry.target == f"endpoint {ep.pk}"
    # Saving the same values again changes nothing and writes no row.
    client.post(edit, {"url": PUBLIC_URL, "description": "renamed", "event_types": "order.paid"})
    assert AuditEntry.objects.filter(action=Action.ENDPOINT_CHANGED).count() == 1
    # Bad event types are a 400 with a message, not a 500.
    bad = client.post(edit, {"url": PUBLIC_URL, "event_types": "a\x01b"})
    assert bad.status_code == 400 and "printable" in bad.content.decode()


# --- disable and enable --------------------------------------------------------------------


def test_disable_holds_deliveries_and_enable_releases_them(client, shop) -> None:
    client.force_login(shop["admin"])
    ep = shop["ep"]
    assert client.post(url("endpoint-disable", shop["a"], ep.pk), {"reason": ""}).status_code == 400
    response = client.post(url("endpoint-disable", shop["a"], ep.pk), {"reason": "moving host"})
    assert response.status_code == 302
    ep.refresh_from_db()
    assert not ep.enabled and "moving host" in ep.disabled_reason
    page = client.get(url("endpoint", shop["a"], ep.pk)).content.decode()
    assert "moving host" in page and "Enable and resume" in page

    publish(shop["a"], "order.created", {"n": 1})
    held = Delivery.objects.get(endpoint=ep)
    assert held.status == Delivery.Status.HELD

    assert client.post(url("endpoint-enable", shop["a"], ep.pk)).status_code == 302
    ep.refresh_from_db()
    held.refresh_from_db()
    assert ep.enabled and ep.disabled_reason == ""
    assert held.status == Delivery.Status.PENDING
    disabled, enabled = (
        AuditEntry.objects.get(action=Action.ENDPOINT_DISABLED),
        AuditEntry.objects.get(action=Action.ENDPOINT_ENABLED),
    )
    assert disabled.detail["reason"] == "moving host"
    assert disabled.detail["old"] == {"enabled": True}
    assert (
        enabled.detail["resumed"] == 1 and "moving host" in enabled.detail["old"]["disabled_reason"]
    )


# --- secrets --------------------------------------------------------------------------------


def test_reveal_shows_active_secrets_once_audits_and_never_logs_them(client, shop, caplog):
    caplog.set_level("DEBUG")
    ep = shop["ep"]
    expired = EndpointSecret.objects.create(
        endpoint=ep, expires_at=timezone.now() - timedelta(minutes=1)
    )
    active = ep.secrets.exclude(pk=expired.pk).get().secret
    client.force_login(shop["admin"])
    detail = client.get(url("endpoint", shop["a"], ep.pk)).content.decode()
    assert active not in detail  # masked until revealed
    reveal = url("endpoint-secret-reveal", shop["a"], ep.pk)
    assert client.get(reveal).status_code == 405  # only a deliberate POST reveals
    response = client.post(reveal, follow=True)
    body = response.content.decode()
    assert response.redirect_chain[0][1] == 303
    assert response.status_code == 200 and active in body and expired.secret not in body
    assert "no-store" in response["Cache-Control"]
    entry = AuditEntry.objects.get(action=Action.SECRET_REVEALED)
    assert entry.actor == shop["admin"] and active not in json.dumps(entry.detail)
    assert active not in caplog.text


def test_rotation_keeps_the_old_secret_for_the_overlap_and_audits_it(client, shop, caplog):
    caplog.set_level("DEBUG")
    ep = shop["ep"]
    old = ep.secrets.get()
    client.force_login(shop["admin"])
    rotate = url("endpoint-secret-rotate", shop["a"], ep.pk)
    for bad in ("", "abc", "0", "1000"):
        assert client.post(rotate, {"overlap_hours": bad}).status_code == 400, bad
    assert ep.secrets.count() == 1
    page = client.get(url("endpoint", shop["a"], ep.pk)).content.decode()
    assert "default 24 hours" in page

    before = timezone.now()
    response = client.post(rotate, {"overlap_hours": "24"}, follow=True)
    assert response.status_code == 200
    new = ep.secrets.exclude(pk=old.pk).get()
    old.refresh_from_db()
    body = response.content.decode()
    assert new.secret in body and old.secret not in body
    assert new.expires_at is None
    assert before + timedelta(hours=24) <= old.expires_at <= timezone.now() + timedelta(hours=24)
    assert old.is_active() and new.is_active()  # both sign during the overlap
    entry = AuditEntry.objects.get(action=Action.SECRET_ROTATED)
    assert entry.detail["overlap_hours"] == 24
    text = json.dumps(entry.detail)
    assert old.secret not in text and new.secret not in text
    assert new.secret not in caplog.text and old.secret not in caplog.text


def test_after_rotation_a_test_event_is_signed_with_both_secrets_and_reaches_one_endpoint(
    client, engine, settings, shop
) -> None:
    settings.ALLOW_PRIVATE_DESTINATIONS = True
    with Recorder() as receiver:
        Endpoint.objects.filter(pk=shop["ep"].pk).update(url=receiver.url + "/one")
        Endpoint.objects.filter(pk=shop["ep2"].pk).update(url=receiver.url + "/two")
        old = shop["ep"].secrets.get()
        client.force_login(shop["admin"])
        client.post(url("endpoint-secret-rotate", shop["a"], shop["ep"].pk), {"overlap_hours": "2"})
        new = shop["ep"].secrets.exclude(pk=old.pk).get()
        response = client.post(url("endpoint-test", shop["a"], shop["ep"].pk), follow=True)
        engine()
        [request] = receiver.wait_for(1)
        assert wait_until(lambda: Delivery.objects.filter(status="delivered").count() == 1)
        assert len(receiver.requests) == 1  # nothing for the tenant's other endpoint
    assert request.path == "/one"
    assert request.headers["webhook-event-type"] == "webhook.test"
    assert request.json()["type"] == "webhook.test"
    assert signed_with(old.secret, request)
    assert signed_with(new.secret, request)
    # The message links to the delivery's page, which shows the result.
    link = re.search(r'href="([^"]+/deliveries/[0-9A-Za-z]{26}/)"', response.content.decode())
    assert link, response.content.decode()
    result = client.get(link.group(1)).content.decode()
    assert "Delivered" in result and "HTTP 200" in result


# --- test event ------------------------------------------------------------------------------


def test_a_test_event_goes_to_that_endpoint_only_through_the_tenants_lane(client, shop):
    # Its filter would not take webhook.test, and ep2 takes everything: still only ep.
    Endpoint.objects.filter(pk=shop["ep"].pk).update(event_types="order.created")
    client.force_login(shop["admin"])
    response = client.post(url("endpoint-test", shop["a"], shop["ep"].pk))
    assert response.status_code == 302
    [delivery] = Delivery.objects.all()
    assert delivery.endpoint_id == shop["ep"].pk and delivery.tenant == shop["a"]
    assert delivery.event.event_type == "webhook.test"
    assert delivery.status == Delivery.Status.PENDING
    lanes = {row.tenant_id: row for row in get_scheduler().snapshot().tenants}
    assert lanes[shop["a"].pk].fresh == 1  # queued in A's lane like any event
    entry = AuditEntry.objects.get(action=Action.TEST_EVENT_SENT)
    assert entry.detail == {"event_id": delivery.event_id}
    page = client.get(url("endpoint", shop["a"], shop["ep"].pk)).content.decode()
    assert url("endpoint-delivery", shop["a"], shop["ep"].pk, delivery.pk) in page


def test_test_events_are_limited_per_endpoint_and_minute(client, shop) -> None:
    client.force_login(shop["admin"])
    for _ in range(TEST_EVENTS_PER_MINUTE):
        assert client.post(url("endpoint-test", shop["a"], shop["ep"].pk)).status_code == 302
    refused = client.post(url("endpoint-test", shop["a"], shop["ep"].pk))
    assert refused.status_code == 429 and refused["Retry-After"] == "60"
    assert "test events a minute" in refused.content.decode()
    assert Delivery.objects.filter(endpoint=shop["ep"]).count() == TEST_EVENTS_PER_MINUTE
    # Another endpoint has its own allowance, and the minute passes.
    assert client.post(url("endpoint-test", shop["a"], shop["ep2"].pk)).status_code == 302
    AuditEntry.objects.update(at=timezone.now() - timedelta(minutes=2))
    assert client.post(url("endpoint-test", shop["a"], shop["ep"].pk)).status_code == 302


# --- who may do what ---------------------------------------------------------------------------


def test_a_viewer_reads_but_every_post_is_403(client, shop) -> None:
    client.force_login(shop["viewer"])
    assert client.get(url("endpoints", shop["a"])).status_code == 200
    page = client.get(url("endpoint", shop["a"], shop["ep"].pk)).content.decode()
    assert "Read-only" in page and "Rotate secret" not in page and "Reveal" not in page
    Endpoint.objects.filter(pk=shop["ep"].pk).update(enabled=False, disabled_reason="x")
    for name, (target, data) in post_urls(shop["a"], shop["ep"]).items():
        assert client.post(target, data).status_code == 403, name
    assert client.get(url("endpoint-new", shop["a"])).status_code == 403
    assert client.get(url("audit", shop["a"])).status_code == 403
    assert AuditEntry.objects.count() == 0 and Delivery.objects.count() == 0
    assert (
        shop["ep"].secrets.count() == 1 and Endpoint.objects.filter(tenant=shop["a"]).count() == 2
    )


def test_staff_who_may_view_tenants_read_but_do_not_change(client, shop) -> None:
    staff = make_user("operator", staff=True)
    staff.user_permissions.add(Permission.objects.get(codename="view_tenant"))
    client.force_login(staff)
    assert client.get(url("endpoints", shop["a"])).status_code == 200
    for name, (target, data) in post_urls(shop["a"], shop["ep"]).items():
        assert client.post(target, data).status_code == 403, name


def test_an_admin_of_a_cannot_reach_bs_endpoints_by_id(client, shop) -> None:
    client.force_login(shop["admin"])
    b_ep, a, b = shop["b_ep"], shop["a"], shop["b"]
    for name, (target, data) in post_urls(a, b_ep).items():
        if name != "new":  # B's endpoint id under A's key
            assert client.post(target, data).status_code == 404, name
    for name, (target, data) in post_urls(b, b_ep).items():  # B's own pages
        assert client.post(target, data).status_code == 404, name
    assert client.get(url("endpoint", a, b_ep.pk)).status_code == 404
    assert client.get(url("endpoints", b)).status_code == 404
    assert client.get(url("audit", b)).status_code == 404
    b_delivery = publish(b, "order.created", {}).event.deliveries.get()
    assert client.get(url("endpoint-delivery", a, b_ep.pk, b_delivery.pk)).status_code == 404
    # A's endpoint id with B's delivery id is no way in either.
    assert client.get(url("endpoint-delivery", a, shop["ep"].pk, b_delivery.pk)).status_code == 404
    b_ep.refresh_from_db()
    assert b_ep.enabled and b_ep.url == "http://127.0.0.1:9/b-only"
    assert b_ep.secrets.count() == 1
    assert AuditEntry.objects.count() == 0
    assert Delivery.objects.filter(endpoint=b_ep).count() == 1  # only the one published above


def test_posts_need_a_csrf_token(shop) -> None:
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(shop["admin"])
    for name, (target, data) in post_urls(shop["a"], shop["ep"]).items():
        assert strict.post(target, data).status_code == 403, name
    assert AuditEntry.objects.count() == 0
    # With the token from the page, the same POST goes through.
    strict.get(url("endpoint", shop["a"], shop["ep"].pk))
    token = strict.cookies["csrftoken"].value
    response = strict.post(
        url("endpoint-secret-reveal", shop["a"], shop["ep"].pk), {"csrfmiddlewaretoken": token}
    )
    assert response.status_code == 303
    assert AuditEntry.objects.filter(action=Action.SECRET_REVEALED).count() == 1


def test_member_pages_keep_the_origin_header_for_their_forms(client, shop) -> None:
    # With no-referrer a browser sends "Origin: null" on a form POST, and Django's CSRF
    # check refuses it; same-origin still tells other sites nothing.
    client.force_login(shop["admin"])
    for target in (url("dashboard", shop["a"]), url("endpoint", shop["a"], shop["ep"].pk)):
        assert client.get(target)["Referrer-Policy"] == "same-origin"
    token = share.make_token(shop["a"])
    shared = client.get(reverse("tenants:shared", args=[shop["a"].key, token]))
    assert shared["Referrer-Policy"] == "no-referrer"


def test_a_share_link_opens_none_of_it(client, shop) -> None:
    token = share.make_token(shop["a"])
    shared = client.get(reverse("tenants:shared", args=[shop["a"].key, token])).content.decode()
    assert url("endpoints", shop["a"]) not in shared and "Audit trail" not in shared
    # The share link gives no session: the portal pages want a sign-in.
    for target in (url("endpoints", shop["a"]), url("endpoint", shop["a"], shop["ep"].pk)):
        response = client.get(target)
        assert response.status_code == 302 and "/accounts/login/" in response["Location"]
    assert client.post(url("endpoint-secret-reveal", shop["a"], shop["ep"].pk)).status_code == 302
    # No URL takes a token before the portal's paths.
    assert client.get(f"/t/{shop['a'].key}/s/{token}/endpoints/").status_code == 404


def test_members_find_endpoints_from_the_dashboard_and_admins_the_audit_trail(client, shop):
    client.force_login(shop["viewer"])
    page = client.get(url("dashboard", shop["a"])).content.decode()
    assert url("endpoints", shop["a"]) in page and url("audit", shop["a"]) not in page
    client.force_login(shop["admin"])
    page = client.get(url("dashboard", shop["a"])).content.decode()
    assert url("endpoints", shop["a"]) in page and url("audit", shop["a"]) in page


# --- audit trail -------------------------------------------------------------------------------


def test_admins_read_their_own_audit_trail_page_by_page(client, shop) -> None:
    from tenants import audit

    for i in range(55):
        audit.record(
            actor=shop["admin"],
            action=Action.ENDPOINT_CHANGED,
            via="portal",
            tenant=shop["a"],
            target=f"endpoint {i}",
        )
    theirs = audit.record(
        actor=shop["b_admin"],
        action=Action.SECRET_REVEALED,
        via="portal",
        tenant=shop["b"],
        target="endpoint b-secret-target",
    )
    client.force_login(shop["admin"])
    first = client.get(url("audit", shop["a"])).content.decode()
    assert "endpoint 54" in first and "endpoint 5<" in first and "endpoint 4<" not in first
    assert "b-secret-target" not in first
    older = re.search(r'href="([^"]+\?before=\d+)"', first).group(1)
    second = client.get(older.replace("&amp;", "&")).content.decode()
    assert "endpoint 4<" in second and "endpoint 0<" in second and "endpoint 54" not in second
    assert 'id="older"' not in second
    assert client.get(url("audit", shop["a"]) + "?before=abc").status_code == 400
    # Another tenant's entry id is not a cursor into this trail.
    assert client.get(url("audit", shop["a"]) + f"?before={theirs.pk}").status_code == 400


@pytest.mark.parametrize("allowed", [True, False])
def test_the_url_help_says_what_this_deployment_allows(client, settings, allowed) -> None:
    settings.ALLOW_PRIVATE_DESTINATIONS = allowed
    tenant = make_tenant("helpful.example")
    client.force_login(member("boss", tenant, role=Membership.ADMIN))

    page = client.get(reverse("tenants:endpoint-new", args=[tenant.key])).content.decode()

    assert ("Private and loopback addresses are refused." in page) is not allowed
    assert ("allows private and loopback addresses" in page) is allowed


def test_a_rotation_redirects_and_a_reload_neither_rotates_again_nor_shows_the_secret(
    client, shop
) -> None:
    ep = shop["ep"]
    old = ep.secrets.get()
    client.force_login(shop["admin"])

    posted = client.post(url("endpoint-secret-rotate", shop["a"], ep.pk), {"overlap_hours": "6"})
    shown_url = posted["Location"]
    first = client.get(shown_url).content.decode()
    reload = client.get(shown_url)

    assert posted.status_code == 303 and shown_url == url(
        "endpoint-secrets-shown", shop["a"], ep.pk
    )
    new = ep.secrets.exclude(pk=old.pk).get()
    assert new.secret in first
    assert ep.secrets.count() == 2  # the GET rotated nothing
    assert reload.status_code == 302 and reload["Location"] == url("endpoint", shop["a"], ep.pk)
    assert new.secret not in client.get(reload["Location"]).content.decode()


def test_revealed_secrets_say_which_is_newest_and_when_the_old_one_stops(client, shop) -> None:
    ep = shop["ep"]
    client.force_login(shop["admin"])
    client.post(url("endpoint-secret-rotate", shop["a"], ep.pk), {"overlap_hours": "6"})
    old, new = ep.secrets.order_by("created_at", "pk")

    page = client.post(url("endpoint-secret-reveal", shop["a"], ep.pk), follow=True)
    items = re.findall(r"<li>(.*?)</li>", page.content.decode(), re.S)
    labels = {secret: next(i for i in items if secret in i) for secret in (old.secret, new.secret)}

    assert "newest" in labels[new.secret] and "signs until rotated" in labels[new.secret]
    assert "newest" not in labels[old.secret] and "stops signing" in labels[old.secret]
    assert old.expires_at.strftime("%Y-%m-%d") in labels[old.secret]
    assert "not shown again" not in page.content.decode()


def test_only_the_tenants_admin_sees_the_secrets_page(client, shop) -> None:
    shown = url("endpoint-secrets-shown", shop["a"], shop["ep"].pk)
    client.force_login(shop["viewer"])
    assert client.get(shown).status_code == 403
    client.force_login(shop["b_admin"])
    assert client.get(shown).status_code == 404


def test_the_audit_trail_reads_as_changes_not_json(client, shop) -> None:
    ep = shop["ep"]
    long_description = "orders and refunds for the warehouse in Lyon, " * 4
    client.force_login(shop["admin"])
    client.post(
        url("endpoint", shop["a"], ep.pk),
        {"url": PUBLIC_URL, "description": long_description},
    )
    client.post(url("endpoint-secret-rotate", shop["a"], ep.pk), {"overlap_hours": "6"})

    page = client.get(url("audit", shop["a"])).content.decode()
    crumbs = re.search(r'<p class="crumbs">(.*?)</p>', page, re.S).group(1)

    assert "Endpoints" not in crumbs and "Audit trail" in crumbs
    assert f"Url: {ep.url} → {PUBLIC_URL}" in page
    assert f"Description: {ep.description} → {long_description.strip()}" in page
    assert "<li>Overlap hours: 6</li>" in page
    assert '{"' not in page  # no raw JSON


def test_an_admin_turns_an_endpoint_to_operational_events_and_it_is_audited(client, settings, shop):
    settings.ALLOW_PRIVATE_DESTINATIONS = True  # the fixture's URL; nothing is sent
    client.force_login(shop["admin"])
    edit = url("endpoint", shop["a"], shop["ep"].pk)
    page = client.get(edit).content.decode()
    assert 'name="operational_events"' in page and 'name="send_trace_context"' in page
    fields = {"url": "http://127.0.0.1:9/a-one", "description": "main", "event_types": ""}
    bad = client.post(edit, {**fields, "operational_events": "delivery.dead, tenant.secrets"})
    assert (
        bad.status_code == 400
        and "Not an operational event: tenant.secrets" in bad.content.decode()
    )
    done = client.post(
        edit,
        {
            **fields,
            "operational_events": "delivery.dead\nendpoint.disabled",
            "send_trace_context": "on",
        },
    )
    assert done.status_code == 302
    ep = Endpoint.objects.get(pk=shop["ep"].pk)
    assert ep.operational_filter() == ["delivery.dead", "endpoint.disabled"]
    assert ep.send_trace_context and not ep.accepts("order.created")
    entry = AuditEntry.objects.get(action=Action.ENDPOINT_CHANGED)
    assert entry.detail["new"] == {
        "operational_events": "delivery.dead,endpoint.disabled",
        "send_trace_context": True,
    }

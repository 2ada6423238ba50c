"""Every page carries the Content-Security-Policy, and Chromium, enforcing it, refuses
nothing on our pages: no inline script or style is left to break. The one exception is
django-rq's queue pages (third-party templates), whose inline blocks are refused and lose
nothing: their script calls a jQuery plug-in Django's admin no longer has (actions.js
starts itself), their styles are cosmetic. And the API reference's ReDoc may not fetch its
logo from its makers' CDN: nothing on our pages loads from another site."""

from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from delivery.models import Delivery, ReplayJob
from delivery.replays.window import Window
from ingest.publish import publish
from tenants.models import Membership
from tests.factories import make_endpoint, make_tenant, make_user
from webhooks.models import Source

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# Listens before any of the page's own code runs, so nothing refused goes unseen.
RECORD_VIOLATIONS = """
window.__violations = [];
document.addEventListener('securitypolicyviolation', (event) => {
  window.__violations.push(event.violatedDirective + ' ' + (event.blockedURI || 'inline')
                           + ' ' + (event.sample || ''));
});
"""
THIRD_PARTY_INLINE = "/admin/django-rq/"


@pytest.fixture
def scene(browser_settings) -> dict:
    tenant = make_tenant("csp-shop.example")
    endpoint = make_endpoint(tenant, "http://127.0.0.1:9/hook")
    for i in range(5):
        publish(tenant, "orders/create", {"i": i})
    delivery = Delivery.objects.filter(endpoint=endpoint).first()
    Delivery.objects.filter(pk=delivery.pk).update(status=Delivery.Status.DEAD, attempts=3)
    admin = make_user("boss", tenant=tenant, role=Membership.ADMIN)
    now = timezone.now()
    window = Window(start=now - timedelta(days=1), end=now, endpoint_id=endpoint.pk)
    ReplayJob.objects.create(
        tenant=tenant, filters=window.to_json(), created_by_name="boss", matched=10, fed=4
    )
    source = Source.objects.create(slug="shop", name="Shop")
    source.auto_register_suspended_at = now
    source.auto_register_suspended_reason = "1,001 new keys in an hour"
    source.save()
    return {
        "tenant": tenant,
        "endpoint": endpoint,
        "delivery": delivery,
        "admin": admin,
        "source": source,
    }


def _context(chromium, live_server, user: User | None) -> Iterator[object]:
    context = chromium.new_context(viewport={"width": 1280, "height": 900})
    context.add_init_script(RECORD_VIOLATIONS)
    if user is not None:
        client = Client()
        client.force_login(user)
        context.add_cookies(
            [
                {
                    "name": "sessionid",
                    "value": client.cookies["sessionid"].value,
                    "url": live_server.url,
                }
            ]
        )
    return context


def _visit(context, live_server, paths: list[str]) -> dict[str, list[str]]:
    """Each page's refusals; every page must carry the policy."""
    refused = {}
    page = context.new_page()
    for path in paths:
        answer = page.goto(live_server.url + path)
        assert answer.status < 400, (path, answer.status)
        policy = answer.all_headers().get("content-security-policy", "")
        assert "default-src 'none'" in policy and "script-src 'self'" in policy, (path, policy)
        page.wait_for_load_state("networkidle")
        found = page.evaluate("window.__violations")
        if found:
            refused[path] = found
    return refused


def test_tenant_pages_refuse_nothing(chromium, live_server, scene) -> None:
    key = scene["tenant"].key
    paths = [
        reverse("tenants:home"),
        reverse("tenants:dashboard", args=[key]),
        reverse("tenants:endpoints", args=[key]),
        reverse("tenants:endpoint", args=[key, scene["endpoint"].pk]),
        reverse("tenants:endpoint-new", args=[key]),
        reverse("tenants:messages", args=[key]),
        reverse("tenants:message", args=[key, scene["delivery"].event_id]),
        reverse("tenants:replays", args=[key]),
        reverse("tenants:audit", args=[key]),
    ]
    context = _context(chromium, live_server, scene["admin"])
    try:
        assert _visit(context, live_server, paths) == {}
    finally:
        context.close()


def test_operator_pages_refuse_nothing_of_ours(chromium, live_server, scene) -> None:
    ops = User.objects.create_superuser("ops", "ops@example.com", "pw-ops")
    paths = [
        reverse("admin:index"),
        "/admin/overview/",
        reverse("admin:delivery_delivery_changelist"),
        reverse("admin:delivery_delivery_change", args=[scene["delivery"].pk]),
        reverse("admin:webhooks_source_changelist"),
        reverse("admin:webhooks_source_change", args=[scene["source"].pk]),
        reverse("admin:tenants_tenant_changelist"),
        reverse("admin:webhooks_event_change", args=[scene["delivery"].event_id]),
        reverse("admin:delivery_replayjob_changelist"),
        reverse("two-factor-recovery-codes"),
        "/admin/django-rq/",
        "/admin/django-rq/queues/0/",
    ]
    context = _context(chromium, live_server, ops)
    try:
        refused = _visit(context, live_server, paths)
    finally:
        context.close()
    ours = {
        path: found for path, found in refused.items() if not path.startswith(THIRD_PARTY_INLINE)
    }
    assert ours == {}
    for path, found in refused.items():
        assert all(" inline " in item for item in found), (path, found)


def test_sign_in_pages_and_the_api_reference_refuse_nothing(
    chromium, live_server, scene, settings
) -> None:
    context = _context(chromium, live_server, None)
    try:
        assert _visit(context, live_server, ["/admin/login/", "/accounts/login/"]) == {}
        refused = _visit(context, live_server, ["/api/v1/docs"])
        # ReDoc drew the reference (its styles are the one thing inline the page allows)...
        context.pages[-1].wait_for_selector("text=Fair webhooks management API", timeout=15_000)
        # ...and was refused nothing but its logo from another site.
        assert all(
            item.startswith("img-src https://cdn.redoc.ly/")
            for item in refused.get("/api/v1/docs", [])
        ), refused
    finally:
        context.close()

    settings.ADMIN_REQUIRE_2FA = True
    enrolling = User.objects.create_superuser("new-op", "new@example.com", "pw-new-op")
    context = _context(chromium, live_server, enrolling)
    try:
        assert _visit(context, live_server, [reverse("two-factor-enrol")]) == {}
    finally:
        context.close()

"""The fairness-key guard: a source whose key looks unbounded stops auto-registering
tenants, warns, and recovers (webhooks.key_hygiene). Real Redis, real database."""

import json
import time

import pytest
from django.contrib.auth.models import User

from delivery.scheduler import reset_scheduler
from ingest import config_cache
from tenants.models import Tenant
from tests import signing
from tests.factories import make_endpoint, make_source, make_tenant
from tests.metrics_helpers import scrape, value
from webhooks import key_hygiene
from webhooks.models import Event, Source

pytestmark = pytest.mark.django_db(transaction=True)
SECRET = "guard-secret"


@pytest.fixture
def source() -> Source:
    source = make_source("orders", secret=SECRET, auto_register_tenants=True, auto_register_limit=4)
    source.destinations.add(make_endpoint(None, "http://127.0.0.1:9/app"))
    return source


def post(client, key: str) -> dict:
    body = json.dumps({"shop_id": key}).encode()
    response = client.post(
        "/ingest/orders/",
        data=body,
        content_type="application/json",
        HTTP_X_SIGNATURE=signing.hmac_hex(SECRET, body),
    )
    assert response.status_code == 202, response.content
    return response.json()


def fresh(source: Source) -> Source:
    return Source.objects.get(pk=source.pk)


def test_a_source_that_registers_too_many_tenants_is_suspended(client, source) -> None:
    known = make_tenant("known.example")
    for i in range(4):
        assert post(client, f"order-{i}")["lane"] == "tenant"

    tripped = post(client, "order-4")

    assert tripped["lane"] == "fallback"
    assert "suspended" in tripped["fallback_reason"]
    assert not Tenant.objects.filter(key="order-4").exists()
    suspended = fresh(source)
    assert suspended.auto_register_suspended_at is not None
    assert "4 tenants registered in the last hour (limit 4)" in (
        suspended.auto_register_suspended_reason
    )
    assert suspended.fallback_count == 1
    # Known tenants are untouched; further unknown keys keep using the fallback lane.
    assert post(client, "known.example")["tenant"] == known.key
    assert post(client, "order-5")["lane"] == "fallback"
    assert Tenant.objects.filter(registered_by=source).count() == 4
    assert Event.objects.filter(tenant=None).count() == 2  # nothing dropped


def test_counts_distinct_keys_seen_unknown_and_registered(client, source) -> None:
    make_tenant("known.example")
    for key in ["known.example", "known.example", "a", "a", "b"]:
        post(client, key)

    numbers = key_hygiene.counts([source])[source.pk]

    # "a" and "b" were unknown on arrival (then registered); repeats count once.
    assert (numbers.seen, numbers.unknown, numbers.registered, numbers.limit) == (3, 2, 2, 4)


def test_suspension_shows_in_the_admin_and_the_metrics(client, source) -> None:
    other = make_source("quiet", secret="q")
    for i in range(5):
        post(client, f"order-{i}")
    admin = User.objects.create_superuser("ops", password="pw")
    client.force_login(admin)

    listing = client.get("/admin/webhooks/source/").content.decode()
    index = client.get("/admin/").content.decode()
    change = client.get(f"/admin/webhooks/source/{source.pk}/change/").content.decode()
    overview = client.get("/admin/overview/").content.decode()
    client.logout()
    samples = scrape(client)

    assert "Source orders: auto-registration suspended" in listing
    assert "auto-registration suspended" in index
    assert "Auto-registration suspended since" in change
    assert "5 distinct keys seen, 5 of them unknown; 4 tenants registered (limit 4)" in change
    assert "auto-registration suspended since" in overview
    assert value(samples, "webhook_source_auto_registration_suspended", source="orders") == 1
    assert value(samples, "webhook_source_auto_registration_suspended", source="quiet") == 0
    assert value(samples, "webhook_source_tenants_registered_recent", source="orders") == 4
    assert value(samples, "webhook_source_keys_seen_recent", source="orders") == 5
    assert value(samples, "webhook_source_unknown_keys_recent", source="orders") == 5
    assert value(samples, "webhook_source_keys_seen_recent", source=other.slug) == 0


def test_an_operator_resumes_and_registrations_count_from_then(client, source) -> None:
    for i in range(5):
        post(client, f"order-{i}")
    client.force_login(User.objects.create_superuser("ops", password="pw"))

    response = client.post(
        "/admin/webhooks/source/",
        {"action": "resume_auto_registration", "_selected_action": [source.pk]},
    )

    assert response.status_code == 302
    resumed = fresh(source)
    assert resumed.auto_register_suspended_at is None
    assert resumed.auto_register_resumed_at is not None
    # The 4 registered before the resume no longer weigh on the limit.
    for i in range(4):
        assert post(client, f"shop-{i}.example")["lane"] == "tenant"
    assert post(client, "shop-4.example")["lane"] == "fallback"  # and the guard still works


def test_the_guard_resumes_by_itself_after_a_quiet_window(client, source, settings) -> None:
    settings.AUTO_REGISTER_WINDOW_SECONDS = 2
    for i in range(5):
        post(client, f"order-{i}")
    assert fresh(source).auto_register_suspended_at is not None
    assert post(client, "shop.example")["lane"] == "fallback"  # not a whole window yet

    time.sleep(3.1)  # a whole window passes, with no unknown keys in it

    assert post(client, "shop.example")["lane"] == "tenant"
    assert fresh(source).auto_register_suspended_at is None
    assert Tenant.objects.get(key="shop.example").registered_by == source


def test_the_guard_stays_suspended_while_unknown_keys_keep_coming(client, source, settings) -> None:
    settings.AUTO_REGISTER_WINDOW_SECONDS = 2
    for i in range(5):
        post(client, f"order-{i}")
    deadline = time.monotonic() + 2.5
    i = 100
    while time.monotonic() < deadline:  # the key is still unbounded: new ids all the time
        assert post(client, f"order-{i}")["lane"] == "fallback"
        i += 1
        time.sleep(0.1)

    assert post(client, "order-final")["lane"] == "fallback"
    assert fresh(source).auto_register_suspended_at is not None


def test_the_guard_needs_no_redis_to_trip(client, source, settings) -> None:
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens there
    reset_scheduler()
    try:
        for i in range(4):
            assert post(client, f"order-{i}")["lane"] == "tenant"
        assert post(client, "order-4")["lane"] == "fallback"
        assert key_hygiene.counts([source])[source.pk].seen is None
    finally:
        reset_scheduler()


def test_changing_the_fairness_key_in_the_admin_resumes_auto_registration(client) -> None:
    source = make_source("misconfigured", secret="", auto_register_tenants=True)
    key_hygiene.suspend(source, "1000 tenants registered in the last hour (limit 1000)")
    client.force_login(User.objects.create_superuser("ops", password="pw"))
    form = {
        "slug": source.slug,
        "name": "",
        "scheme": Source.HMAC_SHA256,
        "hmac_header": "X-Signature",
        "hmac_encoding": "hex",
        "hmac_prefix": "",
        "auto_register_tenants": "on",
        "is_active": "on",
        "secrets-TOTAL_FORMS": 0,
        "secrets-INITIAL_FORMS": 0,
    }
    url = f"/admin/webhooks/source/{source.pk}/change/"

    unchanged = client.post(url, {**form, "fairness_key": source.fairness_key})
    assert unchanged.status_code == 302
    assert fresh(source).auto_register_suspended_at is not None  # other edits do not resume

    fixed = client.post(url, {**form, "fairness_key": "body.shop.domain"})
    assert fixed.status_code == 302
    resumed = fresh(source)
    assert resumed.fairness_key == "body.shop.domain"
    assert resumed.auto_register_suspended_at is None
    assert resumed.auto_register_resumed_at is not None


def _pfadds(redis_conn) -> int:
    return redis_conn.info("commandstats").get("cmdstat_pfadd", {}).get("calls", 0)


def test_a_key_counted_once_in_a_bucket_is_not_sent_again(client, source, redis_conn) -> None:
    """A HyperLogLog ignores a key it holds: a flood from one known tenant costs one
    round trip per bucket, not one per event, and the counts are the same."""
    # A source an earlier test left kept would be counted once more before ingest's
    # write finds it gone (ingest.config_cache): not what is measured here.
    config_cache.clear()
    make_tenant("known")
    redis_conn.config_resetstat()
    for key in ("known", "known", "new-1", "new-1", "known", "new-1"):
        post(client, key)
    # known: SEEN once; new-1: SEEN + UNKNOWN as it registers, then known: nothing more
    assert _pfadds(redis_conn) == 3
    numbers = key_hygiene.counts([source])[source.pk]
    assert (numbers.seen, numbers.unknown, numbers.registered) == (2, 1, 1)


def test_a_new_bucket_counts_the_key_again(source, redis_conn, monkeypatch) -> None:
    now = [1_000_000.0]
    monkeypatch.setattr(key_hygiene.time, "time", lambda: now[0])
    redis_conn.config_resetstat()
    key_hygiene.note_key(source, "k", known=True)
    key_hygiene.note_key(source, "k", known=True)
    now[0] += key_hygiene._bucket_seconds(key_hygiene.window_seconds())
    key_hygiene.note_key(source, "k", known=True)
    assert _pfadds(redis_conn) == 2

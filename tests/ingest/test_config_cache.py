"""Ingest's kept look-ups (ingest.config_cache): a change to the configuration applies to
the very next request, however it is made, and the hot paths' own writes do not throw
away what is kept."""

import datetime as dt
import types
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from delivery.models import Delivery
from delivery.pipeline import endpoint_health
from ingest import config_cache
from ingest.accept import load_source, tenant_by_key
from tenants.models import Endpoint, Tenant
from tests.factories import make_endpoint, make_source, make_tenant
from tests.ingest.test_ingest import post_shopify
from webhooks.models import Event, Source, SourceSecret

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "shpss_test_secret"
# Columns whose change must not change the version: they are written on hot paths
# (webhooks migration 0006) and ingest does not use them. Every other column must.
UNWATCHED = {
    "webhooks_source": {"fallback_count"},
    "tenants_endpoint": {
        "consecutive_failures",
        "failing_since",
        "last_success_at",
        "last_failure_at",
    },
}


@pytest.fixture(autouse=True)
def nothing_kept():
    """What earlier tests kept would cost one more statement (a version to compare)."""
    config_cache.clear()


@pytest.fixture
def shop():
    source = make_source(
        "shop", secret=SECRET, scheme=Source.SHOPIFY, fairness_key="header:X-Shopify-Shop-Domain"
    )
    endpoint = make_endpoint(None, "http://127.0.0.1:9/app", max_in_flight=4)
    source.destinations.add(endpoint)
    make_tenant("a.example")
    return source, endpoint


def _statements(client, body: bytes, **extra) -> tuple[int, int]:
    """(status, statements) of one signed POST."""
    with CaptureQueriesContext(connection) as captured:
        response = post_shopify(client, body, **extra)
    return response.status_code, len(captured.captured_queries)


def _kept(client) -> None:
    """A first request reads and keeps the look-ups; the next one uses them."""
    first = _statements(client, b'{"id": "warm-1"}')
    second = _statements(client, b'{"id": "warm-2"}')
    assert first[0] == second[0] == 202
    # PostgreSQL: the write checks the version it assumed (one statement in all);
    # SQLite: the version is read first.
    saved = 2 if connection.vendor == "sqlite" else 3
    assert second[1] == first[1] - saved, (first, second)


def _rows() -> dict[str, tuple[type, int]]:
    source = make_source("watched", secret="k")
    endpoint = make_endpoint(make_tenant("watched-tenant"))
    source.destinations.add(endpoint)
    through = Source.destinations.through.objects.get(source=source)
    return {
        "webhooks_source": (Source, source.pk),
        "webhooks_sourcesecret": (SourceSecret, SourceSecret.objects.get(source=source).pk),
        "webhooks_source_destinations": (Source.destinations.through, through.pk),
        "tenants_tenant": (Tenant, endpoint.tenant_id),
        "tenants_endpoint": (Endpoint, endpoint.pk),
    }


def test_every_column_but_the_hot_ones_changes_the_version() -> None:
    """An UPDATE of each column in turn, the value set to itself: the version changes for
    every column ingest may read, and not for the hot ones. A column added to one of these
    models without re-creating the triggers fails here (as do triggers a rebuilt SQLite
    table lost)."""
    quote = connection.ops.quote_name
    for table, (model, pk) in _rows().items():
        for field in model._meta.concrete_fields:
            before = config_cache.current_version()
            with connection.cursor() as cursor:
                cursor.execute(
                    f"UPDATE {quote(table)} SET {quote(field.column)} = {quote(field.column)}"  # noqa: S608
                    f" WHERE {quote('id')} = %s",
                    [pk],
                )
            changed = config_cache.current_version() != before
            hot = field.column in UNWATCHED.get(table, set())
            assert changed is not hot, f"{table}.{field.column}: changed={changed}"


def test_insert_and_delete_change_the_version_but_a_new_tenant_does_not() -> None:
    before = config_cache.current_version()
    tenant = make_tenant("new-key")  # auto-registration's write: nothing kept is wrong
    assert config_cache.current_version() == before
    endpoint = make_endpoint(tenant)
    assert config_cache.current_version() != before
    before = config_cache.current_version()
    endpoint.delete()
    assert config_cache.current_version() != before


def test_the_next_request_uses_what_is_kept(client, shop) -> None:
    """And the hot paths' writes (a fallback event's count, an endpoint's failure streak)
    keep it."""
    _kept(client)
    _, endpoint = shop
    endpoint_health.record_failure(endpoint, "refused")
    endpoint_health.record_success(Endpoint.objects.get(pk=endpoint.pk))
    assert post_shopify(client, b'{"id": "no-key"}', shop=None).json()["lane"] == "fallback"
    status, statements = _statements(client, b'{"id": "after"}')
    assert status == 202
    assert statements == (5 if connection.vendor == "sqlite" else 1)


def test_a_deleted_secret_is_refused_by_the_next_request(client, shop) -> None:
    source, _ = shop
    _kept(client)
    SourceSecret.objects.filter(source=source).delete()
    SourceSecret.objects.create(source=source, secret="shpss_new")
    assert post_shopify(client, b'{"id": 1}').status_code == 401
    assert post_shopify(client, b'{"id": 2}', secret="shpss_new").status_code == 202


def test_a_kept_secret_still_expires_on_time(client, shop, monkeypatch) -> None:
    source, _ = shop
    expires = timezone.now() + timedelta(hours=1)
    SourceSecret.objects.filter(source=source).update(expires_at=expires)
    _kept(client)
    later = types.SimpleNamespace(now=lambda: expires + timedelta(microseconds=1))
    monkeypatch.setattr(config_cache, "timezone", later)
    response = post_shopify(client, b'{"id": "late"}')
    assert response.status_code == 401, response.content


def test_a_source_switched_off_by_an_update_is_gone_for_the_next_request(client, shop) -> None:
    _kept(client)
    Source.objects.filter(slug="shop").update(is_active=False)
    assert post_shopify(client, b'{"id": 1}').status_code == 404


def test_an_endpoint_disabled_by_the_workers_holds_the_next_event(client, shop) -> None:
    _, endpoint = shop
    _kept(client)
    assert endpoint_health.disable(endpoint, "too many failures")
    event_id = post_shopify(client, b'{"id": "held"}').json()["id"]
    assert Delivery.objects.get(event_id=event_id).status == Delivery.Status.HELD


def test_a_new_weight_is_read_by_the_next_look_up(shop) -> None:
    assert tenant_by_key("a.example", config_cache.lookups()).weight == 1
    Tenant.objects.filter(key="a.example").update(weight=7)
    assert tenant_by_key("a.example", config_cache.lookups()).weight == 7


def test_what_a_rolled_back_change_read_is_never_used(shop) -> None:
    outside = config_cache.current_version()
    with transaction.atomic():
        Source.objects.filter(slug="shop").update(name="inside")
        inside = config_cache.lookups()
        assert inside.version != outside
        assert load_source("shop", inside)[0].name == "inside"  # kept under `inside`
        transaction.set_rollback(True)
    assert config_cache.current_version() == outside
    assert load_source("shop", config_cache.lookups())[0].name == ""


def test_an_absence_is_never_kept(shop) -> None:
    lookups = config_cache.lookups()
    assert tenant_by_key("b.example", lookups) is None
    make_tenant("b.example")  # no new version (see above), found at once
    assert tenant_by_key("b.example", lookups) is not None


def test_an_unknown_source_costs_one_statement(client, shop) -> None:
    """The 404 floor: the version comes with the source's (absent) rows."""
    _kept(client)
    with CaptureQueriesContext(connection) as captured:
        response = client.post("/ingest/nope/", data=b"{}", content_type="application/json")
    assert response.status_code == 404
    assert len(captured.captured_queries) == 1


def test_without_a_version_every_look_up_reads_the_database(shop, settings) -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {config_cache.VERSION_TABLE}")  # noqa: S608
    assert config_cache.current_version() is None
    for _ in range(2):
        lookups = config_cache.lookups()
        with CaptureQueriesContext(connection) as captured:
            assert load_source("shop", lookups)[0] is not None
            assert tenant_by_key("a.example", lookups) is not None
        assert len(captured.captured_queries) == 2  # nothing kept: both read each time
    make_tenant("c.example").delete()  # a change puts the row back
    assert config_cache.current_version() is not None
    settings.INGEST_CONFIG_CACHE = False
    assert config_cache.current_version() is None
    assert config_cache.lookups().version is None


def _at(version: int) -> config_cache.Lookups:
    lookups = config_cache.Lookups()
    lookups.version = version
    return lookups


def test_an_entry_from_another_version_is_read_again(shop) -> None:
    calls = []

    def load() -> str:
        calls.append(1)
        return "value"

    _at(1).tenant("k", load)
    _at(1).tenant("k", load)
    _at(2).tenant("k", load)
    assert len(calls) == 2


def test_the_oldest_entries_go_past_the_bound(monkeypatch) -> None:
    config_cache.clear()
    monkeypatch.setattr(config_cache, "MAX_ENTRIES", 2)
    lookups = _at(1)
    for key in ("a", "b", "c"):
        lookups.tenant(key, lambda key=key: key)
    lookups.tenant("b", lambda: "b")  # a use does not move it; the oldest still go first
    assert lookups.tenant("a", lambda: "read again") == "read again"
    assert lookups.tenant("c", lambda: "read again") == "c"


def test_unexpired_keeps_the_order_and_drops_the_past() -> None:
    now = dt.datetime(2026, 12, 5, tzinfo=dt.UTC)
    secrets = [("a", None), ("b", now), ("c", now + timedelta(seconds=1))]
    assert config_cache.unexpired(secrets, now) == ["a", "c"]


def test_a_write_under_a_version_gone_by_starts_again(client, shop) -> None:
    """PostgreSQL: the request assumes the version its process saw last and uses what is
    kept; the endpoint is disabled meanwhile, so the write's check fails, nothing is
    written, and the request starts again with the version read first."""
    _, endpoint = shop
    _kept(client)
    Endpoint.objects.filter(pk=endpoint.pk).update(max_in_flight=2, enabled=False)
    with CaptureQueriesContext(connection) as captured:
        event_id = post_shopify(client, b'{"id": "again"}').json()["id"]
    assert Delivery.objects.get(event_id=event_id).status == Delivery.Status.HELD
    assert Event.objects.filter(payload=b'{"id": "again"}').count() == 1
    sql = [one["sql"] for one in captured.captured_queries]
    if connection.vendor == "postgresql":
        assert "webhooks_config_check(" in sql[0] and "webhooks_config_version" in sql[1], sql


def test_a_refusal_on_what_was_kept_is_checked_first(client, shop) -> None:
    """A secret rotated since the process kept the source: the new signature fails
    against the kept secrets, and the request must not answer 401 on that alone."""
    source, _ = shop
    _kept(client)
    SourceSecret.objects.filter(source=source).update(secret="shpss_rotated")
    assert post_shopify(client, b'{"id": "rotated"}', secret="shpss_rotated").status_code == 202
    assert post_shopify(client, b'{"id": "old"}').status_code == 401


def test_no_tenant_is_registered_on_a_source_kept_under_a_gone_version(client, shop) -> None:
    """Registering a tenant writes before the event does, so no write's check could undo
    it: auto-registration switched off since the source was kept must apply, and a source
    re-created under the same name must be the one a new tenant names."""
    source, _ = shop
    Source.objects.filter(pk=source.pk).update(auto_register_tenants=True)
    _kept(client)
    Source.objects.filter(pk=source.pk).update(auto_register_tenants=False)
    answer = post_shopify(client, b'{"id": "off"}', shop="new-1.example").json()
    assert answer["lane"] == "fallback" and not Tenant.objects.filter(key="new-1.example")

    Source.objects.filter(pk=source.pk).update(auto_register_tenants=True)
    assert post_shopify(client, b'{"id": "kept again"}').status_code == 202
    destinations = list(source.destinations.all())
    Event.objects.filter(source=source).delete()  # a source's events protect it
    source.delete()
    again = make_source(
        "shop",
        secret=SECRET,
        scheme=Source.SHOPIFY,
        fairness_key="header:X-Shopify-Shop-Domain",
        auto_register_tenants=True,
    )
    again.destinations.add(*destinations)
    answer = post_shopify(client, b'{"id": "re-created"}', shop="new-2.example").json()
    assert answer["lane"] == "tenant"
    assert Tenant.objects.get(key="new-2.example").registered_by_id == again.pk

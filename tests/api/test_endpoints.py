"""Endpoints through the API: the portal's rules (SSRF check, audit, held deliveries
resume), caps within what a tenant may set, secrets shown once and masked after."""

from datetime import timedelta

import pytest
from django.utils import timezone

from delivery.models import Attempt, Delivery
from delivery.scheduler import get_scheduler
from ingest.publish import publish
from tenants.models import AuditEntry, Endpoint
from tests.api.helpers import Api, operator_token, tenant_token
from tests.factories import make_endpoint, make_tenant
from webhooks.models import ApiToken

pytestmark = pytest.mark.django_db(transaction=True)
HOOK = "http://127.0.0.1:9/hook"


@pytest.fixture
def acme():
    return make_tenant("acme")


@pytest.fixture
def loopback_allowed(settings):
    settings.ALLOW_PRIVATE_DESTINATIONS = True


def test_create_answers_the_secret_once_and_lists_it_masked_after(acme, loopback_allowed) -> None:
    api = Api(tenant_token(acme))
    made = api.post(
        "/api/v1/tenants/acme/endpoints",
        {"url": HOOK, "event_types": ["order.created", "order.paid", "order.created"]},
    )
    assert made.status_code == 201, made.json()
    body = made.json()
    assert body["secret"].startswith("whsec_")
    assert body["event_types"] == ["order.created", "order.paid"]
    endpoint = Endpoint.objects.get(pk=body["id"])
    assert endpoint.tenant == acme and endpoint.secrets.get().secret == body["secret"]
    listed = api.get(f"/api/v1/tenants/acme/endpoints/{endpoint.pk}/secrets").json()
    assert len(listed) == 1 and body["secret"] not in listed[0]["secret"]
    assert "…" in listed[0]["secret"]
    revealed = api.post(f"/api/v1/tenants/acme/endpoints/{endpoint.pk}/secrets/reveal")
    assert revealed.json()[0]["secret"] == body["secret"]
    actions = list(
        AuditEntry.objects.filter(tenant=acme).order_by("id").values_list("action", "via")
    )
    assert actions == [
        (AuditEntry.Action.ENDPOINT_CREATED, "api"),
        (AuditEntry.Action.SECRET_REVEALED, "api"),
    ]


def test_the_ssrf_guard_refuses_private_addresses_by_default(acme) -> None:
    api = Api(operator_token())
    answer = api.post("/api/v1/tenants/acme/endpoints", {"url": HOOK})
    assert answer.status_code == 422
    assert answer.json()["errors"][0]["field"] == "url"
    assert not Endpoint.objects.exists()


def test_a_tenant_token_sets_caps_only_within_the_operators_limits(
    acme, loopback_allowed, settings
) -> None:
    settings.API_TENANT_MAX_IN_FLIGHT = 10
    tenant_api, operator_api = Api(tenant_token(acme)), Api(operator_token())
    endpoint = make_endpoint(acme, HOOK)
    path = f"/api/v1/tenants/acme/endpoints/{endpoint.pk}"
    too_many = tenant_api.patch(path, {"max_in_flight": 50, "rate_limit_per_second": None})
    assert too_many.status_code == 422
    fields = {error["field"] for error in too_many.json()["errors"]}
    assert fields == {"max_in_flight", "rate_limit_per_second"}
    assert tenant_api.patch(path, {"max_in_flight": 10}).json()["max_in_flight"] == 10
    assert operator_api.patch(path, {"max_in_flight": 50}).json()["max_in_flight"] == 50
    endpoint.refresh_from_db()
    assert endpoint.max_in_flight == 50
    # The retry cap can never exceed the cap, whoever asks.
    worse = operator_api.patch(path, {"retry_max_in_flight": 60})
    assert worse.status_code == 422
    changed = AuditEntry.objects.filter(action=AuditEntry.Action.ENDPOINT_CHANGED)
    assert [entry.detail["new"] for entry in changed.order_by("id")] == [
        {"max_in_flight": 10},
        {"max_in_flight": 50},
    ]


def test_disable_holds_deliveries_and_enable_resumes_them(acme, loopback_allowed) -> None:
    api = Api(tenant_token(acme))
    endpoint = make_endpoint(acme, HOOK)
    path = f"/api/v1/tenants/acme/endpoints/{endpoint.pk}"
    assert api.post(f"{path}/disable", {}).status_code == 422  # the reason is required
    disabled = api.post(f"{path}/disable", {"reason": "maintenance window"})
    assert disabled.status_code == 200
    assert disabled.json()["enabled"] is False
    assert "maintenance window" in disabled.json()["disabled_reason"]
    for index in range(3):
        publish(acme, "order.created", {"n": index})
    assert set(Delivery.objects.values_list("status", flat=True)) == {Delivery.Status.HELD}
    enabled = api.post(f"{path}/enable")
    assert enabled.json()["resumed"] == 3
    assert enabled.json()["endpoint"]["enabled"] is True
    assert set(Delivery.objects.values_list("status", flat=True)) == {Delivery.Status.PENDING}
    assert get_scheduler().snapshot().fresh_depth == 3


def test_rotation_answers_the_new_secret_and_keeps_the_old_one_signing(
    acme, loopback_allowed
) -> None:
    api = Api(tenant_token(acme))
    endpoint = make_endpoint(acme, HOOK)
    old = endpoint.secrets.get()
    rotated = api.post(
        f"/api/v1/tenants/acme/endpoints/{endpoint.pk}/secrets/rotate", {"overlap_hours": 2}
    )
    assert rotated.status_code == 201
    assert rotated.json()["secret"].startswith("whsec_")
    old.refresh_from_db()
    assert old.expires_at is not None and old.is_active()
    listed = api.get(f"/api/v1/tenants/acme/endpoints/{endpoint.pk}/secrets").json()
    assert len(listed) == 2
    refused = api.post(
        f"/api/v1/tenants/acme/endpoints/{endpoint.pk}/secrets/rotate", {"overlap_hours": 0}
    )
    assert refused.status_code == 422


def test_a_read_only_token_reads_but_neither_reveals_nor_changes(acme) -> None:
    endpoint = make_endpoint(acme, HOOK)
    api = Api(tenant_token(acme, access=ApiToken.Access.READ))
    path = f"/api/v1/tenants/acme/endpoints/{endpoint.pk}"
    assert api.get(path).status_code == 200
    assert api.post(f"{path}/secrets/reveal").status_code == 403
    assert api.patch(path, {"description": "x"}).status_code == 403
    assert api.delete(path).status_code == 403
    assert api.post(f"{path}/disable", {"reason": "x"}).status_code == 403
    endpoint.refresh_from_db()
    assert endpoint.enabled and endpoint.description == ""
    assert not AuditEntry.objects.exists()


def test_deleting_an_endpoint_with_waiting_work_asks_first(acme) -> None:
    endpoint = make_endpoint(acme, HOOK)
    publish(acme, "order.created", {})
    api = Api(operator_token())
    path = f"/api/v1/tenants/acme/endpoints/{endpoint.pk}"
    refused = api.delete(path)
    assert refused.status_code == 409
    assert "1 deliveries still wait" in refused.json()["detail"]
    assert Endpoint.objects.filter(pk=endpoint.pk).exists()
    assert api.delete(f"{path}?discard_waiting=true").status_code == 204
    assert not Endpoint.objects.filter(pk=endpoint.pk).exists()
    entry = AuditEntry.objects.get(action=AuditEntry.Action.ENDPOINT_DELETED)
    assert entry.detail["discarded_waiting"] == 1
    assert api.get(path).status_code == 404


def test_stats_count_the_endpoints_recent_attempts(acme) -> None:
    endpoint = make_endpoint(acme, HOOK)
    publish(acme, "order.created", {})
    delivery = Delivery.objects.get()
    two_minutes_ago = timezone.now() - timedelta(minutes=2)
    for number, (outcome, ms, status, started) in enumerate(
        [
            ("delivered", 10, 200, None),
            ("delivered", 30, 200, None),
            ("retry", 200, 503, None),
            ("retry", 5, None, None),  # no answer: a refused connection
            ("retry", 5, 429, two_minutes_ago),  # in the hour, not the minute
        ],
        start=1,
    ):
        Attempt.objects.create(
            delivery=delivery,
            endpoint=endpoint,
            number=number,
            outcome=outcome,
            duration_ms=ms,
            status_code=status,
            started_at=started or timezone.now(),
        )
    stats = Api(operator_token()).get(f"/api/v1/tenants/acme/endpoints/{endpoint.pk}/stats")
    hour = stats.json()["hour"]
    assert (hour["attempts"], hour["delivered"], hour["p50_ms"], hour["p95_ms"]) == (5, 2, 10, 200)
    assert hour["success_rate"] == pytest.approx(2 / 5)
    assert stats.json()["last_minute"] == {
        "attempts": 4,
        "answered_429": 0,
        "answered_503": 1,
        "no_answer": 1,
        "capped": False,
    }


@pytest.mark.parametrize("adaptive", [True, False])
def test_stats_say_the_endpoints_concurrency_and_its_adaptive_limit(
    acme, settings, adaptive
) -> None:
    settings.DELIVERY_ADAPTIVE_CONCURRENCY = "all" if adaptive else "off"
    endpoint = make_endpoint(acme, HOOK, max_in_flight=40)
    path = f"/api/v1/tenants/acme/endpoints/{endpoint.pk}/stats"
    api = Api(operator_token())
    assert api.get(path).json()["concurrency"] is None  # nothing in the schedule yet
    publish(acme, "order.created", {})
    concurrency = api.get(path).json()["concurrency"]
    assert (concurrency["in_flight"], concurrency["max_in_flight"]) == (0, 40)
    assert concurrency["adaptive_limit"] == (4 if adaptive else None)  # a new limit starts low
    assert concurrency["backed_off_at"] is None
    # A full retry budget: twice the limit that binds.
    assert concurrency["retry_budget"] == concurrency["retry_budget_cap"] == (8 if adaptive else 80)


def test_another_tenants_endpoint_is_not_found_by_any_route(acme) -> None:
    other = make_tenant("other")
    theirs = make_endpoint(other, HOOK)
    api = Api(tenant_token(acme))
    for path in (
        f"/api/v1/tenants/acme/endpoints/{theirs.pk}",
        f"/api/v1/tenants/other/endpoints/{theirs.pk}",
    ):
        assert api.get(path).status_code == 404
        assert api.patch(path, {"description": "mine now"}).status_code == 404
        assert api.post(f"{path}/secrets/reveal").status_code == 404
        assert api.delete(path).status_code == 404
    theirs.refresh_from_db()
    assert theirs.description == "" and not AuditEntry.objects.exists()


def test_endpoints_are_paged_in_creation_order(acme) -> None:
    made = [make_endpoint(acme, f"{HOOK}/{index}").pk for index in range(5)]
    api = Api(operator_token())
    first = api.get("/api/v1/tenants/acme/endpoints?limit=2").json()
    second = api.get(f"/api/v1/tenants/acme/endpoints?limit=2&cursor={first['next_cursor']}")
    third = api.get(
        f"/api/v1/tenants/acme/endpoints?limit=2&cursor={second.json()['next_cursor']}"
    ).json()
    ids = [e["id"] for page in (first, second.json(), third) for e in page["data"]]
    assert ids == made and third["next_cursor"] is None


def test_test_events_are_limited_per_endpoint(acme) -> None:
    endpoint = make_endpoint(acme, HOOK)
    api = Api(tenant_token(acme))
    path = f"/api/v1/tenants/acme/endpoints/{endpoint.pk}/test"
    answers = [api.post(path).status_code for _ in range(11)]
    assert answers == [202] * 10 + [429]
    assert Delivery.objects.filter(endpoint=endpoint).count() == 10


def test_a_tenant_subscribes_an_endpoint_to_its_operational_events(acme, loopback_allowed) -> None:
    api = Api(tenant_token(acme))
    made = api.post(
        "/api/v1/tenants/acme/endpoints",
        {"url": HOOK, "operational_events": ["delivery.dead", "endpoint.disabled"]},
    )
    assert made.status_code == 201, made.json()
    assert made.json()["operational_events"] == ["delivery.dead", "endpoint.disabled"]
    path = f"/api/v1/tenants/acme/endpoints/{made.json()['id']}"
    refused = api.patch(path, {"operational_events": ["tenant.secrets"]})
    assert refused.status_code == 422
    assert refused.json()["errors"][0]["field"].startswith("operational_events")
    changed = api.patch(path, {"operational_events": ["*"], "send_trace_context": True}).json()
    assert (changed["operational_events"], changed["send_trace_context"]) == (["*"], True)
    assert Endpoint.objects.get().operational_events == "*"
    assert api.patch(path, {"operational_events": []}).json()["operational_events"] == []


def test_an_operator_fixes_an_endpoints_cap_through_the_api(acme, settings) -> None:
    settings.DELIVERY_ADAPTIVE_CONCURRENCY = "all"
    endpoint = make_endpoint(acme, HOOK, max_in_flight=40)
    path = f"/api/v1/tenants/acme/endpoints/{endpoint.pk}"
    api = Api(operator_token())
    assert api.get(path).json()["fixed_max_in_flight"] is False
    answer = api.patch(path, {"fixed_max_in_flight": True})
    assert answer.status_code == 200, answer.content
    assert answer.json()["fixed_max_in_flight"] is True
    endpoint.refresh_from_db()
    assert endpoint.fixed_max_in_flight and not endpoint.adapts_concurrency
    publish(acme, "order.created", {})
    concurrency = api.get(path + "/stats").json()["concurrency"]
    assert concurrency["adaptive_limit"] is None  # fixed: its cap of 40 is its limit


def test_an_endpoint_without_a_cap_of_its_own_says_the_platforms(
    acme, loopback_allowed, settings
) -> None:
    settings.DELIVERY_ADAPTIVE_CONCURRENCY = "all"
    settings.DELIVERY_ADAPTIVE_CEILING, settings.DELIVERY_MAX_IN_FLIGHT = 48, 2
    api = Api(operator_token())
    made = api.post("/api/v1/tenants/acme/endpoints", {"url": HOOK})
    assert made.status_code == 201, made.json()
    assert (made.json()["max_in_flight"], made.json()["in_flight_cap"]) == (None, 48)
    path = f"/api/v1/tenants/acme/endpoints/{made.json()['id']}"
    fixed = api.patch(path, {"fixed_max_in_flight": True}).json()
    assert (fixed["max_in_flight"], fixed["in_flight_cap"]) == (None, 2)  # fixed: no ceiling
    own = api.patch(path, {"max_in_flight": 30}).json()
    assert (own["max_in_flight"], own["in_flight_cap"]) == (30, 30)
    cleared = api.patch(path, {"max_in_flight": None, "retry_max_in_flight": 3})
    assert cleared.status_code == 422  # over the platform's fixed cap of 2 that now applies
    assert "cap (2)" in cleared.json()["errors"][0]["detail"]
    assert Endpoint.objects.get().max_in_flight == 30  # nothing of a refused change stays
    assert api.patch(path, {"max_in_flight": None}).json()["in_flight_cap"] == 2


def test_the_api_refuses_a_url_that_is_not_a_uri(acme, loopback_allowed) -> None:
    api = Api(operator_token())
    refused = api.post("/api/v1/tenants/acme/endpoints", {"url": "http://127.0.0.1:9/a^b{c}"})
    assert refused.status_code == 422
    (error,) = refused.json()["errors"]
    assert error["field"] == "url" and "RFC 3986" in error["detail"]
    made = api.post("/api/v1/tenants/acme/endpoints", {"url": "http://127.0.0.1:9/a%5Eb%7Bc%7D"})
    assert made.status_code == 201, made.json()
    assert Endpoint.objects.get().url == "http://127.0.0.1:9/a%5Eb%7Bc%7D"

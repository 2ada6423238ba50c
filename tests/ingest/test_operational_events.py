"""Operational events: the platform's news about itself, signed and delivered through its
own lane to the operator's endpoints and to each tenant's own, once per change of state."""

import json

import pytest
from django.db import transaction

from core import operational
from core.operational import Announcement
from delivery.models import Delivery
from delivery.pipeline import endpoint_health
from delivery.replays import window as replays
from ingest.operational import OPERATIONAL_TENANT_KEY, publish
from tenants.models import Endpoint, EndpointSecret
from tests import signing
from tests.delivery_helpers import wait_until
from tests.factories import make_endpoint, make_source, make_tenant
from tests.http_receivers import Recorder, Reply
from webhooks import key_hygiene
from webhooks.models import Event

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def local_receivers(settings) -> None:
    settings.ALLOW_PRIVATE_DESTINATIONS = True
    settings.RETRY_SCHEDULE_SECONDS = [0.1] * 8
    settings.RETRY_JITTER = 0.0
    settings.ENDPOINT_FAILING_AFTER_FAILURES = 3
    settings.ENDPOINT_DISABLE_AFTER_FAILURES = 100


def operational_events(endpoint: Endpoint) -> list[dict]:
    """The operational events stored for `endpoint`, oldest first, as their bodies."""
    deliveries = Delivery.objects.filter(endpoint=endpoint, tenant__key=OPERATIONAL_TENANT_KEY)
    return [
        json.loads(bytes(delivery.event.payload))
        for delivery in deliveries.select_related("event").order_by("id")
    ]


def types(endpoint: Endpoint) -> list[str]:
    return [body["type"] for body in operational_events(endpoint)]


def test_a_failing_endpoint_is_announced_once_then_its_recovery_signed_to_the_operator(
    engine,
) -> None:
    with Recorder() as operator_receiver, Recorder(*[Reply(500)] * 6, Reply(200)) as broken:
        tenant = make_tenant("acme")
        endpoint = make_endpoint(tenant, broken.url + "/hook")
        operator = make_endpoint(None, operator_receiver.url + "/ops", operational_events="*")
        Event.objects.all().delete()
        from ingest.publish import publish as publish_event

        publish_event(tenant, "order.created", {"n": 1})
        publish_event(tenant, "order.created", {"n": 2})
        engine()
        assert wait_until(lambda: types(operator) == ["endpoint.failing", "endpoint.recovered"])
        requests = operator_receiver.wait_for(2)
    # Six failures in all: one change of state to failing, one back; not one per failure.
    assert len(broken.requests) >= 7
    failing, recovered = (json.loads(request.body) for request in requests[:2])
    assert failing["tenant"] == "acme"
    assert failing["data"]["endpoint"] == {
        "id": endpoint.pk,
        "url": broken.url + "/hook",
        "tenant_id": tenant.pk,
    }
    assert failing["data"]["consecutive_failures"] == 3
    assert recovered["type"] == "endpoint.recovered"
    [secret] = EndpointSecret.objects.filter(endpoint=operator).values_list("secret", flat=True)
    for request in requests[:2]:
        headers = request.headers
        assert headers["webhook-event-type"] in ("endpoint.failing", "endpoint.recovered")
        expected = signing.standard_webhooks(
            secret, headers["webhook-id"], int(headers["webhook-timestamp"]), request.body
        )
        assert headers["webhook-signature"] == expected


def test_each_tenant_hears_of_its_own_trouble_and_never_of_anothers() -> None:
    acme, globex = make_tenant("acme"), make_tenant("globex")
    acme_ops = make_endpoint(acme, operational_events="delivery.dead")
    globex_ops = make_endpoint(globex, operational_events="*")
    operator = make_endpoint(None, operational_events="delivery.dead,endpoint.disabled")
    other_operator = make_endpoint(None, operational_events="replay.finished")
    dead = Announcement(operational.DELIVERY_DEAD, acme.pk, {"delivery_id": "d1"})
    disabled = Announcement(operational.ENDPOINT_DISABLED, acme.pk, {"reason": "gone"})
    assert publish([dead, disabled]) == 2
    assert types(acme_ops) == ["delivery.dead"]  # it did not subscribe to the other
    assert sorted(types(operator)) == ["delivery.dead", "endpoint.disabled"]
    assert types(globex_ops) == [] and types(other_operator) == []
    # They wait in the platform's lane, not in acme's: a burst cannot hold acme's work.
    assert {d.tenant.key for d in Delivery.objects.select_related("tenant")} == {
        OPERATIONAL_TENANT_KEY
    }


def test_an_endpoint_for_operational_events_gets_none_of_its_tenants_own_events() -> None:
    from ingest.publish import publish as publish_event

    tenant = make_tenant("acme")
    ops = make_endpoint(tenant, operational_events="*")
    ordinary = make_endpoint(tenant)
    accepted = publish_event(tenant, "order.created", {"n": 1})
    assert accepted.deliveries == 1
    assert list(Delivery.objects.values_list("endpoint_id", flat=True)) == [ordinary.pk]
    assert not Delivery.objects.filter(endpoint=ops).exists()


def test_nothing_is_said_of_a_change_that_rolled_back() -> None:
    operator = make_endpoint(None, operational_events="*")
    with pytest.raises(RuntimeError), transaction.atomic():
        endpoint_health.disable(make_endpoint(make_tenant("acme")), "gone")
        raise RuntimeError("rolled back")
    assert types(operator) == []
    endpoint_health.disable(make_endpoint(make_tenant("globex")), "gone")
    assert types(operator) == ["endpoint.disabled"]


def test_an_endpoint_taking_operational_events_is_not_news_about_itself() -> None:
    operator = make_endpoint(None, operational_events="*")
    assert endpoint_health.disable(operator, "gone")
    assert types(operator) == []


def test_a_source_whose_key_looks_unbounded_is_the_operators_news_alone() -> None:
    tenant = make_tenant("acme")
    tenant_ops = make_endpoint(tenant, operational_events="*")
    operator = make_endpoint(None, operational_events="source.key_unbounded")
    source = make_source("shop")
    key_hygiene.suspend(source, "1000 tenants registered in the last hour")
    key_hygiene.suspend(source, "again: no change of state, no news")
    [body] = operational_events(operator)
    assert body["tenant"] is None
    assert body["data"]["source"] == "shop"
    assert types(tenant_ops) == []


def test_a_finished_replay_is_announced_to_its_tenant() -> None:
    from datetime import timedelta

    from django.utils import timezone

    tenant = make_tenant("acme")
    ops = make_endpoint(tenant, operational_events="replay.finished")
    now = timezone.now()
    window = replays.Window(start=now - timedelta(hours=1), end=now)
    job = replays.start(tenant, window, user=None, via="test")
    replays.feed_replays()  # nothing in the window: the first feed finishes it
    replays.feed_replays()  # a second sweep finds it finished: no second announcement
    [body] = operational_events(ops)
    assert body["type"] == "replay.finished"
    assert body["data"]["replay_id"] == job.pk


def test_a_burst_of_operational_events_takes_only_its_own_lanes_turns(scheduler_shards) -> None:
    """10,000 operational deliveries queued first, then 20 tenants' own: every tenant's
    delivery is handed out as soon as without the burst, give or take one turn of the
    burst's lane per rotation."""
    from delivery.scheduler import get_scheduler

    tenants = [make_tenant(f"shop-{n}") for n in range(20)]
    operator = make_endpoint(None, operational_events="*", max_in_flight=1000)
    for tenant in tenants:
        make_endpoint(tenant, max_in_flight=1000)

    def tenant_positions() -> list[int]:
        scheduler, order = get_scheduler(), []
        while True:
            picked = scheduler.pick("burst-test", 50)
            if not picked.leases:
                break
            order.extend(lease.tenant_id for lease in picked.leases)
            scheduler.ack(picked.leases, outcome="delivered")
        lane = operator_lane_tenant()
        return [index for index, tenant_id in enumerate(order) if tenant_id != lane]

    def operator_lane_tenant() -> int | None:
        from ingest.operational import operational_tenant

        return operational_tenant().pk

    from ingest.publish import publish as publish_event

    def tenants_publish() -> None:
        for tenant in tenants:
            for n in range(5):
                publish_event(tenant, "order.created", {"n": n})

    tenants_publish()
    alone = tenant_positions()
    burst = [
        Announcement(operational.DELIVERY_DEAD, tenants[0].pk, {"n": n}) for n in range(10_000)
    ]
    assert publish(burst) == 10_000
    tenants_publish()
    with_burst = tenant_positions()
    assert len(alone) == len(with_burst) == 100
    # Twenty tenants and one burst lane take turns: at most one turn in 21 is the burst's.
    assert max(with_burst) <= max(alone) * 21 / 20 + 50, (max(alone), max(with_burst))
    assert Delivery.objects.filter(endpoint=operator).count() == 10_000


def test_a_tenant_held_to_its_share_is_paced_once_and_caught_up_once_drained(
    monkeypatch,
) -> None:
    from dashboards import pacing, pacing_news
    from delivery.upkeep import maintenance

    # Paced is said of a backlog older than a lap of the scheduler; here, of any backlog.
    monkeypatch.setattr(pacing, "PACED_AFTER_SECONDS", 0.0)
    from delivery.scheduler import get_scheduler
    from ingest.publish import publish as publish_event

    acme, globex = make_tenant("acme"), make_tenant("globex")
    for tenant in (acme, globex):
        make_endpoint(tenant, max_in_flight=100)
    acme_ops = make_endpoint(acme, operational_events="tenant.paced,tenant.caught_up")
    operator = make_endpoint(None, operational_events="*")
    for n in range(5):
        publish_event(acme, "order.created", {"n": n})
        publish_event(globex, "order.created", {"n": n})
    maintenance.sweep()  # the maintenance sweep judges the statuses once per run
    assert sorted(types(operator)) == ["tenant.paced", "tenant.paced"]
    assert pacing_news.announce_changes() == []  # no change of state, no news
    scheduler = get_scheduler()
    while picked := scheduler.pick(
        "drain",
        50,
    ).leases:
        scheduler.ack(picked, outcome="delivered")
    said = pacing_news.announce_changes()
    assert sorted(a.event_type for a in said) == ["tenant.caught_up"] * 2
    assert types(acme_ops) == ["tenant.paced", "tenant.caught_up"]
    assert sorted(types(operator)) == sorted(["tenant.paced", "tenant.caught_up"] * 2)
    [paced] = operational_events(acme_ops)[:1]
    assert paced["tenant"] == "acme" and paced["data"]["status"] == "paced"
    assert paced["data"]["queued"] == 5 and paced["data"]["other_tenants_waiting"] == 1


def test_the_platforms_own_tenant_key_is_reserved() -> None:
    """No provider's key reaches the operational lane and no publisher forges its news."""
    from ingest.accept import resolve_tenant
    from ingest.operational import operational_tenant
    from ingest.publish import PublishError
    from ingest.publish import publish as publish_event
    from webhooks.fairness_key import KeyResult

    operational_tenant()  # it exists once any news was published
    source = make_source("shop", auto_register_tenants=True)
    tenant, reason = resolve_tenant(source, KeyResult(OPERATIONAL_TENANT_KEY))
    assert tenant is None and "platform's own" in reason
    with pytest.raises(PublishError, match="platform's own tenant"):
        publish_event(OPERATIONAL_TENANT_KEY, "endpoint.disabled", {"forged": True})
    assert not Event.objects.exists()


def test_an_endpoint_disabled_in_the_admin_is_announced(staff_client) -> None:
    from django.urls import reverse

    operator = make_endpoint(None, operational_events="endpoint.disabled")
    endpoint = make_endpoint(make_tenant("acme"), "http://127.0.0.1:9/hook", sign_requests=False)
    form = {
        "tenant": endpoint.tenant_id,
        "url": endpoint.url,
        "description": "",
        "event_types": "",
        "max_in_flight": 4,
        "retry_max_in_flight": 1,
        "rate_limit_per_second": "",
        "timeout_seconds": 30,
        "operational_events": "",
        "disabled_reason": "customer asked us to stop",
        "secrets-TOTAL_FORMS": 0,
        "secrets-INITIAL_FORMS": 0,
        "secrets-MIN_NUM_FORMS": 0,
        "secrets-MAX_NUM_FORMS": 1000,
    }
    url = reverse("admin:tenants_endpoint_change", args=[endpoint.pk])
    answer = staff_client.post(url, form)  # "enabled" left out: unchecked
    assert answer.status_code == 302, answer.content.decode()[:2000]
    assert not Endpoint.objects.get(pk=endpoint.pk).enabled
    [body] = operational_events(operator)
    assert body["type"] == "endpoint.disabled"
    assert body["data"]["reason"] == "customer asked us to stop"
    assert staff_client.post(url, form).status_code == 302  # still disabled: no news
    assert len(operational_events(operator)) == 1

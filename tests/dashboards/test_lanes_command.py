"""`manage.py lanes`: the schedule at a terminal, and as JSON for scripts."""

import json
import time
from io import StringIO

import pytest
from django.core.management import call_command

from core.ids import new_ulid
from delivery.scheduler import EndpointAnswers, Item, get_scheduler, reset_scheduler
from tests.factories import make_endpoint, make_tenant
from tests.scheduler_helpers import fill_a_new_adaptive_limit

pytestmark = pytest.mark.django_db


def run(*args: str) -> str:
    out = StringIO()
    call_command("lanes", *args, stdout=out)
    return out.getvalue()


def test_lanes_lists_backlogged_tenants_and_capped_endpoints(scheduler_shards) -> None:
    tenant = make_tenant("flooder.example", weight=2)
    endpoint = make_endpoint(tenant, "http://127.0.0.1:9/slow", max_in_flight=1)
    scheduler = get_scheduler()
    scheduler.enqueue(
        [Item(new_ulid(), tenant.pk, endpoint.pk, weight=2, max_in_flight=1) for _ in range(3)]
    )
    scheduler.enqueue([Item(new_ulid(), None, endpoint.pk, max_in_flight=1)])
    scheduler.pick("w", 1)
    table = run()
    assert "flooder.example" in table and "(fallback lane)" in table
    assert "endpoints at their cap or adaptive limit: 1" in table
    assert "http://127.0.0.1:9/slow: 1/1 in flight" in table
    data = json.loads(run("--json"))
    keys = {row["tenant_key"] for row in data["tenants"]}
    assert keys == {"flooder.example", "(fallback)"}
    assert data["in_flight"] == 1 and data["fresh_depth"] == 3


def test_lanes_merges_the_shards_into_one_row_per_tenant(settings) -> None:
    settings.SCHEDULER_SHARDS = 3
    reset_scheduler()
    try:
        scheduler = get_scheduler()
        tenant = make_tenant("spread.example")
        endpoints = []  # one endpoint on each shard
        while len({scheduler.shard_for(e.pk).shard for e in endpoints}) < 3:
            endpoints.append(make_endpoint(tenant))
        scheduler.enqueue([Item(new_ulid(), tenant.pk, e.pk) for e in endpoints for _ in range(2)])

        data = json.loads(run("--json"))
    finally:
        reset_scheduler()
    (row,) = data["tenants"]
    assert (row["tenant_key"], row["fresh"]) == ("spread.example", 2 * len(endpoints))
    assert data["fresh_depth"] == 2 * len(endpoints)


def test_lanes_says_which_delivery_workers_beat(redis_conn) -> None:
    from delivery.worker import heartbeats

    assert "delivery workers: none beating" in run()
    heartbeats.beat(redis_conn, "host-a.1234")
    heartbeats.beat(redis_conn, "host-b.99", now=heartbeats.time.time() - 600)  # gone
    assert "delivery workers: 1 (host-a.1234 0s ago)" in run()
    assert list(json.loads(run("--json"))["workers"]) == ["host-a.1234"]


def test_lanes_shows_an_endpoint_at_its_adaptive_limit_under_its_cap() -> None:
    tenant = make_tenant("fragile.example")
    endpoint = make_endpoint(tenant, "http://127.0.0.1:9/fragile", max_in_flight=50)
    scheduler = get_scheduler()
    fill_a_new_adaptive_limit(scheduler, tenant.pk, endpoint.pk)
    table = run()
    assert "endpoints at their cap or adaptive limit: 1" in table
    assert "/fragile: 4/4 in flight (adaptive limit 4.0 of cap 50)" in table
    assert "It has not backed off" in table
    (row,) = json.loads(run("--json"))["endpoints"]
    assert row["adaptive_limit"] == 4 and row["max_in_flight"] == 50
    # A 503 halves it, under the four requests still open, and lanes says why.
    scheduler.answered([], [EndpointAnswers(endpoint.pk, overloaded=1)])
    table = run()
    assert "4/2 in flight (adaptive limit 2.0 of cap 50)" in table
    assert "It last backed off from 4 at " in table
    assert ": it answered 429 or 503, timed out or refused the connection." in table
    (row,) = json.loads(run("--json"))["endpoints"]
    assert row["backed_off_from"] == 4 and row["backed_off_latency_ms"] is None


def test_lanes_shows_an_endpoint_whose_retries_wait_for_their_budget() -> None:
    tenant = make_tenant("failing.example")
    endpoint = make_endpoint(tenant, "http://127.0.0.1:9/failing", max_in_flight=1)
    scheduler = get_scheduler()
    scheduler.enqueue(
        [Item(new_ulid(), tenant.pk, endpoint.pk, max_in_flight=1, lane="retry") for _ in range(5)]
    )
    for _ in range(2):  # two retries fail: the budget of twice the cap is spent
        (lease,) = scheduler.pick("w", 10).leases
        scheduler.retry_later_many([(lease, time.time() + 3600)])
    assert scheduler.pick("w", 10).leases == []
    table = run()
    assert "endpoints whose retries wait for their retry budget: 1" in table
    assert f"#{endpoint.pk}: 0.0 tokens, 1 lanes waiting" in table
    (row,) = json.loads(run("--json"))["endpoints"]
    assert row["retry_budget"] < 1

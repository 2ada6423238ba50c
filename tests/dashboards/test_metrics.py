"""/metrics: values read from the scheduler at scrape time, bounded cardinality, protection,
and alert rules that only name metrics we export."""

import re
import time
from pathlib import Path

import pytest
import yaml

from core.ids import new_ulid
from delivery.scheduler import EndpointAnswers, Item, get_scheduler, reset_scheduler
from ingest.publish import publish
from tests.factories import make_endpoint, make_source, make_tenant
from tests.metrics_helpers import scrape, value
from webhooks.models import Source

pytestmark = pytest.mark.django_db
RULES = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "alerts.yml"


def test_scrape_shows_the_scheduler_after_a_known_scenario(client, scheduler_shards) -> None:
    scheduler = get_scheduler()
    old_ms = int(time.time() * 1000) - 120_000  # two minutes ago
    loud, quiet = make_tenant("loud"), make_tenant("quiet")
    loud_endpoint = make_endpoint(loud, max_in_flight=1)
    quiet_endpoint = make_endpoint(quiet)
    scheduler.enqueue(
        [
            Item(new_ulid(now_ms=old_ms + i), loud.pk, loud_endpoint.pk, max_in_flight=1)
            for i in range(5)
        ]
        + [Item(new_ulid(), quiet.pk, quiet_endpoint.pk)]
        + [Item(new_ulid(), None, quiet_endpoint.pk)]
    )
    leases = scheduler.pick("w", 3).leases  # loud's cap is 1: one of loud, quiet, fallback
    assert len(leases) == 3
    scheduler.ack(
        [next(lease for lease in leases if lease.tenant_id == quiet.pk)], outcome="delivered"
    )
    Source.objects.filter(pk=make_source("src").pk).update(fallback_count=4)

    samples = scrape(client)

    assert value(samples, "webhook_scheduler_up") == 1
    assert value(samples, "webhook_lane_depth", lane="fresh") == 4
    assert value(samples, "webhook_lane_depth", lane="fallback") == 0
    assert value(samples, "webhook_in_flight") == 2
    assert value(samples, "webhook_tenants_backlogged") == 1
    assert 119 <= value(samples, "webhook_backlog_age_seconds", tenant="loud") < 200
    assert value(samples, "webhook_backlog_age_max_seconds") >= 119
    assert value(samples, "webhook_tenants_over_threshold", threshold="60") == 1
    assert value(samples, "webhook_tenants_over_threshold", threshold="300") == 0
    assert value(samples, "webhook_tenant_backlog_age_seconds_bucket", le="60.0") == 0
    assert value(samples, "webhook_tenant_backlog_age_seconds_bucket", le="+Inf") == 1
    assert value(samples, "webhook_deliveries_total", outcome="delivered") == 1
    assert value(samples, "webhook_deferrals_total") >= 1
    assert value(samples, "webhook_fallback_enqueued_total") == 1
    assert value(samples, "webhook_fallback_events_total", source="src") == 4
    assert value(samples, "webhook_endpoint_in_flight", endpoint=str(loud_endpoint.pk)) == 1
    assert value(samples, "webhook_endpoint_max_in_flight", endpoint=str(loud_endpoint.pk)) == 1


def test_an_adaptive_limit_is_scraped_for_busy_endpoints_whose_limit_adapts(client) -> None:
    scheduler = get_scheduler()
    adaptive, fixed = make_endpoint(None, max_in_flight=30), make_endpoint(None, max_in_flight=3)
    scheduler.enqueue(
        [Item(new_ulid(), None, adaptive.pk, max_in_flight=30, adaptive=True) for _ in range(9)]
        + [Item(new_ulid(), None, fixed.pk, max_in_flight=3) for _ in range(9)]
    )
    assert len(scheduler.pick("w", 20).leases) == 4 + 3
    samples = scrape(client)
    assert value(samples, "webhook_endpoint_adaptive_limit", endpoint=str(adaptive.pk)) == 4
    assert value(samples, "webhook_endpoint_max_in_flight", endpoint=str(adaptive.pk)) == 30
    limited = {s.labels["endpoint"] for s in samples["webhook_endpoint_adaptive_limit"]}
    assert limited == {str(adaptive.pk)}  # a fixed cap has no adaptive limit to show
    assert not samples.get("webhook_endpoint_adaptive_backoff_from")  # it has not backed off


def test_why_an_adaptive_limit_backed_off_is_scraped_with_its_reason(client) -> None:
    scheduler = get_scheduler()
    endpoint = make_endpoint(None, max_in_flight=30)
    label = str(endpoint.pk)
    scheduler.enqueue(
        [Item(new_ulid(), None, endpoint.pk, max_in_flight=30, adaptive=True) for _ in range(9)]
    )
    assert len(scheduler.pick("w", 9).leases) == 4
    scheduler.answered([], [EndpointAnswers(endpoint.pk, ok=4, latency_ms=4 * 20.0)])
    samples = scrape(client)
    assert value(
        samples, "webhook_endpoint_adaptive_latency_seconds", endpoint=label, which="baseline"
    ) == pytest.approx(0.020)
    assert not samples.get("webhook_endpoint_adaptive_backoff_timestamp_seconds")

    before = time.time()
    scheduler.answered([], [EndpointAnswers(endpoint.pk, overloaded=1)])
    samples = scrape(client)
    limit = value(samples, "webhook_endpoint_adaptive_limit", endpoint=label)
    was = value(
        samples, "webhook_endpoint_adaptive_backoff_from", endpoint=label, reason="overload"
    )
    assert limit < was
    at = value(
        samples,
        "webhook_endpoint_adaptive_backoff_timestamp_seconds",
        endpoint=label,
        reason="overload",
    )
    assert before - 1 <= at <= time.time() + 1
    reasons = {s.labels["reason"] for s in samples["webhook_endpoint_adaptive_backoff_from"]}
    assert reasons == {"overload"}


def test_series_stay_bounded_and_the_scrape_costs_a_fixed_number_of_redis_calls(
    client, settings
) -> None:
    scheduler = get_scheduler()
    endpoint = make_endpoint(None)
    for start in range(0, 10_000, 1000):
        scheduler.enqueue(
            [
                Item(new_ulid(), tenant_id, endpoint.pk)
                for tenant_id in range(start + 1, start + 1001)
            ]
        )
    calls = 0
    real = scheduler.connection.execute_command

    def counting(*args, **kwargs):
        nonlocal calls
        calls += 1
        return real(*args, **kwargs)

    scheduler.connection.execute_command = counting
    try:
        samples = scrape(client)
    finally:
        del scheduler.connection.execute_command
    assert value(samples, "webhook_tenants_backlogged") == 10_000
    webhook_series = sum(len(v) for name, v in samples.items() if name.startswith("webhook_"))
    assert len(samples["webhook_backlog_age_seconds"]) == settings.METRICS_TOP_N
    assert webhook_series < 100
    assert calls <= 3


def test_scheduler_down_is_reported_not_an_error(client, settings) -> None:

    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    reset_scheduler()
    try:
        samples = scrape(client)
    finally:
        reset_scheduler()
    assert value(samples, "webhook_scheduler_up") == 0


def test_metrics_token_protects_the_endpoint(client, settings) -> None:
    settings.METRICS_TOKEN = "scrape-me"
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer scrape-me").status_code == 200
    # RFC 7235: the scheme is case-insensitive; a bare token is no credential.
    assert client.get("/metrics", HTTP_AUTHORIZATION="bearer scrape-me").status_code == 200
    assert client.get("/metrics", HTTP_AUTHORIZATION="BEARER  scrape-me ").status_code == 200
    assert client.get("/metrics", HTTP_AUTHORIZATION="scrape-me").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Basic scrape-me").status_code == 401


@pytest.mark.django_db(transaction=True)
def test_alert_rules_parse_and_name_only_exported_metrics_and_labels(client) -> None:
    tenant = make_tenant("t")
    make_endpoint(tenant)
    make_source("src")
    publish(tenant, "x", {})
    samples = scrape(client)
    rules = yaml.safe_load(RULES.read_text())["groups"][0]["rules"]
    assert {rule["alert"] for rule in rules} >= {
        "WebhookTenantBacklogOld",
        "WebhookManyTenantsBehind",
        "WebhookFallbackLaneRising",
        "WebhookSourceKeyLooksUnbounded",
        "WebhookDeadLettersRising",
        "WebhookEndpointDisabled",
        "WebhookSchedulerDown",
    }
    for rule in rules:
        alert, expr = rule["alert"], rule["expr"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]
        names = set(re.findall(r"\b(webhook_[a-z_]+)", expr))
        assert names, alert
        assert names <= set(samples), (alert, names - set(samples))
        exported_labels = {label for name in names for s in samples[name] for label in s.labels}
        # A selector on a label value we never export (a threshold missing from
        # METRICS_AGE_THRESHOLDS) matches nothing, and the rule silently never fires.
        for name, matchers in re.findall(r"\b(webhook_[a-z_]+)\{([^}]*)\}", expr):
            for label, wanted in re.findall(r'(\w+)\s*=\s*"([^"]*)"', matchers):
                assert any(s.labels.get(label) == wanted for s in samples[name]), (
                    alert,
                    f"{name}{{{label}={wanted!r}}} is not exported",
                )
        grouped = {
            label.strip()
            for by in re.findall(r"\bby\s*\(([^)]*)\)", expr)
            for label in by.split(",")
            if label.strip()
        }
        assert grouped <= exported_labels, (alert, grouped - exported_labels)
        # Every rule aggregates (several web processes export the same series), so a label
        # a template names survives only if the expression groups by it.
        templated = set(re.findall(r"\$labels\.(\w+)", str(rule["annotations"])))
        assert templated <= grouped, (alert, templated - grouped)


def test_an_endpoint_whose_retries_wait_for_their_budget_is_scraped(client) -> None:
    scheduler = get_scheduler()
    failing = make_endpoint(None, max_in_flight=1)
    scheduler.enqueue(
        [Item(new_ulid(), None, failing.pk, max_in_flight=1, lane="retry") for _ in range(5)]
    )
    for _ in range(2):
        (lease,) = scheduler.pick("w", 10).leases
        scheduler.retry_later_many([(lease, time.time() + 3600)])
    samples = scrape(client)
    assert value(samples, "webhook_endpoint_retry_budget", endpoint=str(failing.pk)) < 1

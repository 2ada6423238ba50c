"""OpenTelemetry traces: one connected trace per event, from the provider's POST to each
delivery attempt, through the real ingest view, database, Redis and delivery engine, into
the SDK's in-memory exporter."""

from collections.abc import Iterator

import pytest
from django.db import connection
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from core import tracing
from core.database import vendor
from delivery.models import Attempt, Delivery
from tests import signing
from tests.delivery_helpers import statuses, wait_until
from tests.factories import make_endpoint, make_source, make_tenant
from tests.http_receivers import Recorder, Reply
from webhooks.models import Event, Source

pytestmark = pytest.mark.django_db(transaction=True)
SECRET = "shpss_trace_secret"


@pytest.fixture(autouse=True)
def local_receivers(settings) -> None:
    settings.ALLOW_PRIVATE_DESTINATIONS = True
    settings.RETRY_SCHEDULE_SECONDS = [0.2, 0.2]
    settings.RETRY_JITTER = 0.0


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.start(provider)
    # Connections made from now on are traced (a process starts tracing before any).
    connection.close()
    try:
        yield exporter
    finally:
        tracing.stop()


def post_signed(client, body: bytes, **extra):
    return client.post(
        "/ingest/shop/",
        data=body,
        content_type="application/json",
        HTTP_X_SHOPIFY_HMAC_SHA256=signing.shopify(SECRET, body),
        HTTP_X_SHOPIFY_TOPIC="orders/create",
        HTTP_X_SHOPIFY_SHOP_DOMAIN="a.example",
        **extra,
    )


def shop_source_to(url: str, **endpoint_fields) -> Source:
    make_tenant("a.example")
    source = make_source(
        "shop", secret=SECRET, scheme=Source.SHOPIFY, fairness_key="header:X-Shopify-Shop-Domain"
    )
    source.destinations.add(make_endpoint(None, url, **endpoint_fields))
    return source


def by_name(finished, name: str) -> list:
    return [span for span in finished if span.name == name]


def test_one_connected_trace_from_the_ingest_request_to_each_attempt(client, engine, spans) -> None:
    with Recorder(Reply(503), Reply(200)) as receiver:
        shop_source_to(receiver.url + "/hook", send_trace_context=True)
        response = post_signed(client, b'{"id": 1}')
        assert response.status_code == 202
        engine()
        requests = receiver.wait_for(2)
        assert wait_until(lambda: statuses() == {Delivery.Status.DELIVERED: 1})
        assert wait_until(lambda: len(by_name(spans.get_finished_spans(), "webhook.deliver")) == 2)
    finished = spans.get_finished_spans()
    [server] = [span for span in finished if span.kind == SpanKind.SERVER]
    trace_id = server.context.trace_id
    event = Event.objects.get()
    # Every span of the event's way is in the server span's trace: one trace.
    ours = [span for span in finished if span.context.trace_id == trace_id]
    names = {span.name for span in ours}
    assert {"webhook.verify", "webhook.tenant_key", "webhook.accept", "webhook.enqueue"} <= names
    assert {"webhook.deliver", "scheduler.pick", "POST", "webhook.record"} <= names
    spans_by_id = {span.context.span_id: span for span in ours}

    def ancestors(span) -> list[str]:
        chain = []
        while span.parent is not None:
            span = spans_by_id[span.parent.span_id]
            chain.append(span.name)
        return chain

    # The ingest steps under the request; the attempts under the span that accepted the event.
    assert ancestors(by_name(ours, "webhook.verify")[0])[-1] == server.name
    [accept] = by_name(ours, "webhook.accept")
    assert event.trace_parent == tracing.traceparent_of(accept.context)
    attempts = sorted(by_name(ours, "webhook.deliver"), key=lambda span: span.start_time)
    assert [a.attributes["webhook.attempt"] for a in attempts] == [1, 2]
    assert [a.attributes["webhook.outcome"] for a in attempts] == ["retry", "delivered"]
    assert all(a.parent.span_id == accept.context.span_id for a in attempts)
    assert all(a.attributes["webhook.id"] == event.id for a in attempts)
    posts = sorted(by_name(ours, "POST"), key=lambda span: span.start_time)
    assert [p.attributes["http.response.status_code"] for p in posts] == [503, 200]
    for child in ("scheduler.pick", "POST", "webhook.record"):
        assert all(ancestors(span)[0] == "webhook.deliver" for span in by_name(ours, child))
    # The receiver was told each request's own span: its spans join the event's trace.
    assert [r.headers["traceparent"] for r in requests] == [
        tracing.traceparent_of(p.context) for p in posts
    ]
    # The attempt log shows the header sent (it is no secret).
    assert {a.request_headers["traceparent"] for a in Attempt.objects.all()} == {
        r.headers["traceparent"] for r in requests
    }
    # Ingest's Redis commands and (on PostgreSQL) statements are traced by their
    # instrumentations, in the request's trace; the worker's, which serve many events at
    # once, are not (each attempt's pick and record spans stand for them).
    systems = {span.attributes.get("db.system") for span in finished}
    assert "redis" in {span.attributes.get("db.system") for span in ours}
    if vendor() == "postgresql":
        assert "postgresql" in {span.attributes.get("db.system") for span in ours}
    outside = [s for s in finished if s.context.trace_id != trace_id]  # the setup's own
    after = [s for s in outside if s.start_time > server.start_time]
    assert not [s.name for s in after if s.attributes.get("db.system") == "redis"], systems


def test_an_upstream_traceparent_makes_the_event_part_of_the_callers_trace(client, spans) -> None:
    shop_source_to("http://127.0.0.1:9/hook")
    upstream = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    assert post_signed(client, b'{"id": 2}', HTTP_TRACEPARENT=upstream).status_code == 202
    [server] = [s for s in spans.get_finished_spans() if s.kind == SpanKind.SERVER]
    assert f"{server.context.trace_id:032x}" == "0af7651916cd43dd8448eb211c80319c"
    assert Event.objects.get().trace_parent.split("-")[1] == "0af7651916cd43dd8448eb211c80319c"


def test_endpoints_that_do_not_opt_in_get_no_traceparent(client, engine, spans) -> None:
    with Recorder() as receiver:
        shop_source_to(receiver.url + "/hook")
        assert post_signed(client, b'{"id": 3}').status_code == 202
        engine()
        [request] = receiver.wait_for(1)
        assert wait_until(lambda: by_name(spans.get_finished_spans(), "webhook.deliver"))
    assert "traceparent" not in request.headers
    assert by_name(spans.get_finished_spans(), "POST")


def test_off_by_default_nothing_is_stored_or_sent(client, engine) -> None:
    assert not tracing.enabled()
    with Recorder() as receiver:
        shop_source_to(receiver.url + "/hook", send_trace_context=True)
        assert post_signed(client, b'{"id": 4}').status_code == 202
        engine()
        [request] = receiver.wait_for(1)
    assert "traceparent" not in request.headers
    assert Event.objects.get().trace_parent == ""


@pytest.mark.parametrize(
    ("environ", "names"),
    [
        ({}, []),
        ({"OTEL_TRACES_EXPORTER": "none"}, []),
        ({"OTEL_TRACES_EXPORTER": "console"}, ["console"]),
        ({"OTEL_TRACES_EXPORTER": "otlp,console"}, ["otlp", "console"]),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, ["otlp"]),
        ({"OTEL_TRACES_EXPORTER": "console", "OTEL_SDK_DISABLED": "true"}, []),
    ],
)
def test_the_sdks_own_variables_turn_tracing_on(environ, names) -> None:
    assert tracing.exporter_names(environ) == names


def test_an_exporter_no_package_provides_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="zipkin"):
        tracing.configure_from_environment({"OTEL_TRACES_EXPORTER": "zipkin"})
    assert not tracing.enabled()


def test_a_stored_traceparent_that_is_not_one_starts_a_trace_of_its_own() -> None:
    assert tracing.parent_from("") is None
    assert tracing.parent_from("not-a-traceparent-but-fifty-five-characters-long-xxxxxx") is None
    valid = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    assert tracing.parent_from(valid) is not None


def test_the_production_application_traces_the_machine_doors_light_stack(spans) -> None:
    """Ingest is served by the machine doors' own middleware list (project.machine_doors):
    its requests keep tracing's middleware, so their steps have a server span above."""
    import io
    from wsgiref.util import setup_testing_defaults

    from project.machine_doors import MachineDoorsDispatcher

    shop_source_to("http://127.0.0.1:9/hook")
    body = b'{"id": 5}'
    environ = {
        "REQUEST_METHOD": "POST",
        "PATH_INFO": "/ingest/shop/",
        "CONTENT_TYPE": "application/json",
        "CONTENT_LENGTH": str(len(body)),
        "HTTP_HOST": "testserver",
        "HTTP_X_SHOPIFY_HMAC_SHA256": signing.shopify(SECRET, body),
        "HTTP_X_SHOPIFY_TOPIC": "orders/create",
        "HTTP_X_SHOPIFY_SHOP_DOMAIN": "a.example",
        "wsgi.input": io.BytesIO(body),
    }
    setup_testing_defaults(environ)
    answered = []
    application = MachineDoorsDispatcher()
    b"".join(application(environ, lambda status, headers: answered.append(status)))
    assert answered == ["202 Accepted"]
    finished = spans.get_finished_spans()
    [server] = [s for s in finished if s.kind == SpanKind.SERVER]
    # (On PostgreSQL a first try may meet a configuration changed meanwhile and go again:
    # a span each, both under the request.)
    steps = by_name(finished, "webhook.accept") + by_name(finished, "webhook.verify")
    assert {s.context.trace_id for s in steps} == {server.context.trace_id}
    assert {s.parent.span_id for s in steps} == {server.context.span_id}


def test_a_span_that_cannot_be_made_never_stops_a_delivery(
    client, engine, spans, monkeypatch
) -> None:
    def broken(context) -> str:
        raise RuntimeError("an exporter's bug")

    monkeypatch.setattr(tracing, "traceparent_of", broken)
    with Recorder() as receiver:
        shop_source_to(receiver.url + "/hook", send_trace_context=True)
        # Ingest makes the event's traceparent with the same function: this test breaks
        # only the worker's.
        monkeypatch.setattr(tracing, "current_traceparent", lambda: "")
        assert post_signed(client, b'{"id": 6}').status_code == 202
        engine()
        [request] = receiver.wait_for(1)
        assert wait_until(lambda: statuses() == {Delivery.Status.DELIVERED: 1})
    assert "traceparent" not in request.headers
    # An odd port is the transport's to refuse, not the trace's.
    with Recorder() as receiver:
        odd = make_endpoint(None, "http://127.0.0.1:99999/hook")
        Source.objects.get().destinations.set([odd])
        assert post_signed(client, b'{"id": 7}').status_code == 202
        assert wait_until(
            lambda: Delivery.objects.filter(endpoint=odd).exclude(attempts=0).exists()
        )

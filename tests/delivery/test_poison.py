"""Poison-proofing: whatever one delivery raises is that delivery's recorded failure.

Each test puts one tenant's odd delivery on a shared destination (cap 1) beside quiet
tenants' ordinary ones, and checks that the odd one is recorded (then retried, then
dead-lettered), that its endpoint slot comes back at once, and that nobody else waits.
The exceptions are injected at the real seams of the worker; the scheduler, database
and receiver are real.
"""

import json
import time
from urllib.parse import unquote

import pytest

from delivery.models import Attempt, Delivery
from delivery.pipeline import records, sending
from delivery.pipeline.policy import INTERNAL
from delivery.pipeline.transport import Transport
from delivery.scheduler import get_scheduler
from ingest.accept import accept
from ingest.publish import publish
from tenants.models import Endpoint, EndpointSecret
from tests import signing
from tests.delivery_helpers import wait_until
from tests.factories import make_endpoint, make_source, make_tenant
from tests.http_receivers import Recorder
from webhooks.models import ApiToken, Source

pytestmark = pytest.mark.django_db(transaction=True)

QUIET_TENANTS = 5
QUIET_EVENTS_EACH = 4
# Long, so that a slot held until its lease expires would show as a long wait.
LEASE_SECONDS = 30
# Everyone else's deliveries must be through well before a lease could expire.
QUIET_DEADLINE_SECONDS = 10.0


@pytest.fixture(autouse=True)
def fast_retries(settings):
    settings.ALLOW_PRIVATE_DESTINATIONS = True
    settings.RETRY_SCHEDULE_SECONDS = [0.2, 0.2, 0.2]
    settings.RETRY_JITTER = 0.0
    settings.LEASE_SECONDS = LEASE_SECONDS


def is_poison(body: bytes) -> bool:
    return b'"poison"' in body


def poison_id() -> str:
    return next(
        d.pk for d in Delivery.objects.select_related("event") if is_poison(d.event.payload)
    )


def shared_destination(url: str) -> Endpoint:
    endpoint = make_endpoint(None, url, max_in_flight=1)
    EndpointSecret.objects.create(endpoint=endpoint)
    return endpoint


def publish_mix(endpoint: Endpoint) -> None:
    """One odd event from one shop, and the quiet shops' ordinary ones after it, all to
    the shared destination (a gateway source's)."""
    source = make_source("gateway", secret="", scheme=Source.NONE)
    source.destinations.add(endpoint)

    def send(tenant, payload: dict) -> None:
        accept(
            source=source,
            tenant=tenant,
            event_type="order.created",
            headers={},
            content_type="application/json",
            payload=json.dumps(payload).encode(),
            idempotency_key=None,
        )

    send(make_tenant("odd-shop"), {"poison": True})
    for t in range(QUIET_TENANTS):
        tenant = make_tenant(f"quiet-{t}")
        for i in range(QUIET_EVENTS_EACH):
            send(tenant, {"t": t, "i": i})


def inject(step: str, monkeypatch) -> None:
    """Make `step` raise for the poison delivery alone (and only for its real attempt,
    not for the recording of its failure)."""
    boom = ValueError(f"injected at {step}")

    if step == sending.LOAD:
        load_many = sending.loading.load_many
        target = poison_id()

        def failing_load(ids):
            if target in ids:
                raise boom
            return load_many(ids)

        monkeypatch.setattr(sending.loading, "load_many", failing_load)
    elif step == sending.HEADERS:
        unsigned = sending.unsigned_headers

        def failing_headers(delivery, now):
            if is_poison(bytes(delivery.event.payload)):
                raise boom
            return unsigned(delivery, now)

        monkeypatch.setattr(sending, "unsigned_headers", failing_headers)
    elif step == sending.SIGN:
        sign = sending.sign_standard_webhooks

        def failing_sign(msg_id, timestamp, body, secrets):
            if is_poison(body):
                raise boom
            return sign(msg_id, timestamp, body, secrets)

        monkeypatch.setattr(sending, "sign_standard_webhooks", failing_sign)
    elif step == sending.SEND:
        exchange = Transport.exchange

        def failing_exchange(self, url, body, headers, **options):
            if is_poison(body):
                raise boom
            return exchange(self, url, body, headers, **options)

        monkeypatch.setattr(Transport, "exchange", failing_exchange)
    elif step == sending.JUDGE:
        judged = sending.judged

        def failing_judge(lease, delivery, result, started_at, headers):
            if is_poison(bytes(delivery.event.payload)) and result.error_kind != INTERNAL:
                raise boom
            return judged(lease, delivery, result, started_at, headers)

        monkeypatch.setattr(sending, "judged", failing_judge)
    elif step == sending.RECORD:
        attempt_row = records._attempt
        target = poison_id()

        def failing_row(item):
            if item.delivery.pk == target and item.result.error_kind != INTERNAL:
                raise boom
            return attempt_row(item)

        monkeypatch.setattr(records, "_attempt", failing_row)
    else:
        raise AssertionError(step)


@pytest.mark.parametrize(
    "step",
    [sending.LOAD, sending.HEADERS, sending.SIGN, sending.SEND, sending.JUDGE, sending.RECORD],
)
def test_an_exception_at_any_step_is_that_deliverys_recorded_failure(
    engine, monkeypatch, step
) -> None:
    with Recorder() as receiver:
        endpoint = shared_destination(receiver.url)
        publish_mix(endpoint)
        inject(step, monkeypatch)
        quiet = QUIET_TENANTS * QUIET_EVENTS_EACH
        started = time.monotonic()
        engine(concurrency=4)

        def quiet_delivered() -> bool:
            return Delivery.objects.filter(status=Delivery.Status.DELIVERED).count() == quiet

        assert wait_until(quiet_delivered, timeout=QUIET_DEADLINE_SECONDS)
        quiet_took = time.monotonic() - started
        target = poison_id()
        assert wait_until(
            lambda: Delivery.objects.get(pk=target).status == Delivery.Status.DEAD, timeout=15
        )

    poisoned = Delivery.objects.get(pk=target)
    # The first try and the schedule's three retries, each recorded with the step named.
    assert poisoned.attempts == 4
    assert "gave up after 4 attempts" in poisoned.last_error
    errors = list(
        Attempt.objects.filter(delivery_id=target)
        .order_by("number")
        .values_list("error", flat=True)
    )
    assert len(errors) == 4
    assert all(
        f"{step} failed inside the worker: ValueError: injected at {step}" in e for e in errors
    )
    # The quiet shops were never held behind it (a held slot would wait out a 30 s lease).
    assert quiet_took < QUIET_DEADLINE_SECONDS
    assert Attempt.objects.exclude(delivery_id=target).count() == quiet
    # Its slot and lease were given back, and the endpoint is not blamed for our fault.
    assert wait_until(lambda: get_scheduler().snapshot().in_flight == 0)
    endpoint.refresh_from_db()
    assert endpoint.enabled and endpoint.consecutive_failures == 0


def test_a_response_the_database_refuses_is_recorded_without_losing_the_group(engine) -> None:
    # PostgreSQL's text and jsonb refuse NUL characters; a receiver may answer with them.
    from tests.http_receivers import Reply

    with Recorder(Reply(200, b"ok\x00then\x00more")) as receiver:
        tenant = make_tenant("nul-shop")
        make_endpoint(tenant, receiver.url)
        for i in range(3):
            publish(tenant, "x", {"i": i})
        engine(concurrency=4)
        assert wait_until(
            lambda: Delivery.objects.filter(status=Delivery.Status.DELIVERED).count() == 3
        )
    excerpts = set(Attempt.objects.values_list("response_excerpt", flat=True))
    assert excerpts == {"ok\ufffdthen\ufffdmore"}


ODD_TYPES = ["注文.作成", "order.☃", "commande.créée.✓", "50%.off", "naïve type"]


def test_odd_event_types_from_ingest_are_delivered_percent_encoded(engine, client) -> None:
    secret = "whsec_" + "c3RhbmRhcmQtd2ViaG9va3Mta2V5LTI0Yg=="
    with Recorder() as receiver:
        source = make_source("sw", secret=secret, scheme=Source.STANDARD_WEBHOOKS)
        source.destinations.add(make_endpoint(None, receiver.url, max_in_flight=2))
        for n, event_type in enumerate(ODD_TYPES):
            body = json.dumps({"shop_id": f"shop-{n}", "type": event_type}).encode()
            timestamp = int(time.time())
            response = client.post(
                "/ingest/sw/",
                data=body,
                content_type="application/json",
                headers={
                    "webhook-id": f"msg_{n}",
                    "webhook-timestamp": str(timestamp),
                    "webhook-signature": signing.standard_webhooks(
                        secret, f"msg_{n}", timestamp, body
                    ),
                },
            )
            assert response.status_code == 202, response.content
        engine(concurrency=4)
        requests = receiver.wait_for(len(ODD_TYPES))
        assert wait_until(
            lambda: (
                Delivery.objects.filter(status=Delivery.Status.DELIVERED).count() == len(ODD_TYPES)
            )
        )
    sent = {unquote(r.headers["webhook-event-type"]) for r in requests}
    assert sent == set(ODD_TYPES)
    on_the_wire = {r.headers["webhook-event-type"] for r in requests}
    assert "%E6%B3%A8%E6%96%87.%E4%BD%9C%E6%88%90" in on_the_wire
    assert all(value.isascii() and value.isprintable() for value in on_the_wire)


def test_odd_event_types_from_the_publish_api_are_delivered(engine, client) -> None:
    with Recorder() as receiver:
        tenant = make_tenant("acme")
        make_endpoint(tenant, receiver.url)
        _, token = ApiToken.issue("poison-test", tenant=tenant)
        events = [
            {"tenant": "acme", "event_type": t, "payload": {"n": n}}
            for n, t in enumerate(ODD_TYPES[:4])
        ]
        response = client.post(
            "/api/v1/events",
            data=json.dumps({"events": events}),
            content_type="application/json",
            HTTP_AUTHORIZATION=f"Bearer {token}",
        )
        assert response.status_code in (200, 202), response.content
        engine(concurrency=2)
        requests = receiver.wait_for(4)
        assert wait_until(
            lambda: Delivery.objects.filter(status=Delivery.Status.DELIVERED).count() == 4
        )
    assert {unquote(r.headers["webhook-event-type"]) for r in requests} == set(ODD_TYPES[:4])


@pytest.mark.parametrize(
    ("value", "wire"),
    [
        ("order.created", "order.created"),
        ("注文", "%E6%B3%A8%E6%96%87"),
        ("50%", "50%25"),
        ("a\r\nInjected: 1", "a%0D%0AInjected: 1"),
        ("nul\x00", "nul%00"),
    ],
)
def test_header_values_are_printable_ascii_and_decode_back(value, wire) -> None:
    assert sending.header_value(value) == wire
    assert unquote(wire) == value

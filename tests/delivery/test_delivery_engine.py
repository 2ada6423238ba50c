"""The delivery engine in-process: real scheduler, real database, real local receivers."""

import base64
import hashlib
import hmac
import threading
import time
from datetime import UTC, datetime

import pytest

from core.ids import new_ulid
from delivery.models import Attempt, Delivery
from delivery.pipeline import engine as engine_module
from delivery.pipeline import loading
from delivery.pipeline.engine import DeliveryEngine
from delivery.scheduler import Item, Lease, get_scheduler
from ingest.publish import publish
from tenants.models import Endpoint, EndpointSecret
from tests.delivery_helpers import statuses, wait_until
from tests.factories import make_endpoint, make_tenant
from tests.http_receivers import Recorder, Reply, tls_context
from tests.scheduler_helpers import endpoint_row
from webhooks.models import Event

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def fast_delivery_settings(settings):
    settings.ALLOW_PRIVATE_DESTINATIONS = True
    settings.RETRY_SCHEDULE_SECONDS = [0.2, 0.2, 0.2]
    settings.RETRY_JITTER = 0.0
    settings.LEASE_SECONDS = 5


def verify_standard_webhooks(secret: str, headers, body: bytes) -> bool:
    """An independent check of the Standard Webhooks scheme, as a receiver would do it."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    signed = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.".encode() + body
    expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    offered = [
        part.split(",", 1)[1]
        for part in headers["webhook-signature"].split()
        if part.startswith("v1,")
    ]
    return any(hmac.compare_digest(expected, sig) for sig in offered)


def test_delivers_with_standard_webhooks_headers_and_records_the_attempt(engine) -> None:
    with Recorder() as receiver:
        tenant = make_tenant("acme")
        endpoint = make_endpoint(tenant, receiver.url + "/hook")
        old, new = (
            EndpointSecret.objects.create(endpoint=endpoint),
            EndpointSecret.objects.create(endpoint=endpoint),
        )
        accepted = publish(tenant, "order.created", {"n": 1})
        engine()
        [request] = receiver.wait_for(1)
        assert wait_until(lambda: statuses() == {Delivery.Status.DELIVERED: 1})
    assert request.headers["webhook-id"] == accepted.event.id
    assert request.headers["Content-Type"] == "application/json"
    assert request.json() == {"n": 1}
    # One signature per active secret while a rotation is in progress.
    assert verify_standard_webhooks(old.secret, request.headers, request.body)
    assert verify_standard_webhooks(new.secret, request.headers, request.body)
    attempt = Attempt.objects.get()
    assert (attempt.number, attempt.status_code, attempt.outcome) == (
        1,
        200,
        Attempt.Outcome.DELIVERED,
    )
    assert "webhook-signature" not in attempt.request_headers
    assert get_scheduler().snapshot().in_flight == 0


def test_an_endpoint_that_opts_out_of_signing_gets_unsigned_requests(engine) -> None:
    with Recorder() as receiver:
        tenant = make_tenant("acme")
        make_endpoint(tenant, receiver.url, sign_requests=False)
        publish(tenant, "x", {})
        engine()
        [request] = receiver.wait_for(1)
        assert wait_until(lambda: statuses() == {Delivery.Status.DELIVERED: 1})
    assert "webhook-id" in request.headers
    assert "webhook-signature" not in request.headers


def test_a_signing_endpoint_without_an_active_secret_fails_rather_than_send_unsigned(
    engine,
) -> None:
    with Recorder() as receiver:
        tenant = make_tenant("acme")
        endpoint = make_endpoint(tenant, receiver.url)
        endpoint.secrets.update(expires_at=datetime(2020, 1, 1, tzinfo=UTC))
        publish(tenant, "x", {})
        engine()
        assert wait_until(lambda: statuses() == {Delivery.Status.DEAD: 1}, timeout=10)
        assert receiver.requests == []  # nothing went out unsigned
    attempt = Attempt.objects.order_by("number").first()
    assert "no active signing secret" in attempt.error


def test_failure_is_retried_with_the_same_webhook_id(engine) -> None:
    with Recorder(Reply(503), Reply(500), Reply(200)) as receiver:
        tenant = make_tenant("acme")
        make_endpoint(tenant, receiver.url)
        publish(tenant, "x", {})
        engine()
        requests = receiver.wait_for(3, timeout=10)
        assert wait_until(lambda: statuses() == {Delivery.Status.DELIVERED: 1})
    assert len({r.headers["webhook-id"] for r in requests}) == 1
    assert list(Attempt.objects.order_by("number").values_list("status_code", "outcome")) == [
        (503, Attempt.Outcome.RETRY),
        (500, Attempt.Outcome.RETRY),
        (200, Attempt.Outcome.DELIVERED),
    ]
    delivery = Delivery.objects.get()
    assert (delivery.attempts, delivery.lane) == (3, Delivery.Lane.RETRY)


def test_exhausted_retries_make_a_dead_letter(engine) -> None:
    with Recorder(Reply(500)) as receiver:
        tenant = make_tenant("acme")
        make_endpoint(tenant, receiver.url)
        publish(tenant, "x", {})
        engine()
        assert wait_until(lambda: statuses() == {Delivery.Status.DEAD: 1}, timeout=10)
        assert len(receiver.requests) == 4  # the first try and three retries
    assert "gave up" in Delivery.objects.get().last_error


def test_410_disables_the_endpoint_and_holds_its_work_until_reenabled(engine) -> None:
    with Recorder(Reply(410), Reply(200)) as receiver:
        tenant = make_tenant("acme")
        endpoint = make_endpoint(tenant, receiver.url)
        publish(tenant, "x", {"i": 0})
        running = engine(concurrency=1)
        assert wait_until(lambda: statuses() == {Delivery.Status.HELD: 1})
        endpoint.refresh_from_db()
        assert not endpoint.enabled and "410" in endpoint.disabled_reason
        publish(tenant, "x", {"i": 1})  # arrives while disabled: held, not attempted
        assert statuses() == {Delivery.Status.HELD: 2}
        assert endpoint.enable() == 2
        assert wait_until(lambda: statuses() == {Delivery.Status.DELIVERED: 2})
        bodies = [r.json() for r in receiver.requests]
        assert running.sent >= 3
    assert bodies == [{"i": 0}, {"i": 0}, {"i": 1}]  # resumed in order


def test_after_a_410_no_more_requests_go_to_the_endpoint(engine) -> None:
    # The worker keeps picking while the 410 is being recorded: what it picks for that
    # endpoint meanwhile is held at once, not sent into the 410 too.
    with Recorder(Reply(410)) as receiver:
        tenant = make_tenant("acme")
        make_endpoint(tenant, receiver.url)
        for i in range(5):
            publish(tenant, "x", {"i": i})
        engine(concurrency=1)
        assert wait_until(lambda: statuses() == {Delivery.Status.HELD: 5})
        time.sleep(0.1)
        assert [r.json() for r in receiver.requests] == [{"i": 0}]
    assert Attempt.objects.count() == 1


def test_consecutive_failures_disable_the_endpoint_with_a_reason(engine, settings) -> None:
    settings.ENDPOINT_DISABLE_AFTER_FAILURES = 2
    with Recorder(Reply(500)) as receiver:
        tenant = make_tenant("acme")
        endpoint = make_endpoint(tenant, receiver.url)
        publish(tenant, "x", {})
        engine(concurrency=1)
        assert wait_until(lambda: not Endpoint.objects.get(pk=endpoint.pk).enabled)
    endpoint.refresh_from_db()
    assert "2 consecutive failures" in endpoint.disabled_reason
    assert wait_until(lambda: statuses() == {Delivery.Status.HELD: 1})


def test_endpoint_cap_is_never_exceeded_and_deferrals_are_not_attempts(engine) -> None:
    in_flight, peak, lock = 0, 0, threading.Lock()

    class CountingRecorder(Recorder):
        def _record(self, request):
            nonlocal in_flight, peak
            with lock:
                in_flight += 1
                peak = max(peak, in_flight)
            time.sleep(0.05)
            with lock:
                in_flight -= 1
            return super()._record(request)

    with CountingRecorder() as receiver:
        tenant = make_tenant("acme")
        make_endpoint(tenant, receiver.url, max_in_flight=2)
        for i in range(30):
            publish(tenant, "x", {"i": i})
        engine(concurrency=8)
        assert wait_until(lambda: statuses() == {Delivery.Status.DELIVERED: 30}, timeout=20)
    assert peak <= 2
    assert Attempt.objects.count() == 30
    assert get_scheduler().snapshot().deferrals_total > 0


def test_a_cap_counts_open_requests_not_answers_waiting_to_be_recorded(engine, monkeypatch) -> None:
    # The recorder is held up (as by a busy database): answered requests wait to be
    # recorded, yet the endpoint's one slot goes to the next delivery as each answer comes.
    from delivery.pipeline import engine as engine_module

    recording_allowed = threading.Event()
    settle = engine_module.sending.settle

    def held_settle(group, scheduler):
        recording_allowed.wait(10)
        return settle(group, scheduler)

    monkeypatch.setattr(engine_module.sending, "settle", held_settle)
    with Recorder() as receiver:
        tenant = make_tenant("acme")
        make_endpoint(tenant, receiver.url, max_in_flight=1)
        for i in range(4):
            publish(tenant, "x", {"i": i})
        engine(concurrency=2)
        requests = receiver.wait_for(4)
        assert statuses() == {Delivery.Status.PENDING: 4}  # none recorded yet
        recording_allowed.set()
        assert wait_until(lambda: statuses() == {Delivery.Status.DELIVERED: 4})
    assert [r.json()["i"] for r in requests] == [0, 1, 2, 3]


def test_first_attempts_keep_arrival_order_per_endpoint(engine) -> None:
    with Recorder() as receiver:
        tenant = make_tenant("acme")
        make_endpoint(tenant, receiver.url, max_in_flight=1)
        for i in range(20):
            publish(tenant, "x", {"i": i})
        engine(concurrency=4)
        receiver.wait_for(20)
    assert [r.json()["i"] for r in receiver.requests] == list(range(20))


def test_graceful_stop_finishes_the_request_in_flight(engine) -> None:
    with Recorder(Reply(200, delay=1.0)) as receiver:
        tenant = make_tenant("acme")
        make_endpoint(tenant, receiver.url)
        publish(tenant, "x", {})
        running = engine(concurrency=2)
        assert wait_until(lambda: bool(running.in_flight()))
        assert running.stop(graceful=True, timeout=10) is True
    assert statuses() == {Delivery.Status.DELIVERED: 1}


def test_outcomes_are_counted_for_the_metrics(engine) -> None:
    with Recorder(Reply(200)) as receiver:
        tenant = make_tenant("acme")
        make_endpoint(tenant, receiver.url)
        for i in range(3):
            publish(tenant, "x", {"i": i})
        engine()
        assert wait_until(lambda: statuses() == {Delivery.Status.DELIVERED: 3})
    assert wait_until(lambda: get_scheduler().counters().get("delivered") == 3)


def test_retry_after_on_a_429_pauses_the_whole_endpoint(engine) -> None:
    with Recorder(Reply(429, headers={"Retry-After": "3"}), Reply(200)) as receiver:
        tenant = make_tenant("acme")
        make_endpoint(tenant, receiver.url)
        for i in range(3):
            publish(tenant, "x", {"i": i})
        engine(concurrency=1)
        receiver.wait_for(1)
        paused_at = time.monotonic()
        requests = receiver.wait_for(4, timeout=20)
        # The receiver records a request before it answers, and the worker records the
        # answer later still: wait for that while the receiver is still up to answer.
        assert wait_until(lambda: statuses() == {Delivery.Status.DELIVERED: 3})
    # The endpoint's other queued work also waited for the Retry-After, not just the 429'd
    # one: the slot paused the endpoint as the answer came, before it took more work.
    assert requests[1].arrived_at - paused_at >= 2.5


def test_load_many_reads_a_pick_in_two_queries_and_what_sending_needs_costs_no_more(
    django_assert_num_queries,
) -> None:
    tenant = make_tenant("loader.example")
    healthy = make_endpoint(tenant, "http://127.0.0.1:9/a")
    failing = make_endpoint(tenant, "http://127.0.0.1:9/b")
    failing_since = datetime(2026, 12, 3, 8, 30, 15, 250000, tzinfo=UTC)
    Endpoint.objects.filter(pk=failing.pk).update(
        consecutive_failures=2, enabled=False, failing_since=failing_since
    )
    publish(tenant, "order.created", {"n": "é"})
    ids = [*Delivery.objects.values_list("id", flat=True), "01JNOTAROW0000000000000000"]

    # Deliveries with their endpoints, then their events by id (a join could not prune
    # the events' day partitions on PostgreSQL).
    with django_assert_num_queries(2):
        loaded = loading.load_many(ids)
        # Everything sending, triage and recording read is loaded (no deferred query).
        seen = [
            (
                d.status,
                d.attempts,
                d.event.id,
                d.event.event_type,
                d.event.content_type,
                bytes(d.event.payload),
                d.endpoint.url,
                d.endpoint.enabled,
                d.endpoint.timeout_seconds,
                d.endpoint.consecutive_failures,
                d.endpoint.failing_since,
                d.endpoint.last_success_at,
            )
            for d in loaded.values()
        ]

    assert len(loaded) == 2  # the unknown id is simply not there
    by_url = {row[6]: row for row in seen}
    assert by_url[healthy.url][7] is True and by_url[failing.url][7] is False
    assert by_url[failing.url][9] == 2
    assert by_url[failing.url][10] == failing_since  # an aware datetime, as the ORM reads it
    assert by_url[healthy.url][10] is None
    [event] = Event.objects.all()
    assert {row[5] for row in seen} == {bytes(event.payload)}
    assert {row[2] for row in seen} == {event.id}
    assert loading.load_many([]) == {}


def hang_one_delivery_each(url: str, count: int) -> None:
    """`count` endpoints at `url` (which never answers), cap 1 each, one delivery to each."""
    tenant = make_tenant("acme")
    for i in range(count):
        make_endpoint(tenant, f"{url}h{i}", max_in_flight=1, timeout_seconds=30)
    publish(tenant, "x", {})  # a tenant's event goes to each of its endpoints


def test_hung_endpoints_hold_sockets_not_threads(engine) -> None:
    # A hundred endpoints that never answer, each at its cap of one, and a healthy one:
    # one worker holds all hundred requests open in its one request loop (the old engine
    # would have needed a hundred threads) while the healthy deliveries go out.
    from tests.http_receivers import HangingServer

    hung_endpoints = 100
    with HangingServer() as hanging, Recorder() as healthy:
        hang_one_delivery_each(hanging.url, hung_endpoints)
        other = make_tenant("quiet")
        make_endpoint(other, healthy.url)
        running = engine(concurrency=hung_endpoints + 28)
        assert wait_until(lambda: len(hanging.connections) >= hung_endpoints, timeout=20)
        for i in range(30):
            publish(other, "y", {"i": i})
        assert wait_until(
            lambda: (
                Delivery.objects.filter(tenant=other, status=Delivery.Status.DELIVERED).count()
                == 30
            ),
            timeout=20,
        )
        # Still holding every hung request, in the threads the engine started with.
        assert sum(log.closed_at is None for log in hanging.connections) == hung_endpoints
        assert get_scheduler().snapshot().in_flight >= hung_endpoints
        # All of them in one thread: the engine starts no thread per request.
        names = [t.name for t in threading.enumerate()]
        assert names.count("delivery-requests") == 1
        assert not [name for name in names if name.startswith("delivery-slot")]
        running.stop(graceful=False)


def test_healthy_connections_stay_alive_while_hundreds_of_requests_hang(engine) -> None:
    # libcurl's connection cache counts busy connections too: sized for idle ones alone,
    # 300 hung requests left no room, and every healthy delivery opened a new connection.
    from tests.http_receivers import SilentServer

    hung_endpoints = 300
    with SilentServer() as silent, Recorder() as healthy:
        hang_one_delivery_each(silent.url, hung_endpoints)
        other = make_tenant("quiet")
        make_endpoint(other, healthy.url, max_in_flight=2)
        running = engine(concurrency=hung_endpoints + 20)
        assert wait_until(lambda: silent.open_connections() >= hung_endpoints, timeout=20)
        for i in range(40):
            publish(other, "y", {"i": i})
        requests = healthy.wait_for(40, timeout=20)
        assert silent.open_connections() == hung_endpoints
        running.stop(graceful=False)
    # Two requests at a time at most (the cap), over kept-alive connections.
    assert len({r.client_port for r in requests}) <= 4


def test_a_renewal_racing_an_acknowledgement_reports_no_lost_lease(caplog) -> None:
    """The renewer snapshots the held leases, then renews them; one acknowledged in
    between is released, not lost. Only a lease that vanished while still held is."""
    scheduler = get_scheduler()
    tenant = make_tenant("acme")
    endpoint = make_endpoint(tenant)
    scheduler.enqueue([Item(new_ulid(), tenant.pk, endpoint.pk, max_in_flight=2) for i in range(2)])
    engine = DeliveryEngine(concurrency=2, scheduler=scheduler)
    acked, vanished = scheduler.pick("w", 2).leases
    engine._leases.update({lease.delivery_id: lease for lease in (acked, vanished)})
    engine._releasing.add(acked.delivery_id)  # being recorded: its ack is on the way
    scheduler.ack([acked, vanished])  # the second one's ack stands in for an expiry

    with caplog.at_level("WARNING", logger="delivery.pipeline.engine"):
        assert engine.renew_leases() == [vanished.delivery_id]
    assert "1 leases expired before renewal" in caplog.text


def test_the_releaser_leaves_out_leases_the_recorder_has_acknowledged() -> None:
    # Acknowledged, a lease's slot is free already: answering it again would only cost
    # Redis a look-up per lease. One the recorder is still recording is answered.
    class Answers:
        def __init__(self) -> None:
            self.calls: list[list[str]] = []

        def answered(self, leases, answers=()) -> int:
            self.calls.append([lease.delivery_id for lease in leases])
            return len(leases)

    answers = Answers()
    running = DeliveryEngine(concurrency=4, scheduler=answers, worker_id="w")
    acknowledged, recording, unrecorded = (
        Lease(new_ulid(), 1, 1, "f", deadline=time.time() + 30, token="t") for _ in range(3)
    )
    running._leases.update({lease.delivery_id: lease for lease in (recording, unrecorded)})
    running._releasing.add(recording.delivery_id)
    for lease in (acknowledged, recording, unrecorded):
        running._answered.put(lease)
    running._answered.put(engine_module._STOP)
    try:
        running._release_loop()
    finally:
        running._curl.close()
    assert answers.calls == [[recording.delivery_id, unrecorded.delivery_id]]


def _adaptive_limit(endpoint: Endpoint) -> float:
    """The endpoint's limit as the schedule holds it (0: none, or no work left)."""
    return endpoint_row(get_scheduler(), endpoint.pk).get("al", 0)


def test_an_adaptive_limit_backs_off_on_503s_from_a_real_endpoint(engine, settings) -> None:
    settings.DELIVERY_ADAPTIVE_CONCURRENCY = "all"
    with Recorder(Reply(503)) as receiver:
        tenant = make_tenant("acme")
        endpoint = make_endpoint(tenant, receiver.url, max_in_flight=20)
        for i in range(4):
            publish(tenant, "x", {"i": i})
        assert _adaptive_limit(endpoint) == 4  # a new limit starts low, under the cap
        engine()
        receiver.wait_for(8, timeout=10)  # the first attempts, then retries
        # Each round trip of 503s halves it (at most once per round trip), down to one.
        assert wait_until(lambda: _adaptive_limit(endpoint) == 1, timeout=10)


def test_an_endpoint_with_a_fixed_cap_keeps_it_where_limits_adapt(settings) -> None:
    settings.DELIVERY_ADAPTIVE_CONCURRENCY = "all"
    tenant = make_tenant("acme")
    fixed = make_endpoint(tenant, "http://127.0.0.1:9/fixed", max_in_flight=20)
    fixed.fixed_max_in_flight = True
    fixed.save()
    adapting = make_endpoint(tenant, "http://127.0.0.1:9/adapting", max_in_flight=20)
    publish(tenant, "x", {})
    assert _adaptive_limit(fixed) == 0  # its cap is its limit
    assert _adaptive_limit(adapting) == 4
    fixed.fixed_max_in_flight = False
    fixed.save()  # the schedule learns at once: a limit turned on starts low
    assert wait_until(lambda: _adaptive_limit(fixed) == 4, timeout=5)


def test_an_endpoint_without_a_cap_of_its_own_gets_the_platforms(settings) -> None:
    settings.DELIVERY_ADAPTIVE_CONCURRENCY = "off"
    settings.DELIVERY_MAX_IN_FLIGHT, settings.DELIVERY_ADAPTIVE_CEILING = 3, 48
    tenant = make_tenant("acme")
    endpoint = make_endpoint(tenant, "http://127.0.0.1:9/hook")
    assert endpoint.max_in_flight is None
    publish(tenant, "x", {})
    assert endpoint_row(get_scheduler(), endpoint.pk)["m"] == 3  # the fixed cap
    settings.DELIVERY_ADAPTIVE_CONCURRENCY = "all"
    publish(tenant, "x", {})  # each enqueue refreshes what the schedule knows
    row = endpoint_row(get_scheduler(), endpoint.pk)
    assert (row["m"], row["al"]) == (48, 4)  # the ceiling; the limit starts low under it
    endpoint.max_in_flight = 20
    endpoint.save()  # a cap of its own is its ceiling from now on
    assert wait_until(lambda: endpoint_row(get_scheduler(), endpoint.pk)["m"] == 20, timeout=5)


def test_by_default_an_endpoint_without_a_cap_finds_its_pace_and_a_set_cap_stays_fixed(
    engine, settings, monkeypatch
) -> None:
    settings.DELIVERY_ADAPTIVE_CONCURRENCY = "uncapped"
    settings.DELIVERY_ADAPTIVE_CEILING = 48
    scheduler, told = get_scheduler(), set()
    answered = scheduler.answered

    def noting_answers(leases, answers=()):
        told.update(answer.endpoint_id for answer in answers)
        return answered(leases, answers)

    monkeypatch.setattr(scheduler, "answered", noting_answers)
    with Recorder(Reply(503)) as receiver:
        tenant = make_tenant("acme")
        unstated = make_endpoint(tenant, f"{receiver.url}unstated")
        stated = make_endpoint(tenant, f"{receiver.url}stated", max_in_flight=20)
        for i in range(10):
            publish(tenant, "x", {"i": i})
        assert endpoint_row(get_scheduler(), unstated.pk)["m"] == 48  # the ceiling
        assert _adaptive_limit(unstated) == 4
        stated_row = endpoint_row(get_scheduler(), stated.pk)
        assert (stated_row["m"], stated_row["al"]) == (20, 0)  # its cap is its limit
        engine()
        stated_limits = []

        def backed_off() -> bool:
            stated_limits.append(_adaptive_limit(stated))
            return _adaptive_limit(unstated) == 1

        # The engine sends the answers, and only the one that adapts moves.
        assert wait_until(backed_off, timeout=10)
        assert set(stated_limits) == {0}
        # Answers go to the scheduler for the endpoint that adapts alone.
        assert told == {unstated.pk}
    unstated.max_in_flight = 10
    unstated.save()  # a cap typed in is fixed from now on: its limit is forgotten
    assert wait_until(lambda: _adaptive_limit(unstated) == 0, timeout=5)


def test_new_connections_handshakes_do_not_read_as_the_receiver_slowing(
    engine, settings, localhost_cert
) -> None:
    """A limit that grows opens new connections, and far away their TLS handshakes take
    round trips a reused connection does not: the limit moves on the receiver's own time
    (answer_ms), or each step up would read as the receiver slowing and back it off. Here
    every request is a new connection whose handshake takes 150 ms, and the receiver
    answers in 20 ms."""
    settings.DELIVERY_ADAPTIVE_CONCURRENCY = "uncapped"
    handshakes = []

    def slow_handshake(_sock, name, _context) -> None:
        handshakes.append(name)
        time.sleep(0.15)

    context = tls_context(*localhost_cert, [])
    context.sni_callback = slow_handshake
    close = Reply(delay=0.02, headers={"Connection": "close"})
    with Recorder(close, ssl_context=context) as receiver:
        tenant = make_tenant("acme")
        endpoint = make_endpoint(tenant, f"https://localhost:{receiver.port}/")
        running = engine(concurrency=32)
        running.transport.ca_certs = str(localhost_cert[0])  # the receiver's own certificate
        for i in range(30):
            publish(tenant, "x", {"i": i})
        recent = []

        def all_delivered() -> bool:
            recent.append(endpoint_row(get_scheduler(), endpoint.pk).get("lf", 0))
            return statuses() == {Delivery.Status.DELIVERED: 30}

        assert wait_until(all_delivered, timeout=30), statuses()
    assert len(handshakes) >= 30  # every request paid one
    measured = [ms for ms in recent if ms]
    assert measured, recent
    # Its recent latency is the answers' 20 ms and our own overhead, nowhere near the
    # 170 ms each whole request took.
    assert max(measured) < 100, measured


def test_an_adaptive_limit_grows_on_fast_answers_from_a_real_endpoint(engine, settings) -> None:
    settings.DELIVERY_ADAPTIVE_CONCURRENCY = "all"
    with Recorder(Reply(200, delay=0.02)) as receiver:
        tenant = make_tenant("acme")
        endpoint = make_endpoint(tenant, receiver.url, max_in_flight=20)
        for i in range(60):
            publish(tenant, "x", {"i": i})
        assert _adaptive_limit(endpoint) == 4
        engine(concurrency=32)
        # It starts at 4 and doubles per round trip of fast answers, up to the cap.
        assert wait_until(lambda: _adaptive_limit(endpoint) > 4, timeout=10)
        assert wait_until(lambda: statuses() == {Delivery.Status.DELIVERED: 60}, timeout=20)

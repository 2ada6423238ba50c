"""core.outage_log: an expected outage is said once, then once a minute with a count."""

import logging

import pytest

from core import outage_log
from core.outage_log import OutageLog


def test_said_once_then_counted_then_said_with_the_count(caplog, monkeypatch) -> None:
    clock = [1000.0]
    monkeypatch.setattr(outage_log.time, "monotonic", lambda: clock[0])
    log = OutageLog(logging.getLogger("test.outage"), every_seconds=60)
    with caplog.at_level(logging.WARNING, logger="test.outage"):
        said = [log.warn("Redis down (%s)", "refused") for _ in range(500)]
        clock[0] += 61
        said.append(log.warn("Redis down (%s)", "refused"))
    assert said.count(True) == 2
    lines = [record.getMessage() for record in caplog.records]
    assert lines == [
        "Redis down (refused)",
        "Redis down (refused) (499 more like it in the last 60 s)",
    ]
    assert all(
        record.levelno == logging.WARNING and not record.exc_info for record in caplog.records
    )


@pytest.mark.django_db
def test_events_accepted_while_redis_is_down_say_so_once(
    settings, caplog, django_capture_on_commit_callbacks
) -> None:
    """Ingest during an outage: every event is kept for the sweeper, and the log gets one
    line, not one per event."""
    import socket

    from core import redis_connection
    from delivery.models import Delivery
    from delivery.pipeline import enqueueing
    from delivery.scheduler import reset_scheduler
    from ingest.publish import publish
    from tests.factories import make_endpoint, make_tenant

    with socket.socket() as probe:  # a loopback port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    tenant = make_tenant("acme")
    make_endpoint(tenant, "http://127.0.0.1:9/hook")
    enqueueing._redis_down = OutageLog(enqueueing.logger)
    settings.REDIS_URL = f"redis://127.0.0.1:{port}/0"
    redis_connection.forget()
    reset_scheduler()
    try:
        with caplog.at_level(logging.WARNING, logger="delivery.pipeline.enqueueing"):
            for i in range(50):
                with django_capture_on_commit_callbacks(execute=True):
                    publish(tenant, "order.created", {"i": i})
    finally:
        redis_connection.forget()
        reset_scheduler()
    assert Delivery.objects.filter(needs_schedule=True).count() == 50
    lines = [r for r in caplog.records if r.name == "delivery.pipeline.enqueueing"]
    assert len(lines) == 1 and "left for the sweeper" in lines[0].getMessage()


def test_another_librarys_outage_errors_become_one_warning_a_minute(caplog, monkeypatch) -> None:
    clock = [50.0]
    monkeypatch.setattr(outage_log.time, "monotonic", lambda: clock[0])
    rq_like = logging.getLogger("test.rq.worker")
    rq_like.addFilter(outage_log.OutageFilter("could not connect to Redis"))
    with caplog.at_level(logging.INFO, logger="test.rq.worker"):
        for seconds in (1, 2, 4, 8):
            rq_like.error("could not connect to Redis instance: refused. retrying in %d s", seconds)
        rq_like.info("a job finished")  # anything else goes through untouched
        clock[0] += 61
        rq_like.error("could not connect to Redis instance: refused. retrying in %d s", 16)
    said = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert said == [
        ("WARNING", "could not connect to Redis instance: refused. retrying in 1 s"),
        ("INFO", "a job finished"),
        (
            "WARNING",
            "could not connect to Redis instance: refused. retrying in 16 s"
            " (3 more like it in the last 60 s)",
        ),
    ]

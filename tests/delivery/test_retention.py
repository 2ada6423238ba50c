"""Retention (delivery.upkeep.retention): expired history goes in bounded batches, open work never.

Runs on SQLite and PostgreSQL (CI runs the suite on both). Rows are made "old" the way
they really are: ids (ULIDs) carry their creation time, and delivered_at / at / created_at
are set to match.
"""

import os
import re
import subprocess
import sys
from datetime import datetime, timedelta

import pytest
from django.core.management import call_command
from django.db import connection
from django.db.models import Q
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from core.ids import new_ulid
from delivery.models import Attempt, Delivery, ReplayJob
from delivery.replays.resend import resend
from delivery.scheduler import get_scheduler
from delivery.upkeep import maintenance, retention
from tenants.models import AuditEntry, Membership
from tests.factories import make_endpoint, make_tenant, make_user
from tests.pg_plans import in_parent_names
from webhooks.models import Event

pytestmark = pytest.mark.django_db

S = Delivery.Status
NOW = timezone.now()


def _ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


@pytest.fixture
def hook():
    tenant = make_tenant()
    return make_endpoint(tenant)


@pytest.fixture(autouse=True)
def policy(settings):
    settings.RETENTION_DAYS = 30
    settings.DEAD_LETTER_RETENTION_DAYS = 90
    settings.PAYLOAD_RETENTION_DAYS = 30
    settings.AUDIT_RETENTION_DAYS = 365
    settings.RETENTION_BATCH_SIZE = 2000
    return settings


def old_event(endpoint, days: float, statuses=(S.DELIVERED,), *, delivered_days=None, attempts=1):
    """An event made `days` ago with one delivery per status (each with `attempts`
    attempts); delivered ones delivered `delivered_days` ago (default: when made)."""
    made = NOW - timedelta(days=days)
    event = Event.objects.create(
        id=new_ulid(_ms(made)),
        tenant=endpoint.tenant,
        event_type="orders/paid",
        payload=b'{"order": 42}',
        received_at=made,
    )
    for status in statuses:
        delivered = NOW - timedelta(days=delivered_days if delivered_days is not None else days)
        delivery = Delivery.objects.create(
            id=new_ulid(_ms(made)),
            event=event,
            endpoint=endpoint,
            tenant=endpoint.tenant,
            status=status,
            enqueued_at=made,
            delivered_at=delivered if status == S.DELIVERED else None,
        )
        for number in range(1, attempts + 1):
            Attempt.objects.create(
                delivery=delivery,
                endpoint=endpoint,
                number=number,
                started_at=made,
                outcome=Attempt.Outcome.DELIVERED
                if status == S.DELIVERED
                else Attempt.Outcome.RETRY,
            )
    return event


def run(**kwargs) -> retention.Result:
    kwargs.setdefault("until_done", True)
    kwargs.setdefault("rest", False)
    return retention.prune(now=NOW, **kwargs)


def exists(event: Event) -> bool:
    return Event.objects.filter(pk=event.pk).exists()


def test_open_work_survives_whatever_its_age(hook) -> None:
    ancient = [old_event(hook, 2000, [status]) for status in (S.PENDING, S.RETRY_SCHEDULED, S.HELD)]
    result = run()
    assert result.total == 0
    assert Delivery.objects.count() == 3
    assert Attempt.objects.count() == 3
    for event in ancient:
        event.refresh_from_db()
        assert event.payload_pruned_at is None
        assert bytes(event.payload) == b'{"order": 42}'


def test_expired_delivered_history_goes_with_attempts_and_event(hook) -> None:
    expired = old_event(hook, 31, attempts=3)
    recent = old_event(hook, 29)
    result = run()
    assert not exists(expired)
    assert not Delivery.objects.filter(event_id=expired.pk).exists()
    assert exists(recent)
    assert Delivery.objects.filter(event_id=recent.pk).count() == 1
    assert Attempt.objects.count() == 1  # only the recent delivery's attempt
    assert result.counts["deliveries"] == 1
    assert result.counts["attempts"] == 3
    assert result.counts["events"] == 1


def test_a_delivered_delivery_is_kept_counting_from_when_it_was_delivered(hook) -> None:
    # Waited 39 days on a disabled endpoint, delivered two days ago: kept.
    late = old_event(hook, 40, delivered_days=2)
    run()
    assert Delivery.objects.filter(event_id=late.pk).count() == 1
    assert exists(late)


def test_dead_letters_are_kept_longer(hook) -> None:
    dead_40 = old_event(hook, 40, [S.DEAD])
    dead_100 = old_event(hook, 100, [S.DEAD], attempts=2)
    result = run()
    assert Delivery.objects.filter(event_id=dead_40.pk).exists()
    dead_40.refresh_from_db()
    # A dead letter may be replayed, which sends the payload: its event keeps it.
    assert dead_40.payload_pruned_at is None and bytes(dead_40.payload)
    assert not exists(dead_100)
    assert result.counts["dead"] == 1
    assert result.counts["attempts"] == 2


def test_payload_dropped_with_a_marker_and_metadata_kept(hook, policy) -> None:
    policy.PAYLOAD_RETENTION_DAYS = 7
    stale = old_event(hook, 10)
    fresh = old_event(hook, 5)
    result = run()
    stale.refresh_from_db()
    fresh.refresh_from_db()
    assert bytes(stale.payload) == b""
    assert stale.payload_pruned_at == NOW
    assert stale.event_type == "orders/paid"
    assert Delivery.objects.filter(event_id=stale.pk).count() == 1
    assert Attempt.objects.filter(delivery__event_id=stale.pk).count() == 1
    assert fresh.payload_pruned_at is None and bytes(fresh.payload) == b'{"order": 42}'
    assert result.counts["payloads"] == 1
    # A second run changes nothing more.
    assert run().counts["payloads"] == 0


def test_a_pruned_payload_is_never_sent_again(hook, policy) -> None:
    policy.PAYLOAD_RETENTION_DAYS = 7
    stale = old_event(hook, 10)
    run()
    delivery = Delivery.objects.get(event_id=stale.pk)
    assert resend([delivery]) == 0
    delivery.refresh_from_db()
    assert delivery.status == S.DELIVERED


def test_an_event_with_one_open_delivery_is_kept(hook, policy) -> None:
    policy.PAYLOAD_RETENTION_DAYS = 7
    event = old_event(hook, 400, [S.DELIVERED, S.HELD])
    run()
    event.refresh_from_db()
    assert event.payload_pruned_at is None and bytes(event.payload) == b'{"order": 42}'
    held = Delivery.objects.get(event_id=event.pk)
    # The delivered sibling went by its own age; the open one and its attempt stay.
    assert held.status == S.HELD
    assert Attempt.objects.filter(delivery=held).count() == 1


def test_an_event_without_deliveries_goes_after_retention(hook) -> None:
    lonely = old_event(hook, 31, [])
    young = old_event(hook, 20, [])
    run()
    assert not exists(lonely)
    assert exists(young)


def test_batches_are_bounded_and_the_rest_waits_for_the_next_run(hook, policy) -> None:
    policy.RETENTION_BATCH_SIZE = 3
    for _ in range(10):
        old_event(hook, 35)
    first = retention.prune(now=NOW, seconds=0)  # one batch per step, then stop
    assert not first.done
    assert first.counts["deliveries"] == 3
    assert Delivery.objects.count() == 7
    with CaptureQueriesContext(connection) as queries:
        retention.prune(now=NOW, seconds=0)
    # Every batch's SELECT reads at most RETENTION_BATCH_SIZE rows (EXISTS subqueries
    # have their own LIMIT 1 inside, not at the end).
    limits = [re.search(r"LIMIT (\d+)\s*$", q["sql"]) for q in queries]
    assert {int(m.group(1)) for m in limits if m} == {3}
    runs = 2
    while not retention.prune(now=NOW, seconds=0).done:
        runs += 1
        assert runs < 20
    assert Delivery.objects.count() == 0
    assert Event.objects.count() == 0


def test_the_event_walk_goes_on_from_where_the_last_run_stopped(hook, policy) -> None:
    policy.RETENTION_BATCH_SIZE = 2
    keep = [old_event(hook, 200 - i, [S.HELD]) for i in range(4)]  # first in the key order
    gone = old_event(hook, 40, [])
    # Each run reads one two-row batch of events: the held ones' events, then the rest.
    # Starting over each time, the walk would never get past the held ones.
    retention.prune(now=NOW, seconds=0)
    retention.prune(now=NOW, seconds=0)
    assert exists(gone)
    assert retention.prune(now=NOW, seconds=0).counts["events"] == 1
    assert not exists(gone)
    assert all(exists(event) for event in keep)
    # The pass is over: the next one starts at the beginning again.
    assert get_scheduler().connection.get(retention.CURSOR_KEY + "events") in (None, b"")


def test_the_sweep_rests_between_walks(hook) -> None:
    retention.prune(now=NOW)  # a full pass over nothing: the walks rest now
    lonely = old_event(hook, 40, [])  # matched no endpoint: only the event walk finds it
    retention.prune(now=NOW)
    assert exists(lonely)
    get_scheduler().connection.delete(retention.CURSOR_KEY + "events:rest")
    assert retention.prune(now=NOW).counts["events"] == 1
    assert not exists(lonely)


def test_audit_entries_follow_their_own_setting(hook) -> None:
    tenant = hook.tenant

    def entry(days: int) -> AuditEntry:
        return AuditEntry.objects.create(
            at=NOW - timedelta(days=days),
            actor_name="ops",
            tenant=tenant,
            action=AuditEntry.Action.ENDPOINT_CHANGED,
            via=AuditEntry.Via.ADMIN,
        )

    old, kept = entry(400), entry(40)  # 40 days: past RETENTION_DAYS, not the audit's
    result = run()
    assert not AuditEntry.objects.filter(pk=old.pk).exists()
    assert AuditEntry.objects.filter(pk=kept.pk).exists()
    assert result.counts["audit"] == 1


def test_finished_replay_jobs_follow_retention_days(hook) -> None:
    def job(state: str, days: int) -> ReplayJob:
        at = NOW - timedelta(days=days)
        return ReplayJob.objects.create(
            tenant=hook.tenant,
            created_by_name="ops",
            created_at=at,
            state=state,
            finished_at=None if state == ReplayJob.State.RUNNING else at,
        )

    finished, running, recent = (
        job(ReplayJob.State.FINISHED, 40),
        job(ReplayJob.State.RUNNING, 40),
        job(ReplayJob.State.CANCELLED, 5),
    )
    run()
    assert set(ReplayJob.objects.values_list("pk", flat=True)) == {running.pk, recent.pk}
    assert not ReplayJob.objects.filter(pk=finished.pk).exists()


def test_the_sweep_prunes_and_reports_it(hook, caplog) -> None:
    old_event(hook, 31)
    get_scheduler().start_epoch()
    with caplog.at_level("INFO", logger="delivery.upkeep.retention"):
        result = maintenance.sweep()
    assert "retention pruned 1 deliveries, 1 attempts, 1 events" in caplog.text
    assert result["pruned_deliveries"] == 1
    assert result["pruned_events"] == 1
    assert Event.objects.count() == 0


def test_prune_history_command_dry_run_then_for_real(hook, capsys, policy) -> None:
    policy.RETENTION_BATCH_SIZE = 1  # the dry run pages through batches it cannot delete
    old_event(hook, 31)
    old_event(hook, 32)
    old_event(hook, 100, [S.DEAD])
    call_command("prune_history", "--dry-run")
    out = capsys.readouterr().out
    assert "would remove" in out
    assert "deliveries: 2" in out and "dead: 1" in out and "events: 3" in out
    assert Delivery.objects.count() == 3
    call_command("prune_history")
    out = capsys.readouterr().out
    assert "removed" in out and "deliveries: 2" in out and "events: 3" in out
    assert Delivery.objects.count() == 0 and Event.objects.count() == 0


def test_the_message_page_shows_the_marker(client, hook, policy) -> None:
    policy.PAYLOAD_RETENTION_DAYS = 7
    event = old_event(hook, 10)
    run()
    user = make_user("viewer", tenant=hook.tenant)
    assert Membership.objects.get(user=user).role == Membership.VIEWER
    client.force_login(user)
    body = client.get(reverse("tenants:message", args=[hook.tenant.key, event.pk])).content
    body = body.decode()
    assert 'id="payload-removed"' in body
    assert "Payload removed after 7 days" in body
    assert "order" not in body.split('id="payload-removed"')[1].split("</section>")[0]


def test_a_tenant_admin_cannot_resend_a_pruned_payload(client, hook, policy) -> None:
    policy.PAYLOAD_RETENTION_DAYS = 7
    event = old_event(hook, 10)
    run()
    delivery = Delivery.objects.get(event_id=event.pk)
    user = make_user("boss", tenant=hook.tenant)
    Membership.objects.filter(user=user).update(role=Membership.ADMIN)
    client.force_login(user)
    page = client.get(reverse("tenants:message", args=[hook.tenant.key, event.pk]))
    resend_url = reverse("tenants:resend", args=[hook.tenant.key, event.pk, delivery.pk])
    assert resend_url not in page.content.decode()  # no button
    response = client.post(resend_url, follow=True)
    assert response.status_code == 200
    assert "its event&#x27;s payload was removed" in response.content.decode()
    delivery.refresh_from_db()
    assert delivery.status == S.DELIVERED
    assert not AuditEntry.objects.filter(action=AuditEntry.Action.DELIVERY_RESENT).exists()


def test_the_admin_shows_the_marker(staff_client, hook, policy) -> None:
    policy.PAYLOAD_RETENTION_DAYS = 7
    event = old_event(hook, 10)
    run()
    page = staff_client.get(reverse("admin:webhooks_event_change", args=[event.pk]))
    assert page.status_code == 200
    assert "Payload removed after 7 days" in page.content.decode()


@pytest.mark.skipif(connection.vendor != "sqlite", reason="SQLite's query planner")
def test_batches_are_index_ranges_on_sqlite() -> None:
    def plan(queryset) -> str:
        sql, params = queryset.query.sql_with_params()
        with connection.cursor() as cursor:
            cursor.execute(f"EXPLAIN QUERY PLAN {sql}", params)
            return " | ".join(str(row[-1]) for row in cursor.fetchall())

    cutoff = NOW - timedelta(days=30)
    delivered = Delivery.objects.filter(status=S.DELIVERED, delivered_at__lt=cutoff)

    def batch(queryset):
        return queryset.order_by("delivered_at", "id").values_list("delivered_at", "id")[:2000]

    assert "delivery_delivered_at_idx" in plan(batch(delivered))
    # The next page of a dry run (keyset after the last row) stays an index range.
    after = NOW - timedelta(days=40)
    next_page = delivered.filter(delivered_at__gte=after).filter(
        Q(delivered_at__gt=after) | Q(id__gt="01")
    )
    assert "delivery_delivered_at_idx" in plan(batch(next_page))
    for model in (Delivery, Event):
        walk = (
            model.objects.filter(pk__gt="", pk__lt=new_ulid())
            .order_by("pk")
            .values_list("pk", flat=True)[:2000]
        )
        text = plan(walk)
        assert "COVERING INDEX sqlite_autoindex" in text and "SCAN" not in text.replace(
            "SEARCH", ""
        )


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"PAYLOAD_RETENTION_DAYS": "40"}, "PAYLOAD_RETENTION_DAYS=40 exceeds RETENTION_DAYS=30"),
        ({"RETENTION_DAYS": "0"}, "RETENTION_DAYS='0' is not valid"),
        ({"AUDIT_RETENTION_DAYS": "x"}, "AUDIT_RETENTION_DAYS='x' is not valid"),
    ],
)
def test_settings_are_validated_at_start_up(env, message) -> None:
    clean = {k: v for k, v in os.environ.items() if "RETENTION" not in k}
    proc = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        env={**clean, "DJANGO_SETTINGS_MODULE": "project.settings", **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    assert message in proc.stderr


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's query planner")
def test_batches_can_use_the_indexes_on_postgresql() -> None:
    """With sequential scans priced out (tiny test tables would otherwise always scan),
    the planner must find an index for each batch: the partial delivered_at indexes'
    condition is implied by the query's, and the walks are primary-key ranges. On empty
    test tables either delivered_at index may win (CI saw both); on a real one the
    ordered delivered_at index saves the sort."""
    from django.db import transaction

    cutoff = NOW - timedelta(days=30)
    queries = {
        ("delivery_delivered_at_idx", "delivery_tenant_delivered_idx"): Delivery.objects.filter(
            status=S.DELIVERED, delivered_at__lt=cutoff
        )
        .order_by("delivered_at", "id")
        .values_list("delivered_at", "id")[:2000],
        ("delivery_delivery_pkey",): Delivery.objects.filter(pk__gt="", pk__lt=new_ulid())
        .order_by("pk")
        .values_list("pk", flat=True)[:2000],
        ("webhooks_event_pkey",): Event.objects.filter(pk__gt="", pk__lt=new_ulid())
        .order_by("pk")
        .values_list("pk", flat=True)[:2000],
    }
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        for indexes, queryset in queries.items():
            sql, params = queryset.query.sql_with_params()
            cursor.execute(f"EXPLAIN {sql}", params)
            plan = in_parent_names("\n".join(row[0] for row in cursor.fetchall()))
            assert any(index in plan for index in indexes), plan
            assert "Seq Scan" not in plan, plan

"""The migration path to time partitions, on a copy with data (PostgreSQL).

A database of its own is migrated to just before the partitions (delivery 0006), filled
through the ORM with that point's historical models, then migrated to the end: every row
must still be there and readable, in the legacy partitions, with new rows going to their
day, attempt ids continuing, idempotency keys still caught across the cut-over, and the
keys to tenants still enforced.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from django.db import connection

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        connection.vendor != "postgresql", reason="time partitions are PostgreSQL's"
    ),
]

ROOT = Path(__file__).resolve().parents[2]

FILL = """
import django, json
django.setup()
from datetime import timedelta
from django.db import connection
from django.utils import timezone
from django.db.migrations.loader import MigrationLoader
from core.ids import new_ulid

# The models as the applied migrations leave them (no column younger than this schema,
# and no model's methods or signals, which read today's columns).
loader = MigrationLoader(connection)
models = loader.project_state(nodes=list(loader.applied_migrations), at_end=True).apps
Tenant, Endpoint = models.get_model("tenants", "Tenant"), models.get_model("tenants", "Endpoint")
Source, Event = models.get_model("webhooks", "Source"), models.get_model("webhooks", "Event")
Delivery = models.get_model("delivery", "Delivery")
Attempt = models.get_model("delivery", "Attempt")

tenant = Tenant.objects.create(key="shop-a.example", name="shop-a.example")
endpoint = Endpoint.objects.create(tenant=tenant, url="http://127.0.0.1:9/hook", max_in_flight=2)
source = Source.objects.create(slug="shop", scheme="hmac-sha256", fairness_key="body.shop_id")
now = timezone.now()
for n in range(120):
    made = now - timedelta(days=n % 40, minutes=n)
    event = Event.objects.create(
        id=new_ulid(int(made.timestamp() * 1000)), source=source, tenant=tenant,
        payload=b'{"n": %d}' % n, idempotency_key=f"key-{n}", received_at=made,
    )
    status = ("delivered", "pending", "dead", "retry_scheduled")[n % 4]
    delivery = Delivery.objects.create(
        event=event, endpoint=endpoint, tenant=tenant, status=status,
        delivered_at=made if status == "delivered" else None,
    )
    for number in range(1, n % 3 + 2):
        Attempt.objects.create(delivery=delivery, endpoint=endpoint, number=number, outcome="retry")
print(json.dumps({
    "events": Event.objects.count(), "deliveries": Delivery.objects.count(),
    "attempts": Attempt.objects.count(), "last_attempt": Attempt.objects.order_by("-id")[0].id,
    "statuses": sorted(Delivery.objects.values_list("status", flat=True)),
}))
"""

CHECK = """
import django, json
django.setup()
from django.db import IntegrityError, connection, transaction
from delivery.upkeep import partitions
from delivery.models import Attempt, Delivery
from ingest.accept import accept
from webhooks.models import Event, Source

def where(table):
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT DISTINCT tableoid::regclass::text FROM {table}")
        return sorted(row[0] for row in cursor.fetchall())

before = {t: where(t) for t in ("webhooks_event", "delivery_delivery", "delivery_attempt")}
source = Source.objects.get()
repeat = accept(source=source, tenant=source.events.first().tenant, event_type="x", headers={},
                content_type="application/json", payload=b"{}", idempotency_key="key-7")
fresh = accept(source=source, tenant=repeat.event.tenant, event_type="x", headers={},
               content_type="application/json", payload=b"{}", idempotency_key="key-new")
delivery = Delivery.objects.get(event=fresh.event)
attempt = Attempt.objects.create(delivery=delivery, number=1, outcome="delivered")
try:
    with transaction.atomic():
        Event.objects.create(tenant_id=987654, payload=b"{}")
    orphan = "accepted"
except IntegrityError:
    orphan = "refused"
print(json.dumps({
    "in_use": partitions.in_use(),
    "before": before,
    "events": Event.objects.count() - 1, "deliveries": Delivery.objects.count() - 1,
    "attempts": Attempt.objects.count() - 1,
    "statuses": sorted(Delivery.objects.exclude(pk=delivery.pk).values_list("status", flat=True)),
    "payload_7": bytes(Event.objects.get(idempotency_key="key-7").payload).decode(),
    "repeat_created": repeat.created,
    "fresh_where": where("webhooks_event WHERE id = '%s'" % fresh.event.pk),
    "new_attempt_id": attempt.id,
    "orphan": orphan,
}))
"""


@pytest.fixture
def copy_database():
    settings = connection.settings_dict
    name = f"{settings['NAME']}_migration_copy"
    server = {
        "host": settings["HOST"] or "127.0.0.1",
        "port": settings["PORT"] or 5432,
        "user": settings["USER"] or "postgres",
    }
    admin = psycopg.connect(dbname="postgres", autocommit=True, **server)
    admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
    admin.execute(f'CREATE DATABASE "{name}"')
    url = f"postgres://{server['user']}@{server['host']}:{server['port']}/{name}"
    yield url
    admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    admin.close()


def _run(url: str, *args: str) -> str:
    env = {**os.environ, "DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": "project.settings"}
    done = subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_unpartitioned_tables_with_data_migrate_to_partitions(copy_database) -> None:
    _run(copy_database, "manage.py", "migrate", "-v0", "webhooks", "0004")
    _run(copy_database, "manage.py", "migrate", "-v0", "delivery", "0006")
    filled = json.loads(_run(copy_database, "-c", FILL).strip().splitlines()[-1])
    assert filled["events"] == 120 and filled["attempts"] > 120

    _run(copy_database, "manage.py", "migrate", "-v0")
    checked = json.loads(_run(copy_database, "-c", CHECK).strip().splitlines()[-1])

    assert checked["in_use"] is True
    for table, found in checked["before"].items():
        assert found == [f"{table}_legacy"], (table, found)
    for count in ("events", "deliveries", "attempts"):
        assert checked[count] == filled[count], count
    assert checked["statuses"] == filled["statuses"]
    assert checked["payload_7"] == '{"n": 7}'
    assert checked["repeat_created"] is False  # key-7 is in the legacy partition
    assert checked["fresh_where"][0].startswith("webhooks_event_p")
    assert checked["new_attempt_id"] == filled["last_attempt"] + 1
    assert checked["orphan"] == "refused"

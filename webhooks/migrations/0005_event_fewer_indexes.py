"""Two fewer indexes on Event: every accepted event writes each index of its table, and
an ingest flood writes little else (issue #22; the figures: docs/BENCHMARKS.md).

- The single-column foreign-key index on Event.tenant: `event_tenant_recent_idx` and
  `event_tenant_type_idx` lead with the same column and serve every look-up by tenant
  (the admin's and the message log's filters, PROTECT's check before a tenant is deleted).
- On PostgreSQL, the varchar_pattern_ops copy Django adds to a char primary key for LIKE
  queries: nothing looks event ids up with LIKE (the admin's search takes a ULID as the
  primary key, and its substring search cannot use such an index anyway).

Both run after the time partitions (delivery 0007), on the partitioned parent: dropping
a parent's index drops every partition's copy.
"""

import django.db.models.deletion
from django.db import migrations, models


def drop_like_index(apps, schema_editor) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        # The parent's index only (a partition's copy goes with it); on an unpartitioned
        # table it is the table's own.
        cursor.execute(
            "SELECT i.indexrelid::regclass::text FROM pg_index i "
            "WHERE i.indrelid = to_regclass(%s) AND pg_get_indexdef(i.indexrelid) LIKE %s",
            ["webhooks_event", "%varchar_pattern_ops%"],
        )
        for (name,) in cursor.fetchall():
            cursor.execute(f"DROP INDEX {name}")  # a regclass name, quoted where it must be


def recreate_like_index(apps, schema_editor) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(
        "CREATE INDEX IF NOT EXISTS webhooks_event_id_like ON webhooks_event "
        "(id varchar_pattern_ops)"
    )


class Migration(migrations.Migration):
    dependencies = [
        ("webhooks", "0004_event_payload_pruned_at"),
        ("delivery", "0007_time_partitions"),
    ]

    operations = [
        migrations.AlterField(
            model_name="event",
            name="tenant",
            field=models.ForeignKey(
                blank=True,
                db_index=False,
                help_text="Empty: the key was missing and the event went to the fallback lane.",
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="events",
                to="tenants.tenant",
            ),
        ),
        migrations.RunPython(drop_like_index, recreate_like_index),
    ]

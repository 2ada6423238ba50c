"""Events, deliveries and attempts in daily time partitions on PostgreSQL (nothing on
SQLite): delivery.upkeep.partition_conversion says how and what it costs."""

import time

from django.db import migrations

from core.ids import ulid_floor


def partition(apps, schema_editor) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    from delivery.upkeep import partition_conversion
    from delivery.upkeep import partitions

    if partitions.in_use():
        return
    # Every id made so far sorts below the next millisecond's smallest one.
    partition_conversion.convert(ulid_floor(int(time.time() * 1000) + 1))
    partitions.ensure_ahead()


def refuse(apps, schema_editor) -> None:
    if schema_editor.connection.vendor == "postgresql":
        raise RuntimeError(
            "Un-partitioning the history tables is not supported: restore a backup instead."
        )


class Migration(migrations.Migration):
    dependencies = [
        ("delivery", "0006_replay_jobs"),
        ("webhooks", "0004_event_payload_pruned_at"),
    ]

    operations = [migrations.RunPython(partition, refuse)]

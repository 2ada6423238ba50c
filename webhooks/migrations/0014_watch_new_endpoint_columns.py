"""The configuration's version watches the endpoint's new columns.

send_trace_context and operational_events (tenants 0009).

A column added to a watched table (0006) must be in its triggers' `UPDATE OF` list, and on
SQLite adding it rebuilt the table, which dropped its triggers: both are re-created here
for tenants_endpoint, as 0006 (SQLite) and 0010 (PostgreSQL) made them, with the columns.
A later column added to a watched table calls `recreate` with its own list.
"""

import importlib

from django.db import migrations

v0006 = importlib.import_module("webhooks.migrations.0006_config_version")

TABLE = "tenants_endpoint"
COLUMNS = [*v0006.COLUMNS[TABLE], "send_trace_context", "operational_events"]


def _watched(columns: list[str], table: str) -> str:
    return ", ".join(c for c in columns if c not in v0006.UNWATCHED[table])


def recreate(schema_editor, table: str, columns: list[str]) -> None:
    watched = _watched(columns, table)
    vendor = schema_editor.connection.vendor
    if vendor == "sqlite":
        bump = f"INSERT OR REPLACE INTO {v0006.TABLE} (id, v) VALUES (1, random())"
        events = {"insert": "INSERT", "update": f"UPDATE OF {watched}", "delete": "DELETE"}
        if table in v0006.NO_INSERT_TRIGGER:
            del events["insert"]
        for name, event in events.items():
            schema_editor.execute(f"DROP TRIGGER IF EXISTS {table}_config_{name}")
            schema_editor.execute(
                f"CREATE TRIGGER {table}_config_{name} AFTER {event} ON {table}"
                f" BEGIN {bump}; END"
            )
    elif vendor == "postgresql":
        events = ["DELETE", f"UPDATE OF {watched}"]
        if table not in v0006.NO_INSERT_TRIGGER:
            events.insert(0, "INSERT")
        events_sql = " OR ".join(events)
        schema_editor.execute(f"DROP TRIGGER IF EXISTS {table}_config_changed ON {table}")
        schema_editor.execute(f"DROP TRIGGER IF EXISTS {table}_config_touched ON {table}")
        schema_editor.execute(
            f"CREATE CONSTRAINT TRIGGER {table}_config_changed AFTER {events_sql} ON {table}"
            " DEFERRABLE INITIALLY DEFERRED FOR EACH ROW"
            " EXECUTE FUNCTION webhooks_config_changed()"
        )
        schema_editor.execute(
            f"CREATE TRIGGER {table}_config_touched AFTER {events_sql} OR TRUNCATE ON {table}"
            " FOR EACH STATEMENT EXECUTE FUNCTION webhooks_config_touched()"
        )


def forwards(apps, schema_editor) -> None:
    recreate(schema_editor, TABLE, COLUMNS)


def backwards(apps, schema_editor) -> None:
    recreate(schema_editor, TABLE, v0006.COLUMNS[TABLE])


class Migration(migrations.Migration):
    dependencies = [
        ("webhooks", "0013_trace_context"),
        ("tenants", "0009_endpoint_tracing_and_operational_events"),
    ]

    operations = [migrations.RunPython(forwards, backwards)]

"""PostgreSQL: the configuration's version is written as a change commits, not as it is made.

Migration 0006's triggers wrote the version row at each changing statement, so a
transaction held that one row's lock from its first change to its commit, and took row
locks after it. Two transactions could then wait for each other: a worker's recorder
locks endpoint B (its failure count) and wants the version row to disable B, while
another recorder (or an admin's save) holds the version row from disabling endpoint A
and wants B's row next. PostgreSQL breaks the cycle by failing one of them ("deadlock
detected"), and an outage that disables many endpoints at once makes it likely.

Now:
- a constraint trigger, DEFERRABLE INITIALLY DEFERRED, per changed row, writes the new
  version at commit, once per transaction (a transaction-local flag). A transaction then
  asks for the version row's lock last, when it takes no other lock after it, so no wait
  for it can close a cycle;
- a statement trigger marks the transaction as one that changed the configuration
  (`webhooks.config_touched`, transaction-local), and the version ingest reads
  (`ingest.config_cache.version_sql`) is none in such a transaction: nothing it reads there,
  uncommitted changes included, is kept. (Before, it read the transaction's own new
  version.)
- TRUNCATE (statement triggers only) still writes the version at once; it locks the whole
  table anyway.

Watched tables and columns are 0006's. SQLite has one writer at a time and no row locks:
its triggers stay.
"""

import importlib

from django.db import migrations

# The tables and columns watched, as 0006 made them.
tables = importlib.import_module("webhooks.migrations.0006_config_version")

BUMP = (
    f"INSERT INTO {tables.TABLE} (id, v)"
    " VALUES (1, floor(random() * 9007199254740991)::bigint)"
    " ON CONFLICT (id) DO UPDATE SET v = EXCLUDED.v;"
)

FUNCTIONS = [
    # Once per transaction: its later rows' triggers find the flag set.
    "CREATE OR REPLACE FUNCTION webhooks_config_changed() RETURNS trigger"
    " LANGUAGE plpgsql AS $$\nBEGIN\n"
    "  IF current_setting('webhooks.config_bumped', true) IS DISTINCT FROM 'on' THEN\n"
    f"    {BUMP}\n"
    "    PERFORM set_config('webhooks.config_bumped', 'on', true);\n"
    "  END IF;\n  RETURN NULL;\nEND $$",
    "CREATE FUNCTION webhooks_config_touched() RETURNS trigger LANGUAGE plpgsql AS $$\n"
    "BEGIN\n  PERFORM set_config('webhooks.config_touched', 'on', true);\n"
    "  RETURN NULL;\nEND $$",
]


def _events(table: str) -> list[str]:
    events = ["DELETE", f"UPDATE OF {tables._watched(table)}"]
    if table not in tables.NO_INSERT_TRIGGER:
        events.insert(0, "INSERT")
    return events


def forwards(apps, schema_editor) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    for statement in FUNCTIONS:
        schema_editor.execute(statement)
    for table in tables.COLUMNS:
        events = " OR ".join(_events(table))
        schema_editor.execute(f"DROP TRIGGER IF EXISTS {table}_config_changed ON {table}")
        schema_editor.execute(
            f"CREATE CONSTRAINT TRIGGER {table}_config_changed AFTER {events} ON {table}"
            " DEFERRABLE INITIALLY DEFERRED FOR EACH ROW"
            " EXECUTE FUNCTION webhooks_config_changed()"
        )
        schema_editor.execute(
            f"CREATE TRIGGER {table}_config_touched AFTER {events} OR TRUNCATE ON {table}"
            " FOR EACH STATEMENT EXECUTE FUNCTION webhooks_config_touched()"
        )
        schema_editor.execute(
            f"CREATE TRIGGER {table}_config_truncated AFTER TRUNCATE ON {table}"
            " FOR EACH STATEMENT EXECUTE FUNCTION webhooks_config_changed()"
        )


def backwards(apps, schema_editor) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    for table in tables.COLUMNS:
        for name in ("changed", "touched", "truncated"):
            schema_editor.execute(f"DROP TRIGGER IF EXISTS {table}_config_{name} ON {table}")
        schema_editor.execute(
            f"CREATE TRIGGER {table}_config_changed"
            f" AFTER {' OR '.join(_events(table))} OR TRUNCATE ON {table}"
            " FOR EACH STATEMENT EXECUTE FUNCTION webhooks_config_changed()"
        )
    schema_editor.execute("DROP FUNCTION IF EXISTS webhooks_config_touched()")
    schema_editor.execute(
        "CREATE OR REPLACE FUNCTION webhooks_config_changed() RETURNS trigger"
        f" LANGUAGE plpgsql AS $$\nBEGIN\n  {BUMP}\n  RETURN NULL;\nEND $$"
    )


class Migration(migrations.Migration):
    dependencies = [("webhooks", "0009_key_guard_other_days")]

    operations = [migrations.RunPython(forwards, backwards)]

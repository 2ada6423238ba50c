"""A version of what ingest looks up on every request, changed by the database itself.

Ingest reads a source and its secrets, a tenant and the destinations on every request;
`ingest.config_cache` keeps them between requests, each valid for one version. The
version is one row, set to a new random value by triggers in the same transaction as any
change to those tables (so it commits or rolls back with the change, and a rolled-back
value is never seen again), whoever makes it: the admin, a QuerySet.update(), raw SQL.

Not watched, because ingest does not use them and they change on the hot paths:
- Source.fallback_count (one UPDATE per fallback event);
- Endpoint's health columns (consecutive_failures, failing_since, last_success_at,
  last_failure_at: written by the workers on every failure and once a minute on success);
- a new tenant (auto-registration, one per new key in a flood): ingest keeps only tenants
  it found, so a new row makes nothing it kept wrong.

On PostgreSQL the triggers are per statement and also fire on TRUNCATE. On SQLite they are
per row, and a table that Django's schema editor rebuilds (an altered column) loses them:
tests/ingest/test_config_cache.py checks, on the migrated database, that every watched
table has its triggers and that they watch every column but the ones named here. A
migration that adds or alters a column of these tables must re-create them.
"""

from django.db import migrations

TABLE = "webhooks_config_version"

# table -> columns whose UPDATE does not change the version (see above)
UNWATCHED = {
    "webhooks_source": ["fallback_count"],
    "webhooks_sourcesecret": [],
    "webhooks_source_destinations": [],
    "tenants_tenant": [],
    "tenants_endpoint": [
        "consecutive_failures",
        "failing_since",
        "last_success_at",
        "last_failure_at",
    ],
}
COLUMNS = {
    "webhooks_source": [
        "id",
        "slug",
        "name",
        "scheme",
        "hmac_header",
        "hmac_encoding",
        "hmac_prefix",
        "fairness_key",
        "auto_register_tenants",
        "auto_register_limit",
        "auto_register_suspended_at",
        "auto_register_suspended_reason",
        "auto_register_resumed_at",
        "is_active",
        "fallback_count",
        "created_at",
    ],
    "webhooks_sourcesecret": ["id", "source_id", "secret", "created_at", "expires_at"],
    "webhooks_source_destinations": ["id", "source_id", "endpoint_id"],
    "tenants_tenant": [
        "id",
        "key",
        "name",
        "weight",
        "is_active",
        "rate_limit_per_second",
        "auto_registered",
        "registered_by_id",
        "created_at",
    ],
    "tenants_endpoint": [
        "id",
        "tenant_id",
        "url",
        "description",
        "event_types",
        "max_in_flight",
        "rate_limit_per_second",
        "retry_max_in_flight",
        "timeout_seconds",
        "sign_requests",
        "enabled",
        "disabled_reason",
        "disabled_at",
        "consecutive_failures",
        "failing_since",
        "last_success_at",
        "last_failure_at",
        "created_at",
    ],
}
NO_INSERT_TRIGGER = {"tenants_tenant"}


def _watched(table: str) -> str:
    return ", ".join(c for c in COLUMNS[table] if c not in UNWATCHED[table])


def _postgresql() -> list[str]:
    statements = [
        f"CREATE TABLE {TABLE} (id smallint PRIMARY KEY, v bigint NOT NULL)",
        f"INSERT INTO {TABLE} (id, v) VALUES (1, floor(random() * 9007199254740991)::bigint)",
        "CREATE FUNCTION webhooks_config_changed() RETURNS trigger LANGUAGE plpgsql AS $$\n"
        f"BEGIN\n  INSERT INTO {TABLE} (id, v)"
        " VALUES (1, floor(random() * 9007199254740991)::bigint)\n"
        "  ON CONFLICT (id) DO UPDATE SET v = EXCLUDED.v;\n  RETURN NULL;\nEND $$",
    ]
    for table in COLUMNS:
        events = ["DELETE", "TRUNCATE", f"UPDATE OF {_watched(table)}"]
        if table not in NO_INSERT_TRIGGER:
            events.insert(0, "INSERT")
        statements.append(
            f"CREATE TRIGGER {table}_config_changed AFTER {' OR '.join(events)} ON {table}"
            " FOR EACH STATEMENT EXECUTE FUNCTION webhooks_config_changed()"
        )
    return statements


def _sqlite() -> list[str]:
    bump = f"INSERT OR REPLACE INTO {TABLE} (id, v) VALUES (1, random())"
    statements = [
        f"CREATE TABLE {TABLE} (id integer PRIMARY KEY, v integer NOT NULL)",
        f"INSERT INTO {TABLE} (id, v) VALUES (1, random())",
    ]
    for table in COLUMNS:
        events = {"delete": "DELETE", "update": f"UPDATE OF {_watched(table)}"}
        if table not in NO_INSERT_TRIGGER:
            events["insert"] = "INSERT"
        for name, event in events.items():
            statements.append(
                f"CREATE TRIGGER {table}_config_{name} AFTER {event} ON {table}"
                f" BEGIN {bump}; END"
            )
    return statements


def create(apps, schema_editor) -> None:
    vendor = schema_editor.connection.vendor
    if vendor not in ("postgresql", "sqlite"):
        return  # no version table: ingest.config_cache then reads every time
    for statement in _postgresql() if vendor == "postgresql" else _sqlite():
        schema_editor.execute(statement)


def drop(apps, schema_editor) -> None:
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        for table in COLUMNS:
            schema_editor.execute(f"DROP TRIGGER IF EXISTS {table}_config_changed ON {table}")
        schema_editor.execute("DROP FUNCTION IF EXISTS webhooks_config_changed()")
    elif vendor == "sqlite":
        for table in COLUMNS:
            for name in ("insert", "update", "delete"):
                schema_editor.execute(f"DROP TRIGGER IF EXISTS {table}_config_{name}")
    else:
        return
    schema_editor.execute(f"DROP TABLE IF EXISTS {TABLE}")


class Migration(migrations.Migration):
    dependencies = [
        ("webhooks", "0005_event_fewer_indexes"),
        ("tenants", "0006_audit_tenant_actions"),
    ]

    operations = [migrations.RunPython(create, drop)]

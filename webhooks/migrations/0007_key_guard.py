"""PostgreSQL: the idempotency guard across time partitions as one function, so that a
keyed event's check and write are one statement (ingest.accept; docs/INGEST.md).

`webhooks_key_guard` takes the key's transaction-level advisory lock (the same lock
`ingest.idempotency.lock` takes, so single events and batches wait for each other), then
looks across the partitions for an earlier event with the key, and raises a
unique_violation if there is one: the statement that called it (the event's INSERT and
its deliveries') is then rolled back whole, and the caller answers with the earlier
event, as for a collision on a partition's own unique index.

It is VOLATILE so that its look-up takes a snapshot of its own, after the lock: a
concurrent request holding the lock has committed by then, and its event is seen. It
skips the calling statement's own event (`own_id`), which may already be inserted when
it runs. The look-up is `ingest.idempotency.stored_ids`'s, for one key.
"""

from django.db import migrations

CREATE = """
CREATE FUNCTION webhooks_key_guard(
    lock_text text, by_source boolean, scope bigint, key text, own_id text, bound text
) RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
BEGIN
  PERFORM pg_advisory_xact_lock(hashtextextended(lock_text, 0));
  IF by_source THEN
    PERFORM 1 FROM webhooks_event e WHERE e.source_id = scope AND e.idempotency_key = key
      AND e.source_id IS NOT NULL AND e.id < bound AND e.id <> own_id LIMIT 1;
  ELSE
    PERFORM 1 FROM webhooks_event e WHERE e.tenant_id = scope AND e.idempotency_key = key
      AND e.source_id IS NULL AND e.id < bound AND e.id <> own_id LIMIT 1;
  END IF;
  IF FOUND THEN
    RAISE unique_violation USING MESSAGE = 'idempotency key stored earlier: ' || lock_text;
  END IF;
  RETURN true;
END $$
"""


def create(apps, schema_editor) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE)


def drop(apps, schema_editor) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(
            "DROP FUNCTION IF EXISTS webhooks_key_guard(text, boolean, bigint, text, text, text)"
        )


class Migration(migrations.Migration):
    dependencies = [("webhooks", "0006_config_version")]

    operations = [migrations.RunPython(create, drop)]

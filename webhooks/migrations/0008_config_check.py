"""PostgreSQL: check the configuration's version inside a write statement.

Ingest answers from look-ups kept under a version of the configuration
(`ingest.config_cache`). Instead of reading the version in a statement of its own before
the look-ups, a request that found everything kept assumes the newest version its
process has seen, and its one write statement calls `webhooks_config_check(assumed)`:
if the version is another by then, the function raises, the statement (the event, its
deliveries, everything) rolls back, and the request starts again reading the version
first. The check runs after the request began, so a change committed before it is always
seen: a revoked secret or a disabled endpoint still applies to the next request.

VOLATILE, so that it reads the version as committed when it runs, not as of the
statement's start. The SQLSTATE is our own (WHCFG), so that nothing else is taken for it.
"""

from django.db import migrations

CREATE = """
CREATE FUNCTION webhooks_config_check(expected bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
  IF (SELECT v FROM webhooks_config_version WHERE id = 1) IS DISTINCT FROM expected THEN
    RAISE EXCEPTION 'the configuration changed since it was read'
      USING ERRCODE = 'WHCFG';
  END IF;
  RETURN true;
END $$
"""


def create(apps, schema_editor) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE)


def drop(apps, schema_editor) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("DROP FUNCTION IF EXISTS webhooks_config_check(bigint)")


class Migration(migrations.Migration):
    dependencies = [("webhooks", "0007_key_guard")]

    operations = [migrations.RunPython(create, drop)]

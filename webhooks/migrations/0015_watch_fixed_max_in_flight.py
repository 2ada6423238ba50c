"""The configuration's version watches the endpoint's fixed_max_in_flight (tenants 0010):
ingest enqueues with it (whether the endpoint's limit adapts), so a change must reach the
very next request. Triggers re-created as 0014 says a later column does."""

import importlib

from django.db import migrations

v0014 = importlib.import_module("webhooks.migrations.0014_watch_new_endpoint_columns")

COLUMNS = [*v0014.COLUMNS, "fixed_max_in_flight"]


def forwards(apps, schema_editor) -> None:
    v0014.recreate(schema_editor, v0014.TABLE, COLUMNS)


def backwards(apps, schema_editor) -> None:
    v0014.recreate(schema_editor, v0014.TABLE, v0014.COLUMNS)


class Migration(migrations.Migration):
    dependencies = [
        ("webhooks", "0014_watch_new_endpoint_columns"),
        ("tenants", "0010_endpoint_fixed_max_in_flight"),
    ]

    operations = [migrations.RunPython(forwards, backwards)]

"""tenants 0011 made the endpoint's max_in_flight optional, and on SQLite altering a column
rebuilt the table, which dropped its triggers: re-created here with 0015's columns."""

import importlib

from django.db import migrations

v0014 = importlib.import_module("webhooks.migrations.0014_watch_new_endpoint_columns")
v0015 = importlib.import_module("webhooks.migrations.0015_watch_fixed_max_in_flight")


def forwards(apps, schema_editor) -> None:
    v0014.recreate(schema_editor, v0014.TABLE, v0015.COLUMNS)


class Migration(migrations.Migration):
    dependencies = [
        ("webhooks", "0015_watch_fixed_max_in_flight"),
        ("tenants", "0011_endpoint_max_in_flight_optional"),
    ]

    # Nothing to undo: the triggers are 0015's. (Reversing tenants 0011 on SQLite rebuilds
    # the table once more, after this step: migrate webhooks back past 0015 and forward
    # again to re-create them there.)
    operations = [migrations.RunPython(forwards, migrations.RunPython.noop)]

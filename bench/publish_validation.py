"""CPU per event of the publish API's validation: our `ingest.publish.validate` against a
Django Form with the same fields, side by side in one process; and what an enforced
event type schema adds (webhooks.models.EventType). A script, not a test:

    .venv/bin/python bench/publish_validation.py [--events 2000] [--rounds 3]

Why it exists: the publish API validates each event of a batch by hand rather than with
a Form. This measures what a Form would cost per event (docs/BENCHMARKS.md), what
checking a small payload against a small enforced schema costs on top, and the batch's
one catalogue read (ingest.catalogue), with its validator kept and with it compiled.
"""

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    tmp = tempfile.mkdtemp(prefix="bench-validation-")
    os.environ.update(
        DJANGO_SETTINGS_MODULE="project.settings",
        DATABASE_URL=f"sqlite:///{tmp}/db.sqlite3",
        VAR_DIR=tmp,
        REDIS_URL="redis://127.0.0.1:6379/15",  # never used: no signal fires here
        LOG_LEVEL="WARNING",
    )
    import django

    django.setup()
    from django import forms
    from django.core.management import call_command

    from ingest import catalogue
    from ingest.publish import tenants_by_key, validate
    from tenants.models import Tenant
    from webhooks.models import EventType

    call_command("migrate", verbosity=0)
    Tenant.objects.bulk_create([Tenant(key="acme")])  # bulk: no post_save, no Redis
    EventType.objects.create(
        name="orders/checked",
        enforce_schema=True,
        schema={
            "type": "object",
            "properties": {
                "id": {"type": "integer"},
                "items": {"type": "array", "items": {"type": "integer"}},
                "note": {"type": "string", "maxLength": 1000},
            },
            "required": ["id", "items"],
        },
    )

    def events_of(event_type: str) -> list[dict]:
        return [
            {
                "tenant": "acme",
                "event_type": event_type,
                "payload": {"id": i, "items": [1, 2, 3], "note": "x" * 200},
                "idempotency_key": f"key-{i}",
            }
            for i in range(args.events)
        ]

    items = events_of("orders/create")  # not in the catalogue: nothing to check
    checked_items = events_of("orders/checked")
    tenants = tenants_by_key(items)
    checked_tenants = tenants_by_key(checked_items)

    class AnyJson(forms.Field):
        def to_python(self, value: object) -> object:
            return value

    class EventForm(forms.Form):
        tenant = forms.CharField(max_length=200)
        event_type = forms.CharField(max_length=200)
        payload = AnyJson()
        idempotency_key = forms.CharField(max_length=255, required=False)

    def with_form(item: dict) -> tuple:
        form = EventForm(data=item)
        if not form.is_valid():
            raise ValueError(form.errors)
        data = form.cleaned_data
        payload = json.dumps(data["payload"], separators=(",", ":"), allow_nan=False)
        return (
            tenants[data["tenant"]],
            data["event_type"],
            payload.encode(),
            data["idempotency_key"],
        )

    def by_hand(item: dict) -> object:
        return validate(item, tenants=tenants)

    def with_schema(item: dict) -> object:
        return validate(item, tenants=checked_tenants)

    def catalogue_read(keep: bool) -> float:
        """CPU of one batch's catalogue read, in microseconds (median of 50)."""
        times = []
        for _ in range(50):
            if not keep:
                catalogue.clear()
            started = time.process_time()
            catalogue.catalogue_for(["orders/checked"])
            times.append(time.process_time() - started)
        return sorted(times)[len(times) // 2] * 1e6

    runs = (
        ("validate", by_hand, items),
        ("schema", with_schema, checked_items),
        ("form", with_form, items),
    )
    for round_number in range(1, args.rounds + 1):
        figures = {}
        for name, check, batch in runs:
            started = time.process_time()
            for item in batch:
                check(item)
            figures[name] = (time.process_time() - started) / len(batch) * 1e6
        print(
            f"round {round_number}: validate {figures['validate']:.1f} µs, "
            f"with an enforced schema {figures['schema']:.1f} µs "
            f"(+{figures['schema'] - figures['validate']:.1f}), "
            f"Form {figures['form']:.1f} µs CPU per event; "
            f"Form / validate {figures['form'] / figures['validate']:.1f}x"
        )
    print(
        f"catalogue read per batch: {catalogue_read(keep=True):.0f} µs with the validator "
        f"kept, {catalogue_read(keep=False):.0f} µs reading and compiling it"
    )


if __name__ == "__main__":
    main()

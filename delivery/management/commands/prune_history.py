from django.core.management.base import BaseCommand

from delivery.upkeep.retention import prune


class Command(BaseCommand):
    help = (
        "Remove history past its retention (RETENTION_DAYS, DEAD_LETTER_RETENTION_DAYS, "
        "PAYLOAD_RETENTION_DAYS, AUDIT_RETENTION_DAYS) until none is left, in the same short "
        "batches as the sweep: for catching up after lowering a setting. Open work is never "
        "removed. --dry-run only counts."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--dry-run", action="store_true", help="Count, remove nothing.")

    def handle(self, *args, dry_run: bool = False, **options) -> None:
        totals: dict[str, int] = {}
        while True:
            # Runs of the sweep's length, so progress shows and each run's cut-off is fresh.
            result = prune(dry_run=dry_run, until_done=dry_run, rest=False)
            for name, n in result.counts.items():
                totals[name] = totals.get(name, 0) + n
            if not dry_run:
                self.stdout.write(f"  {result.total} rows removed in this run...")
            if result.done:
                break
        verb = "would remove" if dry_run else "removed"
        lines = [f"  {name.replace('_', ' ')}: {n:,}" for name, n in totals.items()]
        self.stdout.write(self.style.SUCCESS(f"Retention {verb}:\n" + "\n".join(lines)))

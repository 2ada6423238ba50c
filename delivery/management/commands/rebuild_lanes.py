from django.core.management.base import BaseCommand

from delivery.maintenance import rebuild_schedule


class Command(BaseCommand):
    help = (
        "Rebuild the whole Redis schedule from the database: every pending and retry-scheduled "
        "delivery goes back into its tenant's lane in arrival order. Use after a Redis loss "
        "(the sweeper also does this by itself within a minute). Deliveries running at that "
        "moment may be delivered twice (same webhook-id), never lost."
    )

    def handle(self, *args, **options) -> None:
        def progress(count: int) -> None:
            self.stdout.write(f"\r  {count} deliveries scheduled...", ending="")
            self.stdout.flush()

        total = rebuild_schedule(progress=progress)
        self.stdout.write(
            self.style.SUCCESS(f"\nSchedule rebuilt: {total} open deliveries in their lanes.")
        )

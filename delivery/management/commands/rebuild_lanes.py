from django.core.management.base import BaseCommand, CommandError

from delivery.maintenance import REBUILD_LOCK_SECONDS, RebuildInProgress, rebuild_schedule


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

        try:
            total = rebuild_schedule(progress=progress)
        except RebuildInProgress as exc:
            raise CommandError(
                f"{exc}: wait for it to finish, or, if that process died, for its lock to "
                f"expire (within {REBUILD_LOCK_SECONDS} s)"
            ) from exc
        self.stdout.write(
            self.style.SUCCESS(f"\nSchedule rebuilt: {total} open deliveries in their lanes.")
        )

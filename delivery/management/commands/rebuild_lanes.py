from django.core.management.base import BaseCommand, CommandError

from delivery.scheduler import Scheduler, get_scheduler
from delivery.upkeep.maintenance import REBUILD_LOCK_SECONDS, RebuildInProgress, rebuild_schedule


def _tags(text: str) -> list[int]:
    try:
        tags = sorted({int(tag) for tag in text.split(",") if tag.strip()})
    except ValueError:
        raise CommandError(f"--forget-shards {text!r}: shard tags, comma-separated") from None
    if any(tag < 0 for tag in tags):
        raise CommandError(f"--forget-shards {text!r}: shard tags are 0 or more")
    return tags


class Command(BaseCommand):
    help = (
        "Rebuild the whole Redis schedule from the database: every pending and retry-scheduled "
        "delivery goes back into its tenant's lane in arrival order. Use after a Redis loss "
        "(the sweeper also does this by itself within a minute), or after SCHEDULER_SHARDS or "
        "SCHEDULER_SHARD changed (with --forget-shards naming the tags no longer used). "
        "Deliveries running at that moment may be delivered twice (same webhook-id), never lost."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument(
            "--forget-shards",
            default="",
            metavar="TAGS",
            help="after the rebuild, delete the schedule of these shard tags (comma-separated):"
            " those SCHEDULER_SHARD and SCHEDULER_SHARDS used before they changed. Their"
            " deliveries are in the rebuilt shards already.",
        )

    def handle(self, *args, **options) -> None:
        forget = _tags(options["forget_shards"])
        scheduler = get_scheduler()
        in_use = sorted(set(forget) & {shard.shard for shard in scheduler.shards})
        if in_use:
            raise CommandError(
                f"--forget-shards names shards in use ({', '.join(map(str, in_use))}): the"
                " schedule's shards now are tags"
                f" {', '.join(str(shard.shard) for shard in scheduler.shards)}"
            )

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
        for tag in forget:
            Scheduler(scheduler.connection, shard=tag).clear()
            self.stdout.write(f"Shard {tag}'s old schedule deleted.")

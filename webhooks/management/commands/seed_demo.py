from django.core.management.base import BaseCommand

from webhooks import demo


class Command(BaseCommand):
    help = "Create the demo superuser, tenants, endpoints and a signed source (idempotent)."

    def add_arguments(self, parser) -> None:
        parser.add_argument(
            "--receiver", default=demo.DEMO_RECEIVER, help="Base URL of the demo receiver."
        )

    def handle(self, *args, receiver: str, **options) -> None:
        creds = demo.seed(receiver)
        self.stdout.write(
            f"Demo data ready. Admin: {creds['admin_user']} / {creds['admin_password']}; "
            f"tenant viewer: {creds['viewer_user']} / {creds['admin_password']}"
        )

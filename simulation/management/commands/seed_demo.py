from django.core.management.base import BaseCommand

from simulation import demo


class Command(BaseCommand):
    help = (
        "Create the demo superuser, tenants, endpoints, members and a signed source (idempotent)."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument(
            "--receiver", default=demo.DEMO_RECEIVER, help="Base URL of the demo receiver."
        )

    def handle(self, *args, receiver: str, **options) -> None:
        logins = demo.seed(receiver)
        self.stdout.write("Demo data ready. Logins (user / password):")
        for user, password in logins.items():
            self.stdout.write(f"  {user} / {password}")

"""`manage.py create_api_token --operator|--tenant KEY [--read-only] [--name NAME]`: make
an API token and print it, the one time it is shown (scripts and checks capture it)."""

from django.core.management.base import BaseCommand, CommandError, CommandParser

from tenants.models import Tenant
from webhooks.models import ApiToken


class Command(BaseCommand):
    help = "Create a management API token and print it (only its hash is kept)."

    def add_arguments(self, parser: CommandParser) -> None:
        whose = parser.add_mutually_exclusive_group(required=True)
        whose.add_argument("--operator", action="store_true", help="A token for every tenant.")
        whose.add_argument("--tenant", metavar="KEY", help="A token for this tenant alone.")
        parser.add_argument("--read-only", action="store_true", help="List and read only.")
        parser.add_argument(
            "--name", default="", help="What the token is for (shown in the admin)."
        )

    def handle(self, *args: object, **options: object) -> None:
        tenant = None
        if options["tenant"]:
            tenant = Tenant.objects.filter(key=options["tenant"]).first()
            if tenant is None:
                raise CommandError(f"No tenant has the key {options['tenant']!r}.")
        access = ApiToken.Access.READ if options["read_only"] else ApiToken.Access.WRITE
        name = options["name"] or (f"{tenant.key} ({access})" if tenant else f"operator ({access})")
        token, plain = ApiToken.issue(name[:100], tenant=tenant, access=access)
        self.stderr.write(f"Created {token}; copy it now, it is not shown again:")
        self.stdout.write(plain)

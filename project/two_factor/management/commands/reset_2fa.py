"""`manage.py reset_2fa USERNAME`: an operator lost their authenticator and their recovery
codes. Their second factor is removed; their next sign-in sets a new one up."""

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from project.two_factor import devices


class Command(BaseCommand):
    help = "Remove a user's second factor (authenticator and recovery codes): they enrol again at their next sign-in."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")

    def handle(self, *args: object, username: str, **options: object) -> None:
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"No user is called {username!r}.")
        removed = devices.forget(user)
        self.stdout.write(
            f"Removed {removed} second-factor device{'s' if removed != 1 else ''} of {username}: "
            "they set up an authenticator again at their next sign-in."
        )

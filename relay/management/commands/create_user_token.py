from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from relay.models import UserToken


class Command(BaseCommand):
    help = "Make a user API token and print it, alone on the last line. It is shown only this once."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("--name", default="", help="What the token is for, e.g. ci or a laptop.")

    def handle(self, *args: Any, **options: Any) -> None:
        User = get_user_model()
        try:
            user = User._default_manager.get_by_natural_key(options["username"])
        except User.DoesNotExist:
            raise CommandError(f"There is no user {options['username']!r}.") from None
        if not user.is_active:
            raise CommandError(f"The user {options['username']!r} is inactive.")
        if len(options["name"]) > 64:
            raise CommandError("A name is at most 64 characters.")
        row, token = UserToken.create_for(user, name=options["name"])
        self.stderr.write(
            f"A new API token for {user.get_username()} ({row.token_prefix}). It is not shown again; "
            "use it as 'Authorization: Token <token>' or 'Bearer <token>'."
        )
        self.stdout.write(token)

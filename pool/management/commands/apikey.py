"""``manage.py apikey create|revoke|list``: issue and revoke API keys from the shell."""

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from pool.models import APIKey


class Command(BaseCommand):
    help = "Issue, revoke and list API keys (stored hashed; a key is shown once, when created)."

    def add_arguments(self, parser):
        actions = parser.add_subparsers(dest="action", required=True)
        create = actions.add_parser("create", help="issue a key and print it once")
        create.add_argument("name")
        create.add_argument("--user", help="username the key belongs to")
        create.add_argument("--max-sessions", type=int, help="concurrent sessions allowed (default: no limit)")
        create.add_argument("--record-audio", choices=["yes", "no"],
                            help="record this key's sessions (default: as the RECORD_AUDIO setting says)")
        revoke = actions.add_parser("revoke", help="revoke a key by its prefix (as `list` shows it)")
        revoke.add_argument("prefix")
        actions.add_parser("list", help="list keys")

    def handle(self, *args, action, **options):
        getattr(self, f"_{action}")(**options)

    def _create(self, name, user=None, max_sessions=None, record_audio=None, **_):
        owner = None
        if user:
            try:
                owner = get_user_model().objects.get(username=user)
            except get_user_model().DoesNotExist:
                raise CommandError(f"No user {user!r}.") from None
        if max_sessions is not None and max_sessions < 1:
            raise CommandError("--max-sessions must be at least 1.")
        api_key, key = APIKey.issue(name, user=owner, max_sessions=max_sessions,
                                    record_audio=None if record_audio is None else record_audio == "yes")
        self.stdout.write(key)
        self.stderr.write(f"Key {api_key.prefix}... issued to {name!r}; it is shown only now.")

    def _revoke(self, prefix, **_):
        matches = APIKey.objects.filter(prefix=prefix, revoked_at__isnull=True)
        if matches.count() != 1:
            raise CommandError(f"{matches.count()} active keys have the prefix {prefix!r}; expected one.")
        matches.update(revoked_at=timezone.now())
        self.stdout.write(f"Revoked {prefix}.")

    def _list(self, **_):
        for api_key in APIKey.objects.select_related("user").order_by("created_at"):
            state = "revoked" if api_key.revoked_at else "active"
            owner = api_key.user.username if api_key.user else "-"
            limit = api_key.max_sessions or "no limit"
            self.stdout.write(f"{api_key.prefix}  {state:8} {api_key.name!r} user={owner} sessions={limit}")

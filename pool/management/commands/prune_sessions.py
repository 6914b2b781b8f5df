"""``manage.py prune_sessions [--dry-run]``: delete the history of sessions past retention.

Meant for cron or any scheduler, e.g. daily: ``manage.py prune_sessions``. Deletes finished
sessions that ended more than ``HISTORY_RETENTION_DAYS`` ago, with their conversation items and
responses (cascade), in batches so that a large history never holds a long transaction. Sessions
that have not ended are kept whatever their age.
"""

from datetime import timedelta

from django.core.management.base import BaseCommand
from django.db import transaction
from django.utils import timezone

from pool.conf import get_config
from pool.models import ConversationItem, Session, SessionResponse


class Command(BaseCommand):
    help = "Delete sessions that ended more than HISTORY_RETENTION_DAYS ago, with their history."

    def add_arguments(self, parser):
        parser.add_argument("--dry-run", action="store_true", help="say what would be deleted, delete nothing")
        parser.add_argument("--batch-size", type=int, default=500, help="sessions deleted per transaction")

    def handle(self, *args, dry_run=False, batch_size=500, **options):
        days = get_config()["HISTORY_RETENTION_DAYS"]
        if days is None:
            self.stdout.write("HISTORY_RETENTION_DAYS is None: sessions are kept; nothing to do.")
            return
        cutoff = timezone.now() - timedelta(days=days)
        expired = Session.objects.filter(ended_at__lt=cutoff)
        if dry_run:
            ids = expired.values("session_id")
            self.stdout.write(
                f"Would delete {expired.count()} sessions that ended before {cutoff:%Y-%m-%d %H:%M} UTC, "
                f"with {ConversationItem.objects.filter(session_id__in=ids).count()} conversation items "
                f"and {SessionResponse.objects.filter(session_id__in=ids).count()} responses.")
            return
        deleted = 0
        while True:
            with transaction.atomic():
                batch = list(expired.values_list("pk", flat=True)[:batch_size])
                if not batch:
                    break
                Session.objects.filter(pk__in=batch).delete()
            deleted += len(batch)
        self.stdout.write(f"Deleted {deleted} sessions that ended before {cutoff:%Y-%m-%d %H:%M} UTC, "
                          "with their history.")

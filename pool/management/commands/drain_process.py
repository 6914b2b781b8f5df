"""``manage.py drain_process [ID ...] [--wait SECONDS]``: take server processes out of service
cleanly, e.g. before a deploy or a machine's maintenance (``pool.control.drain_process``)."""

import time

from django.core.management.base import BaseCommand, CommandError

from pool.control import drain_process
from pool.models import ServerProcess
from pool.states import LIVE_PROCESS_STATES, ProcessState, UnitState


class Command(BaseCommand):
    help = ("Drain server processes: no new sessions or client-secret reservations; each stops once "
            "its sessions have ended. Without IDs, list the live processes.")

    def add_arguments(self, parser):
        parser.add_argument("ids", nargs="*", type=int, help="ServerProcess ids (as the list shows them)")
        parser.add_argument("--wait", type=float, metavar="SECONDS",
                            help="then wait up to this long for them to stop; exit 1 if they have not")

    def handle(self, *args, ids, wait=None, **options):
        if not ids:
            for process in ServerProcess.objects.filter(state__in=LIVE_PROCESS_STATES):
                busy = process.units.exclude(state=UnitState.IDLE).count()
                self.stdout.write(f"{process.pk:>6}  {process} {process.state:<9} {busy}/{process.pool_size} "
                                  f"units busy  {process.public_url}")
            return
        processes = list(ServerProcess.objects.filter(pk__in=ids))
        missing = set(ids) - {p.pk for p in processes}
        if missing:
            raise CommandError(f"No server process with id {', '.join(map(str, sorted(missing)))}.")
        for process in processes:
            ok, message = drain_process(process)
            self.stdout.write(message) if ok else self.stderr.write(message)
        if wait is None:
            return
        deadline = time.monotonic() + wait
        live = ServerProcess.objects.filter(pk__in=ids, state__in=LIVE_PROCESS_STATES)
        while live.exists():
            if time.monotonic() > deadline:
                raise CommandError(f"Still draining after {wait:g} s: "
                                   f"{', '.join(str(p) for p in live)}.")
            time.sleep(0.5)
        stopped = ServerProcess.objects.filter(pk__in=ids, state=ProcessState.STOPPED).count()
        self.stdout.write(f"{stopped} of {len(ids)} stopped.")

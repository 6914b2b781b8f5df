"""``manage.py runpool``: load the models, build the pool and serve HTTP and WebSocket (Daphne)."""

import argparse
import asyncio
import atexit
import logging
import os
import signal
import sys
import time

from channels.routing import get_default_application
from daphne.endpoints import build_endpoint_description_strings
from daphne.server import Server
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError, connection
from django.db.migrations.executor import MigrationExecutor

from pool.backends.cache import PreparationError
from pool.conf import get_config, set_for_process
from pool.process import build_registry, register_process, set_registry

log = logging.getLogger("pool")

_TASKS = set()  # the tasks runpool starts on the event loop, referenced until they end
# The longest request head (request line and headers) answered: Twisted's default, 16 KiB, drops
# the connection without a word when one header line is longer (a 20 kB bearer token). Above
# this, Twisted answers 400.
HEADER_BYTES = 64 * 1024
STOP_NOW_SECONDS = 2.0  # a second signal: what the sessions get to be closed


def _stop_reactor():
    """Stop Twisted's reactor (runpool then shuts the pool down), once: the drain, the end of a
    grace period and a second signal may each ask."""
    from twisted.internet import error, reactor

    try:
        reactor.stop()
    except error.ReactorNotRunning:
        pass


def _spawn(coroutine):
    """Run ``coroutine`` as a task of the running loop, kept referenced until it ends."""
    task = asyncio.ensure_future(coroutine)
    _TASKS.add(task)
    task.add_done_callback(_TASKS.discard)


def _http_limits():
    """Daphne's HTTP connections (Twisted's ``HTTPChannel``) take request heads up to
    HEADER_BYTES, and answer a longer one with 400 instead of closing the connection."""
    from twisted.web.http import HTTPChannel

    HTTPChannel.MAX_LENGTH = HTTPChannel.totalHeadersSize = HEADER_BYTES
    HTTPChannel.lineLengthExceeded = lambda channel, line: channel._respondToBadRequestAndDisconnect()


def _exit_after_stop(code):
    """End the process with exit status ``code`` once the pool has stopped: exit handlers and
    logging first, then ``os._exit(code)`` without the interpreter's finalization. In that finalization a native
    library's thread (suspected: livekit's libwebrtc, loaded for the echo canceller) was
    destroyed unjoined, and the process ended by SIGABRT ("terminate called without an active
    exception") after a clean stop, in about 1 of 4 test servers on a Zen 3 and 9 of 25
    benchmark servers on a Zen 5 (2026-12-03): a supervisor would take a clean stop for a crash.
    runpool serves until it stops; nothing of the process is of use after it."""
    atexit._run_exitfuncs()  # e.g. llama.cpp's socket folder (pool.backends.llm)
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)


class Command(BaseCommand):
    help = "Prepare and load the models, build the pool of units, and serve with Daphne."

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--pool-size", type=int, help="units in the pool (default: S2S['POOL_SIZE'])")
        parser.add_argument("--allow-anonymous", action="store_true",
                            help="serve clients without an API key (the local quick start; "
                                 "S2S['ALLOW_ANONYMOUS'] = True does the same)")
        parser.add_argument("--public-url",
                            help="where clients reach this process, e.g. wss://voice.example.com/a "
                                 "(default: S2S['PUBLIC_URL']); client secrets issued by other "
                                 "processes send their clients there")
        parser.add_argument("--migrate", action=argparse.BooleanOptionalAction, default=None,
                            help="apply pending migrations before serving (default: on for SQLite only; "
                                 "a shared database is migrated once, by the operator)")

    def handle(self, *args, **options):
        if options["allow_anonymous"]:
            set_for_process(ALLOW_ANONYMOUS=True)
        if options["public_url"]:
            set_for_process(PUBLIC_URL=options["public_url"])
        config = get_config()
        size = options["pool_size"] or config["POOL_SIZE"]
        if size < 1:
            raise CommandError("--pool-size must be at least 1")
        self._migrate(options["migrate"])
        try:
            # Registered in the cluster only once it listens (_ready): other processes hand
            # out its units from then on.
            registry = build_registry(config, size, register=False)  # prepares the model cache first when needed
        except PreparationError as exc:
            raise CommandError(str(exc)) from exc
        set_registry(registry)
        from pool.checks import check_layer_shared

        for warning in check_layer_shared(None):
            log.warning("%s %s", warning.msg, warning.hint)
        # Daphne refuses (close 1009) only messages far above our own limit; between the two,
        # the consumer answers with an ``error`` event and the session goes on.
        daphne_limit = 2 * config["MAX_MESSAGE_BYTES"]
        _http_limits()
        server = Server(
            get_default_application(),
            endpoints=build_endpoint_description_strings(host=options["host"], port=options["port"]),
            signal_handlers=False,  # ours below: close sessions with 1001 and drain first
            websocket_max_message_size=daphne_limit,
            websocket_max_frame_size=daphne_limit,
            ready_callable=lambda: self._ready(registry, config, options, size),
            verbosity=0,
        )
        try:
            server.run()
        finally:
            registry.shutdown()
            log.info("pool stopped")
        if server.abort_start:  # Daphne could not listen (it said why): a failure to a supervisor
            log.error("runpool could not listen on %s:%d; stopped", options["host"], options["port"])
            _exit_after_stop(1)
        _exit_after_stop(0)

    @staticmethod
    def _migrate(migrate):
        """Apply pending migrations (``migrate`` None: only on SQLite, a database of its own) or
        stop with one line saying so - never a traceback from the first query of a fresh database."""
        executor = MigrationExecutor(connection)
        if not executor.migration_plan(executor.loader.graph.leaf_nodes()):
            return
        if migrate is None:
            migrate = connection.vendor == "sqlite"
        if not migrate:
            raise CommandError("The database has unapplied migrations: run `manage.py migrate` "
                               "(or `runpool --migrate`) first.")
        log.info("applying migrations to %s", connection.settings_dict["NAME"])
        call_command("migrate", interactive=False, verbosity=0)

    def _ready(self, registry, config, options, size):
        from twisted.internet import reactor

        register_process(registry, config)  # Daphne listens now: clients may be sent here

        signalled = []

        def on_signal(signum, frame):
            # Python runs this on the main thread between two bytecodes, perhaps while that
            # thread holds the registry's lock: it takes no lock, and hands the work to the loop.
            signalled.append(signal.Signals(signum).name)
            reactor.callFromThread(handle_signal, len(signalled))

        def handle_signal(count):
            name = signalled[count - 1]
            if count > 1:  # a second signal: stop now
                log.info("%s again: stopping now", name)
                _spawn(self._stop_now(registry))
                return
            grace = config["SHUTDOWN_GRACE_SECONDS"]
            log.info("%s: draining; live sessions may go on for %g s (a second signal stops at once)", name, grace)
            registry.start_draining()  # no new sessions, no reservations for a process about to go
            _spawn(self._shutdown(registry, config, grace))

        def on_drain():  # from any thread (pool.pipeline.registry.start_draining)
            registry.records.process_draining()
            reactor.callFromThread(_spawn, self._stop_when_drained(registry))

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        registry.drain_listeners.append(on_drain)
        from pool.control import serve_control

        reactor.callWhenRunning(
            _spawn, serve_control(registry, registry.records.control_channel))
        log.info("pool of %d units serving on http://%s:%d (WebSocket /v1/realtime)", size,
                 options["host"], options["port"])
        if config["ALLOW_ANONYMOUS"] is True:
            log.warning("clients without an API key are served (ALLOW_ANONYMOUS): for a machine of "
                        "your own, not behind a public proxy")

    @staticmethod
    async def _stop_when_drained(registry):
        """A drained process stops once its sessions have ended and its units have drained, and
        no client secret still holds one of its units; a signal meanwhile stops it sooner."""
        from pool.access import database
        from pool.access.admission import reserved_indices

        while registry.accepting:
            if await asyncio.to_thread(registry.wait_settled, 1.0):
                try:
                    reserved = await database.call(reserved_indices, registry.records.process_id)
                except DatabaseError:  # the reservations cannot be read: wait for the database
                    reserved = True
                # Reservations first, then "nothing live" and the stop in one step: a secret
                # redeemed in between is either live (and waited for) or refused.
                if not reserved and registry.close_if_settled():
                    log.info("drained: every session has ended; stopping")
                    _stop_reactor()
                    return
                await asyncio.sleep(1.0)  # a secret still holds a unit: it is used or expires

    @staticmethod
    async def _stop_now(registry):
        """A second signal: close every session (1001) without waiting for anything, then stop.
        Consumers left open when the loop stops would be torn down by the garbage collector at
        exit, on half-finalised modules."""
        from realtime.session.lifecycle import close_all

        registry.accepting = False
        try:
            await asyncio.wait_for(close_all(), STOP_NOW_SECONDS)
        except TimeoutError:
            log.warning("stopping now: some sessions did not close within %g s", STOP_NOW_SECONDS)
        _stop_reactor()

    @staticmethod
    async def _shutdown(registry, config, grace):
        """SIGTERM (as container platforms send it, then wait): the process drains; live
        sessions may end by themselves for ``grace`` seconds (SHUTDOWN_GRACE_SECONDS), then the
        rest are closed with 1001 and given SHUTDOWN_DRAIN_SECONDS to drain; then it stops."""
        from realtime.session.lifecycle import close_all

        deadline = time.monotonic() + grace
        while not registry.close_if_settled():  # stops accepting once nothing is live
            if not registry.accepting:
                return  # a second signal is stopping the process
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            await asyncio.to_thread(registry.wait_settled, min(remaining, 1.0))
        registry.accepting = False
        try:
            closed = await asyncio.wait_for(close_all(), config["SHUTDOWN_DRAIN_SECONDS"])
        except TimeoutError:
            closed = "some"
        settled = await asyncio.to_thread(registry.wait_settled, config["SHUTDOWN_DRAIN_SECONDS"])
        log.info("stopping: %s sessions closed after the grace period; drained: %s", closed, settled)
        _stop_reactor()

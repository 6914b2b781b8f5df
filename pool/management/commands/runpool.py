"""``manage.py runpool``: load the models, build the pool and serve HTTP and WebSocket (Daphne)."""

import asyncio
import logging
import signal

from channels.routing import get_default_application
from daphne.endpoints import build_endpoint_description_strings
from daphne.server import Server
from django.core.management.base import BaseCommand, CommandError

from pool.conf import get_config
from pool.prepare import PreparationError
from pool.registry import build_registry, set_registry

log = logging.getLogger("pool")


class Command(BaseCommand):
    help = "Prepare and load the models, build the pool of units, and serve with Daphne."

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--pool-size", type=int, help="units in the pool (default: S2S['POOL_SIZE'])")

    def handle(self, *args, **options):
        config = get_config()
        size = options["pool_size"] or config["POOL_SIZE"]
        if size < 1:
            raise CommandError("--pool-size must be at least 1")
        try:
            registry = build_registry(config, size)  # prepares the model cache first when needed
        except PreparationError as exc:
            raise CommandError(str(exc)) from exc
        set_registry(registry)
        from pool.checks import check_layer_shared

        for warning in check_layer_shared(None):
            log.warning("%s %s", warning.msg, warning.hint)
        # Daphne refuses (close 1009) only messages far above our own limit; between the two,
        # the consumer answers with an ``error`` event and the session goes on.
        daphne_limit = 2 * config["MAX_MESSAGE_BYTES"]
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

    def _ready(self, registry, config, options, size):
        from twisted.internet import reactor

        def on_signal(signum, frame):
            if not registry.accepting:  # a second signal: stop now
                reactor.callFromThread(reactor.stop)
                return
            log.info("%s: closing sessions and draining", signal.Signals(signum).name)
            registry.accepting = False
            reactor.callFromThread(lambda: asyncio.ensure_future(self._shutdown(registry, config)))

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        from pool.control import serve_control

        reactor.callWhenRunning(
            lambda: asyncio.ensure_future(serve_control(registry, registry.records.control_channel)))
        log.info("pool of %d units serving on http://%s:%d (WebSocket /v1/realtime)", size,
                 options["host"], options["port"])

    @staticmethod
    async def _shutdown(registry, config):
        from twisted.internet import reactor

        from realtime.consumers import close_all

        closed = await close_all()
        settled = await asyncio.to_thread(registry.wait_settled, config["SHUTDOWN_DRAIN_SECONDS"])
        log.info("closed %d sessions; drained: %s", closed, settled)
        reactor.stop()

"""The WebSocket endpoint of the Realtime protocol: one consumer per client connection.

connect:    accept (subprotocol "realtime" when offered) -> claim a unit from the pool;
            none free -> ``error`` session_limit_reached, close 1008 (after accept, so a real
            client sees 1008 and not an HTTP 403) -> record the session -> ``session.created``.
receive:    parse the frame -> the session's state machine (``realtime.session``).
send loop:  one task sends queued server events in order.
disconnect: record the end, release the unit; it drains in the background (``pool.registry``).
"""

import asyncio
import json
import logging
import time
import weakref
from urllib.parse import parse_qs

from channels.generic.websocket import AsyncWebsocketConsumer

from pool.conf import get_config
from pool.ids import new_id
from pool.registry import get_registry

from .errors import ProtocolError
from .events import parse_client_frame
from .session import RealtimeSession

log = logging.getLogger(__name__)

SUBPROTOCOL = "realtime"
CLOSE_NORMAL, CLOSE_GOING_AWAY, CLOSE_POLICY_VIOLATION = 1000, 1001, 1008
SUBMIT_RETRY_SECONDS = 0.005  # back-pressure poll while the unit's input queue is full
SUBMIT_WAIT_LIMIT = 5.0  # then the event is refused with server_busy

LIVE = weakref.WeakSet()  # consumers with a claimed unit, for shutdown


class RealtimeConsumer(AsyncWebsocketConsumer):
    unit = None
    session = None
    sender = None
    watchdog = None
    end_reason = "client_close"

    async def connect(self):
        subprotocols = self.scope.get("subprotocols") or []
        await self.accept(SUBPROTOCOL if SUBPROTOCOL in subprotocols else None)
        self.loop = asyncio.get_running_loop()
        self.outbox = asyncio.Queue()
        session_id = new_id("sess")
        self.registry = await asyncio.to_thread(get_registry)  # loads the models on first use
        self.unit = self.registry.claim(session_id)
        if self.unit is None and self.registry.draining():
            self.unit = await asyncio.to_thread(self.registry.claim, session_id,
                                                get_config()["CLAIM_WAIT_SECONDS"])
        if self.unit is None:
            await self._refuse("session_limit_reached",
                               "Every unit of this server's pool is busy; try again later.")
            return
        LIVE.add(self)
        self.registry.records.session_started(session_id, self.unit.index)
        config = get_config()
        query = parse_qs(self.scope.get("query_string", b"").decode("latin-1"))
        defaults = {
            "model": query.get("model", [""])[0] or "s2s-default",
            "instructions": config["DEFAULT_INSTRUCTIONS"],
            "voice": config["DEFAULT_VOICE"],
            "max_output_tokens": config["LLM_MAX_OUTPUT_TOKENS"],
        }
        self.sender = asyncio.create_task(self._send_loop())
        self.ctx = self.unit.begin(self._from_pipeline)
        self.session = RealtimeSession(session_id, self.unit, self.outbox.put_nowait, defaults)
        self.session.start()
        self.last_client_event = time.monotonic()
        if config["IDLE_TIMEOUT_SECONDS"]:
            self.watchdog = asyncio.create_task(self._idle_watchdog(config["IDLE_TIMEOUT_SECONDS"]))
        log.info("session %s started on unit %s", session_id, self.unit.index)

    async def _refuse(self, code, message):
        error = ProtocolError(code, message)
        await self.send(json.dumps({"type": "error", "event_id": new_id("event"), "error": error.to_error()}))
        await self.close(code=CLOSE_POLICY_VIOLATION)

    def _from_pipeline(self, event):
        """Called from stage threads: hand the event to the event loop."""
        self.loop.call_soon_threadsafe(self._deliver, event)

    def _deliver(self, event):
        if self.session is not None and not self.ctx.closed:
            self.session.handle_pipeline_event(event)

    async def _send_loop(self):
        while True:
            event = await self.outbox.get()
            await self.send(text_data=json.dumps(event))

    async def receive(self, text_data=None, bytes_data=None):
        if self.session is None:
            return
        self.last_client_event = time.monotonic()
        size = len(text_data.encode() if text_data is not None else bytes_data or b"")
        limit = get_config()["MAX_MESSAGE_BYTES"]
        try:
            if size > limit:
                raise ProtocolError("message_too_large",
                                    f"A client message may be at most {limit} bytes; got {size}.")
            event = parse_client_frame(text_data, bytes_data)
        except ProtocolError as error:
            self.session.send_error(error)
            return
        # Back-pressure: while the unit's input queue is full, stop reading the socket rather
        # than drop audio - but not forever, or a wedged unit would also block the disconnect.
        waited = 0.0
        while self.unit.input_full() and waited < SUBMIT_WAIT_LIMIT:
            await asyncio.sleep(SUBMIT_RETRY_SECONDS)
            waited += SUBMIT_RETRY_SECONDS
        if self.session is not None:
            self.session.handle_client_event(event)

    async def _idle_watchdog(self, timeout):
        while True:
            idle = time.monotonic() - self.last_client_event
            if idle >= timeout:
                self.session.send_error(ProtocolError(
                    "idle_timeout", f"No client event for {timeout:g} s; closing the session."))
                await self.end("idle_timeout", CLOSE_NORMAL)
                return
            await asyncio.sleep(timeout - idle)

    async def end(self, reason, code):
        """Server-side end of the session: flush queued events, then close with ``code``."""
        if self.session is None:
            return
        self.end_reason, self.close_code = reason, code
        while not self.outbox.empty():
            await asyncio.sleep(0.01)
        await self.close(code=code)

    async def disconnect(self, code):
        if self.unit is None:
            return
        LIVE.discard(self)
        session, self.session = self.session, None
        session.close()
        for task in (self.sender, self.watchdog):
            if task:
                task.cancel()
        code = getattr(self, "close_code", code)
        self.registry.records.session_ended(session.id, self.end_reason, code, session.stats)
        self.registry.release(self.unit)
        log.info("session %s ended (%s, close code %s) on unit %s: %s", session.id, self.end_reason,
                 code, self.unit.index, {k: v for k, v in session.stats.items() if v})
        self.unit = None


async def close_all(reason="shutdown", code=CLOSE_GOING_AWAY):
    """Close every live session of this process (shutdown); returns how many were closed."""
    consumers = list(LIVE)
    await asyncio.gather(*(c.end(reason, code) for c in consumers), return_exceptions=True)
    return len(consumers)

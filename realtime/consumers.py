"""The WebSocket transport of the Realtime protocol: one consumer per client connection.

A thin adapter around ``realtime.session.lifecycle``, which admits the client, runs the session
and releases its unit:

connect:    accept (subprotocol "realtime" when offered) -> ``open_session`` with the credentials
            of the handshake; a refusal -> its ``error`` event, close 1008 (or its own code) after
            accept, so a real client sees the close code and not an HTTP 403.
receive:    check the frame's size, parse it -> ``LiveSession.receive``.
send loop:  one task sends queued server events in order, no faster than the client reads.
disconnect: ``LiveSession.end``. Whatever ends the consumer (a close, an exception, a cancelled
            task), the session ends and its unit is released: ``__call__`` does it in a ``finally``.

Database work runs only at connect, on threads of its own (``pool.access.database``): no message of
any session waits for the database.
"""

import asyncio
import json
import logging
from urllib.parse import parse_qs

from channels.consumer import get_handler_name
from channels.exceptions import StopConsumer
from channels.generic.websocket import AsyncWebsocketConsumer

from pool.access.connect import Credentials
from pool.conf import get_config
from pool.process import get_registry, local_registry
from pool.states import CloseCode, EndReason
from realtime.errors import ProtocolError
from realtime.events import read_client_message
from realtime.flow import WriteFlow
from realtime.session.lifecycle import LiveSession, open_session, refusal_event

log = logging.getLogger(__name__)

SUBPROTOCOL = "realtime"


class RealtimeConsumer(AsyncWebsocketConsumer):
    """One WebSocket client: the ``Transport`` of its ``LiveSession`` (``send_event``,
    ``close_session``). Text frames of JSON in, text frames of JSON out; binary frames are refused
    (``invalid_frame``) and the session goes on."""

    # Sessions never use the channel layer (operator commands go to the process, pool.control).
    # Without this, channels subscribes every consumer to the layer, and a Redis outage would
    # end every session with 1011.
    channel_layer_alias = None

    live = None  # the LiveSession, once admitted
    sender = None
    name = "websocket"  # the session row's transport
    media_format = None  # the audio is in the events, in the session's formats

    async def __call__(self, scope, receive, send):
        try:
            await self._serve(scope, receive, send)
        except Exception:
            log.exception("session consumer failed")
            if self.live is not None:
                self.live.end_reason = EndReason.ERROR
            self.close_code = CloseCode.INTERNAL_ERROR
            raise
        finally:
            self._end(getattr(self, "close_code", CloseCode.INTERNAL_ERROR))

    async def _serve(self, scope, receive, send):
        """channels' ``AsyncConsumer.__call__`` for a consumer without a channel layer: each
        message straight from ``receive`` to ``dispatch``, one after the other. channels'
        ``await_many_dispatch`` also listens to the layer, at the price of a new task and an
        ``asyncio.wait`` per message: at 1,600 appends a second a share of the event loop
        (BENCHMARKS.md, section 3b). Like channels' loop, one message per turn of the event loop:
        ``receive`` does not suspend while messages wait, and a session with a backlog must not
        hold up the other sessions, the socket reads or the health check."""
        self.scope = scope
        self.channel_layer = None
        self.base_send = send
        try:
            while True:
                await self.dispatch(await receive())
                await asyncio.sleep(0)
        except StopConsumer:
            pass

    async def dispatch(self, message):
        # channels' own dispatch first closes Django's old database connections, on the one
        # thread all consumers share: a locked database would then hold every message of every
        # session. This consumer uses the database only through pool.access.database.
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        await handler(message)

    async def websocket_disconnect(self, message):
        await self.disconnect(message["code"])  # without channels' connection cleanup either
        raise StopConsumer

    async def connect(self):
        subprotocols = self.scope.get("subprotocols") or []
        await self.accept(SUBPROTOCOL if SUBPROTOCOL in subprotocols else None)
        self.outbox = asyncio.Queue()
        self.flow = WriteFlow(self.base_send)
        self.sender = asyncio.create_task(self._send_loop())
        # The pool is built once per process (runpool builds it before serving); only the very
        # first connect of an embedding site pays for loading the models, off the event loop.
        registry = local_registry() or await asyncio.to_thread(get_registry)
        query = parse_qs(self.scope.get("query_string", b"").decode("latin-1"))
        opened = await open_session(registry, Credentials.from_scope(self.scope), self, query.get("model", [""])[0])
        if isinstance(opened, LiveSession):
            self.live = opened
            return
        self.send_event(refusal_event(opened))
        await self.close_session(opened.close_code)

    # --- the Transport of realtime.session.lifecycle ------------------------------------------

    def send_event(self, event):
        self.outbox.put_nowait(event)

    async def close_session(self, code):
        """Flush queued events, then close with ``code``."""
        self.close_code = code
        # Until the send loop has sent what is queued, or has stopped (the client left, or read
        # nothing for SLOW_CLIENT_SECONDS): a slow client cannot hold a shutdown.
        flushed = asyncio.ensure_future(self.outbox.join())
        await asyncio.wait((flushed, self.sender), return_when=asyncio.FIRST_COMPLETED)
        flushed.cancel()
        await self.close(code=code)

    # -------------------------------------------------------------------------------------------

    async def _send_loop(self):
        """Send queued events in order, no faster than the client reads (``realtime.flow``)."""
        limit = get_config()["SLOW_CLIENT_SECONDS"]
        while True:
            event = await self.outbox.get()
            if not await self.flow.wait_writable(limit):
                await self._drop_slow_client(limit)
                return
            await self.send(text_data=json.dumps(event))
            self.outbox.task_done()  # close_session waits on the outbox's join()

    async def _drop_slow_client(self, limit):
        """The client has left the server's writes unread for ``limit`` s: close, with an error
        it may still read, instead of holding its replies in memory."""
        log.warning("the client read nothing for %g s; closing", limit)
        if self.live is not None:
            self.live.end_reason = EndReason.CLIENT_TOO_SLOW
        self.close_code = CloseCode.POLICY_VIOLATION
        error = ProtocolError("client_too_slow", f"The client read no server event for {limit:g} s.")
        await self.send(json.dumps(error.to_event()))
        await self.close(code=CloseCode.POLICY_VIOLATION)

    async def receive(self, text_data=None, bytes_data=None):
        if self.live is None:
            return
        try:
            event = read_client_message(text_data, bytes_data, get_config()["MAX_MESSAGE_BYTES"])
        except ProtocolError as error:
            self.live.reject(error)
            return
        await self.live.receive(event)

    async def disconnect(self, code):
        self._end(getattr(self, "close_code", code))

    def _end(self, code):
        """End the session (once) and drop what it left unsent. The consumer, its send task and
        the session refer to each other: breaking that here frees a session's memory (its
        conversation, the replies a slow client never read) now rather than at the next full
        garbage collection."""
        live, self.live = self.live, None
        if live is not None:
            live.end(code)
        if self.sender is not None:
            self.sender.cancel()
            self.sender = None
            while not self.outbox.empty():
                self.outbox.get_nowait()

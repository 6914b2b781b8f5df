"""The WebSocket endpoint of the Realtime protocol: one consumer per client connection.

connect:    accept (subprotocol "realtime" when offered) -> check the origin and the API key
            (``pool.access.auth``) or client secret -> claim a unit, honouring the reservations of
            client secrets (``pool.access.admission``); a refusal or a full pool ->
            ``error`` with its code, close 1008 (after accept, so a real client sees 1008 and
            not an HTTP 403) -> record the session -> ``session.created``.
receive:    parse the frame -> the session's state machine (``realtime.session``).
send loop:  one task sends queued server events in order.
disconnect: record the end, release the unit; it drains in the background (``pool.pipeline.registry``).
            Whatever ends the consumer (a close, an exception, a cancelled task), the unit is
            released and the row ended: ``__call__`` does it in a ``finally``.

Database work runs only at connect, on threads of its own (``pool.access.database``): no message of
any session waits for the database.
"""

import asyncio
import collections
import json
import logging
import time
import weakref
from urllib.parse import parse_qs

from channels.consumer import get_handler_name
from channels.exceptions import StopConsumer
from channels.generic.websocket import AsyncWebsocketConsumer
from django.db import DatabaseError

from pool import metrics
from pool.access import admission, auth, database, keys
from pool.conf import get_config
from pool.history.recordings import SessionRecording
from pool.ids import new_id
from pool.process import get_registry, local_registry
from pool.states import EndReason
from realtime.errors import ProtocolError
from realtime.events import parse_client_frame
from realtime.flow import WriteFlow
from realtime.session import RealtimeSession
from realtime.session_config import session_defaults

log = logging.getLogger(__name__)

SUBPROTOCOL = "realtime"
CLOSE_NORMAL, CLOSE_GOING_AWAY, CLOSE_POLICY_VIOLATION, CLOSE_INTERNAL_ERROR = 1000, 1001, 1008, 1011
CLOSE_TRY_AGAIN_LATER = 1013  # RFC 6455 registry: a temporary server condition
SUBMIT_RETRY_SECONDS = 0.005  # back-pressure poll while the unit's input queue is full
SUBMIT_WAIT_LIMIT = 5.0  # then the event is refused with server_busy
CLAIM_SETTLE_SECONDS = 0.05  # a full pool is asked twice, this far apart, before refusing

LIVE = weakref.WeakSet()  # consumers with a claimed unit, for shutdown
KEY_SESSIONS = collections.Counter()  # API key id -> open sessions in this process
CONNECT_RATE = auth.ConnectRate()  # new sessions per client address, in this process


class RealtimeConsumer(AsyncWebsocketConsumer):
    # Sessions never use the channel layer (operator commands go to the process, pool.control).
    # Without this, channels subscribes every consumer to the layer, and a Redis outage would
    # end every session with 1011.
    channel_layer_alias = None

    unit = None
    secret = None
    session = None
    sender = None
    watchdog = None
    end_reason = EndReason.CLIENT_CLOSE
    api_key_id = None

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        except Exception:
            log.exception("session consumer failed")
            self.end_reason, self.close_code = EndReason.ERROR, CLOSE_INTERNAL_ERROR
            raise
        finally:
            self._end_session(getattr(self, "close_code", CLOSE_INTERNAL_ERROR))

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
        self.loop = asyncio.get_running_loop()
        self.outbox = asyncio.Queue()
        self.ended = asyncio.Event()  # set once the session's end is recorded (close_all waits)
        self.session_id = session_id = new_id("sess")
        self.client_address = auth.client_address(self.scope)
        # The pool is built once per process (runpool builds it before serving); only the very
        # first connect of an embedding site pays for loading the models, off the event loop.
        self.registry = local_registry() or await asyncio.to_thread(get_registry)
        refusal = await self._authorize()
        if refusal is None and not CONNECT_RATE.allow(self.client_address):
            refusal = auth.Refusal("rate_limit_exceeded", "Too many new sessions from this address; "
                                   f"at most {get_config()['CONNECTS_PER_MINUTE']} a minute.")
        if refusal is not None:
            await self._refuse(refusal.code, refusal.message, refusal.close_code)
            return
        if not self.registry.accepting or (self.registry.process_draining and self.secret is None):
            await self._refuse("server_shutting_down", "This server is shutting down; connect again.",
                               CLOSE_GOING_AWAY)
            return
        self.unit = await admission.claim(self.registry, session_id, secret=self.secret)
        if self.unit is None:
            # A client that closes and reconnects at once can get here before the server has
            # handled its close (the close handshake completes below the application): let
            # pending disconnects run, then try again, waiting for a unit that is draining.
            await asyncio.sleep(CLAIM_SETTLE_SECONDS)
            self.unit = await admission.claim(self.registry, session_id, secret=self.secret)
        if self.unit is None and self.registry.draining():
            self.unit = await admission.claim(self.registry, session_id, get_config()["CLAIM_WAIT_SECONDS"],
                                              self.secret)
        if self.unit is None:
            await self._refuse("session_limit_reached",
                               "Every unit of this server's pool is busy; try again later.")
            return
        LIVE.add(self)
        metrics.SESSIONS_STARTED.labels(metrics.PROCESS).inc()
        self.registry.records.session_started(session_id, self.unit.index, self.api_key_id,
                                              self.client_address)
        config = get_config()
        query = parse_qs(self.scope.get("query_string", b"").decode("latin-1"))
        defaults = session_defaults(config, self.registry.speaks, query.get("model", [""])[0] or "s2s-default")
        self.flow = WriteFlow(self.base_send)
        self.sender = asyncio.create_task(self._send_loop())
        recording = SessionRecording(session_id) if self._records_audio(config) else None
        self.ctx = self.unit.begin(self._from_pipeline, recording)
        self.session = RealtimeSession(session_id, self.unit, self.outbox.put_nowait, defaults,
                                       self.registry.records, recording)
        self.session.start(self.secret.session if self.secret is not None else None)
        self.started = self.last_client_event = time.monotonic()
        if config["IDLE_TIMEOUT_SECONDS"] or config["MAX_SESSION_SECONDS"]:
            self.watchdog = asyncio.create_task(
                self._watchdog(config["IDLE_TIMEOUT_SECONDS"], config["MAX_SESSION_SECONDS"]))
        log.info("session %s started on unit %s", session_id, self.unit.index)

    async def _authorize(self):
        """Origin and API key checks; returns a ``pool.access.auth.Refusal`` or None. On success with a
        key, the key's session is counted (``_release_key`` undoes it)."""
        self.api_key_id = self.record_audio = self.secret = None
        if not auth.origin_allowed(self.scope):
            return auth.Refusal("origin_not_allowed", "This origin may not connect to this server.")
        key = auth.key_from_scope(self.scope)
        if key is not None and keys.is_client_secret(key):
            return await self._redeem(key)
        if key is None or not keys.is_server_key(key):
            # No key, or a placeholder that is not one of ours (SDKs insist on some api_key).
            if auth.anonymous_allowed():
                return None
            if key is not None:
                return auth.Refusal("invalid_api_key", "Incorrect API key provided.")
            return auth.Refusal("missing_api_key", "An API key is required: send 'Authorization: Bearer "
                                "<key>' or the subprotocol 'openai-insecure-api-key.<key>'.")
        try:
            api_key, refusal = await database.call(auth.check_key, key, self.registry.records.process_id)
        except DatabaseError as exc:
            return _database_refusal(exc, "API keys")
        if refusal is not None:
            return refusal
        if api_key.max_sessions is not None and api_key.open_elsewhere + KEY_SESSIONS[api_key.pk] >= api_key.max_sessions:
            return auth.Refusal("session_limit_reached",
                                f"This API key may hold {api_key.max_sessions} sessions at once.")
        KEY_SESSIONS[api_key.pk] += 1  # on the event loop, right after the check: no race here
        self.api_key_id, self.record_audio = api_key.pk, api_key.record_audio
        return None

    async def _redeem(self, value):
        """A client secret: its reserved unit, starting session and API key (pool.access.admission)."""
        try:
            self.secret, refusal = await database.call(admission.redeem, value, self.registry.records.process_id)
        except DatabaseError as exc:
            return _database_refusal(exc, "client secrets")
        if refusal is None and self.secret.api_key is not None:
            KEY_SESSIONS[self.secret.api_key_id] += 1  # its limit was applied when it was issued
            self.api_key_id, self.record_audio = self.secret.api_key_id, self.secret.api_key.record_audio
        return refusal

    def _records_audio(self, config):
        """Whether this session's audio is recorded: its API key's choice, else RECORD_AUDIO."""
        return config["RECORD_AUDIO"] if self.record_audio is None else self.record_audio

    def _release_key(self):
        if self.api_key_id is not None:
            KEY_SESSIONS[self.api_key_id] -= 1
            self.api_key_id = None

    async def _refuse(self, code, message, close_code=CLOSE_POLICY_VIOLATION):
        """An accepted socket that gets no session: one ``error`` event, then the close. A
        client secret it redeemed is spent, and the unit it reserved is free again."""
        self._release_key()
        if self.secret is not None:
            try:
                await database.call(admission.release, self.secret)
            except DatabaseError:
                pass  # the reservation then ends when the secret expires
        metrics.SESSIONS_REFUSED.labels(metrics.PROCESS, code).inc()
        error = ProtocolError(code, message)
        await self.send(json.dumps({"type": "error", "event_id": new_id("event"), "error": error.to_error()}))
        await self.close(code=close_code)

    def _from_pipeline(self, event):
        """Called from stage threads: hand the event to the event loop."""
        self.loop.call_soon_threadsafe(self._deliver, event)

    def _deliver(self, event):
        if self.session is not None and not self.ctx.closed:
            self.session.handle_pipeline_event(event)

    async def _send_loop(self):
        """Send queued events in order, no faster than the client reads (``realtime.flow``)."""
        limit = get_config()["SLOW_CLIENT_SECONDS"]
        while True:
            event = await self.outbox.get()
            if not await self.flow.wait_writable(limit):
                await self._drop_slow_client(limit)
                return
            await self.send(text_data=json.dumps(event))
            self.outbox.task_done()  # end() waits on the outbox's join()

    async def _drop_slow_client(self, limit):
        """The client has left the server's writes unread for ``limit`` s: close, with an error
        it may still read, instead of holding its replies in memory."""
        log.warning("session %s: the client read nothing for %g s; closing", self.session.id, limit)
        self.end_reason, self.close_code = EndReason.CLIENT_TOO_SLOW, CLOSE_POLICY_VIOLATION
        error = ProtocolError("client_too_slow", f"The client read no server event for {limit:g} s.")
        await self.send(json.dumps({"type": "error", "event_id": new_id("event"), "error": error.to_error()}))
        await self.close(code=CLOSE_POLICY_VIOLATION)

    async def receive(self, text_data=None, bytes_data=None):
        if self.session is None:
            return
        self.last_client_event = time.monotonic()
        limit = get_config()["MAX_MESSAGE_BYTES"]
        size = len(text_data) if text_data is not None else len(bytes_data or b"")
        if text_data is not None and limit < size * 4:  # UTF-8 may take up to 4 bytes a character
            size = len(text_data.encode())
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

    async def _watchdog(self, idle_timeout, max_seconds):
        """End the session when the client has been silent ``idle_timeout`` s or the session has
        lasted ``max_seconds`` (either None: no such limit), with an ``error`` and close 1000."""
        while True:
            now = time.monotonic()
            if max_seconds and now - self.started >= max_seconds:
                self.session.send_error(ProtocolError(
                    "session_expired", f"Your session hit the maximum duration of {max_seconds:g} seconds."))
                await self.end(EndReason.SESSION_EXPIRED, CLOSE_NORMAL)
                return
            if idle_timeout and now - self.last_client_event >= idle_timeout:
                self.session.send_error(ProtocolError(
                    "idle_timeout", f"No client event for {idle_timeout:g} s; closing the session."))
                await self.end(EndReason.IDLE_TIMEOUT, CLOSE_NORMAL)
                return
            deadlines = [self.started + max_seconds if max_seconds else None,
                         self.last_client_event + idle_timeout if idle_timeout else None]
            await asyncio.sleep(min(d for d in deadlines if d is not None) - now)

    async def end(self, reason, code):
        """Server-side end of the session: flush queued events, then close with ``code``."""
        if self.session is None:
            return
        self.end_reason, self.close_code = reason, code
        # Until the send loop has sent what is queued, or has stopped (the client left, or read
        # nothing for SLOW_CLIENT_SECONDS): a slow client cannot hold a shutdown.
        flushed = asyncio.ensure_future(self.outbox.join())
        await asyncio.wait((flushed, self.sender), return_when=asyncio.FIRST_COMPLETED)
        flushed.cancel()
        await self.close(code=code)

    async def disconnect(self, code):
        self._end_session(getattr(self, "close_code", code))

    def _end_session(self, code):
        """Record the end and release the unit (and the key's count); once, whatever ends the
        consumer. Nothing here may fail on what the client sent."""
        self._release_key()
        if self.unit is None:
            return
        LIVE.discard(self)
        unit, self.unit = self.unit, None
        session, self.session = self.session, None
        stats = {}
        if session is not None:
            session.close()
            stats = session.stats
        for task in (self.sender, self.watchdog):
            if task:
                task.cancel()
        # The consumer, its tasks and the session refer to each other: break that here, and drop
        # the unsent events, so a session's memory (its conversation, its replies a slow client
        # never read) is freed now rather than at the next full garbage collection.
        self.sender = self.watchdog = None
        while not self.outbox.empty():
            self.outbox.get_nowait()
        self.registry.records.session_ended(self.session_id, self.end_reason, code, stats)
        self.registry.release(unit)
        metrics.SESSIONS_ENDED.labels(metrics.PROCESS, self.end_reason).inc()
        log.info("session %s ended (%s, close code %s) on unit %s: %s", self.session_id, self.end_reason,
                 code, unit.index, {k: v for k, v in stats.items() if v})
        self.ended.set()


async def close_all(reason=EndReason.SHUTDOWN, code=CLOSE_GOING_AWAY):
    """Close every live session of this process (shutdown) and wait until each has ended (the
    server has heard the close, released the unit and recorded the end); returns how many."""
    consumers = list(LIVE)
    await asyncio.gather(*(c.end(reason, code) for c in consumers), return_exceptions=True)
    await asyncio.gather(*(c.ended.wait() for c in consumers))
    return len(consumers)


def _database_refusal(exc, what):
    """The refusal of a connect whose ``what`` (API keys, client secrets) could not be checked:
    the database is busy (a lock held elsewhere) or down. Both are temporary: close 1013."""
    if isinstance(exc, database.DatabaseBusyError):
        log.warning("%s could not be checked in time: the database is busy (%s)", what, exc)
        return auth.Refusal("server_busy", f"The server cannot check {what} right now (the database is "
                            "busy); try again shortly.", CLOSE_TRY_AGAIN_LATER)
    log.warning("%s could not be checked: the database is unavailable (%s)", what, str(exc).strip())
    return auth.Refusal("database_unavailable", f"The server cannot check {what} right now; try again "
                        "shortly.", CLOSE_TRY_AGAIN_LATER)

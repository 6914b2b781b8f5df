"""A live session on this process, whatever transport carries it: start, watch, end.

A transport (``realtime.consumers`` for WebSocket, ``realtime.webrtc`` for WebRTC) is a thin
adapter:

1. it reads who is connecting (``pool.access.connect.Credentials``) and calls ``open_session``,
   which admits the client (``pool.access.connect.admit``) and starts a ``LiveSession``, or returns
   the ``Refusal`` it sends as ``refusal_event`` before it closes;
2. it feeds parsed client events to ``LiveSession.receive`` and sends, in order, every server event
   handed to its ``send_event``;
3. when its connection ends, whatever ended it, it calls ``LiveSession.end`` once.

Everything else is here, once: the session row (``pool.history``), the audio recording, the
watchdog (idle and maximum duration), back-pressure on the unit's input, the release of the unit
and of the key's count, and the set of live sessions a shutdown closes (``close_all``).
"""

import asyncio
import contextlib
import logging
import time
import weakref
from typing import Protocol

from pool import metrics
from pool.access.connect import Refusal, admit
from pool.conf import get_config
from pool.history.recordings import SessionRecording
from pool.ids import new_id
from pool.pipeline.playback import Playback
from pool.states import CloseCode, EndReason
from realtime.errors import ProtocolError
from realtime.session.session import RealtimeSession
from realtime.session_config import session_defaults

log = logging.getLogger(__name__)

SUBMIT_WAIT_LIMIT = 5.0  # seconds a client event waits for room in the unit's input, then server_busy

LIVE = weakref.WeakSet()  # this process's live sessions, for shutdown


class Transport(Protocol):
    """What a live session needs of the connection that carries it: its ``name`` (the session
    row's transport) and ``media_format`` (``RealtimeSession``'s: the audio format of a transport
    that carries audio itself, or None)."""

    name: str
    media_format: dict | None

    def send_event(self, event: dict) -> None:
        """Queue one server event; events go out in the order queued."""

    async def close_session(self, code: int) -> None:
        """Send what is queued (unless the client stopped reading), then close with ``code``
        (a WebSocket close code; another transport maps it). ``LiveSession.end`` follows."""


def refusal_event(refusal):
    """The ``error`` event a refused client gets before its close (``refusal.close_code``)."""
    return ProtocolError(refusal.code, refusal.message).to_event()


async def open_session(registry, credentials, transport, model="", initial=None):
    """Admit a client to ``registry``'s pool and start its session. Returns the started
    ``LiveSession`` (``session.created`` is queued on ``transport``) or the ``Refusal``.
    ``model``: the model the client asked for in its URL ("" for the default); ``initial``: a
    ``session.update`` body it starts with, after its client secret's (WebRTC's ``session``
    form field)."""
    session_id = new_id("sess")
    grant = await admit(registry, credentials, session_id)
    if isinstance(grant, Refusal):
        return grant
    live = LiveSession(registry, grant, transport, credentials.address, model or "s2s-default")
    try:
        live.start(initial)
    except BaseException:
        live.end_reason = EndReason.ERROR
        live.end(CloseCode.INTERNAL_ERROR)  # the unit goes back, the row (if written) ends
        raise
    return live


class LiveSession:
    """One admitted client's session on its claimed unit, from ``start`` to ``end``.

    ``session`` is its protocol state machine (``RealtimeSession``; None once ended);
    ``end_reason`` is what the session row will say ended it (a transport sets it when it ends
    the session for its own reason, e.g. a client that reads nothing); ``ended`` is set once the
    end is recorded and the unit released.
    """

    def __init__(self, registry, grant, transport, client_address, model):
        self.registry, self.grant, self.transport = registry, grant, transport
        self.id = grant.session_id
        self.unit = grant.unit
        self.client_address = client_address
        self.model = model
        self.end_reason = EndReason.CLIENT_CLOSE
        self.ended = asyncio.Event()
        self.session = None
        self._watchdog = None
        self._loop = asyncio.get_running_loop()

    def start(self, initial=None):
        """Record the session, connect it to its unit and queue ``session.created`` (of the
        client secret's session, then ``initial``)."""
        config = get_config()
        LIVE.add(self)
        metrics.SESSIONS_STARTED.labels(metrics.PROCESS).inc()
        records = self.registry.records
        records.session_started(self.id, self.unit.index, self.grant.api_key_id, self.client_address,
                                self.transport.name)
        recording = SessionRecording(self.id) if self.grant.records_audio() else None
        # A client whose microphone may hear its own speakers (ECHO_CANCELLATION_TRANSPORTS:
        # WebSocket clients; a browser's WebRTC cancels its own echo): the VAD stage cancels the
        # echo of what it plays, so the server keeps that audio.
        playback = Playback(keeps_audio=self.registry.backends.echo is not None
                            and self.transport.name in config["ECHO_CANCELLATION_TRANSPORTS"])
        self._ctx = self.unit.begin(self._from_pipeline, recording, playback)
        defaults = session_defaults(config, self.registry.speaks, self.model)
        self.session = RealtimeSession(self.id, self.unit, self.transport.send_event, defaults, records, recording,
                                       self.transport.media_format, playback)
        secret = self.grant.secret
        self.session.start(secret.session if secret is not None else None, initial)
        self.started = self.last_client_event = time.monotonic()
        if config["IDLE_TIMEOUT_SECONDS"] or config["MAX_SESSION_SECONDS"]:
            self._watchdog = asyncio.create_task(
                self._watch(config["IDLE_TIMEOUT_SECONDS"], config["MAX_SESSION_SECONDS"]))
        log.info("session %s started on unit %s", self.id, self.unit.index)

    def reject(self, error):
        """A client frame the transport could not take (too large, not an event): its ``error``
        event (a ProtocolError); the session goes on."""
        self.last_client_event = time.monotonic()
        if self.session is not None:
            self.session.send_error(error)

    async def receive(self, event):
        """One parsed client event. While the unit's input queue is full, the event waits (and
        the transport reads no further) rather than be dropped - but not for ever, or a wedged
        unit would also block the disconnect: after SUBMIT_WAIT_LIMIT s the session refuses it
        with ``server_busy``."""
        self.last_client_event = time.monotonic()
        if self.session is None:
            return
        await self._input_room()
        if self.session is not None:
            self.session.handle_client_event(event)

    async def _input_room(self):
        """Until the unit's input queue has room, or SUBMIT_WAIT_LIMIT s have passed."""
        room = self._loop.create_future()

        def wake():  # on the VAD thread
            self._loop.call_soon_threadsafe(lambda: room.done() or room.set_result(None))

        if self.unit.when_input_room(wake):
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(room, SUBMIT_WAIT_LIMIT)

    async def stop(self, reason, code):
        """End the session from the server's side (``reason``: an ``EndReason``): the transport
        sends what is queued and closes with ``code``."""
        if self.session is None:
            return
        self.end_reason = reason
        await self.transport.close_session(code)

    def end(self, code):
        """Record the end and release the unit (and the key's count); once, whatever ended the
        connection (``code``: its close code). Nothing here may fail on what the client sent."""
        self.grant.release_key()
        if self.unit is None:
            return
        LIVE.discard(self)
        unit, self.unit = self.unit, None
        session, self.session = self.session, None
        stats = {}
        if session is not None:
            session.close()
            stats = session.stats
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        self.registry.records.session_ended(self.id, self.end_reason, code, stats)
        self.registry.release(unit)
        metrics.SESSIONS_ENDED.labels(metrics.PROCESS, self.end_reason).inc()
        log.info("session %s ended (%s, close code %s) on unit %s: %s", self.id, self.end_reason,
                 code, unit.index, {k: v for k, v in stats.items() if v})
        self.ended.set()

    def _from_pipeline(self, event):
        """Called from stage threads: hand the event to the event loop."""
        self._loop.call_soon_threadsafe(self._deliver, event)

    def _deliver(self, event):
        if self.session is not None and not self._ctx.closed:
            self.session.handle_pipeline_event(event)

    async def _watch(self, idle_timeout, max_seconds):
        """End the session when the client has been silent ``idle_timeout`` s or the session has
        lasted ``max_seconds`` (either None: no such limit), with an ``error`` and close 1000."""
        while True:
            now = time.monotonic()
            if max_seconds and now - self.started >= max_seconds:
                self.session.send_error(ProtocolError(
                    "session_expired", f"Your session hit the maximum duration of {max_seconds:g} seconds."))
                await self.stop(EndReason.SESSION_EXPIRED, CloseCode.NORMAL)
                return
            if idle_timeout and now - self.last_client_event >= idle_timeout:
                self.session.send_error(ProtocolError(
                    "idle_timeout", f"No client event for {idle_timeout:g} s; closing the session."))
                await self.stop(EndReason.IDLE_TIMEOUT, CloseCode.NORMAL)
                return
            deadlines = [self.started + max_seconds if max_seconds else None,
                         self.last_client_event + idle_timeout if idle_timeout else None]
            await asyncio.sleep(min(d for d in deadlines if d is not None) - now)


async def close_all(reason=EndReason.SHUTDOWN, code=CloseCode.GOING_AWAY):
    """Close every live session of this process (shutdown) and wait until each has ended (the
    transport has closed, the unit is released and the end recorded); returns how many."""
    sessions = list(LIVE)
    await asyncio.gather(*(s.stop(reason, code) for s in sessions), return_exceptions=True)
    await asyncio.gather(*(s.ended.wait() for s in sessions))
    return len(sessions)

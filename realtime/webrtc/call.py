"""One WebRTC call: the ``Transport`` of its ``LiveSession`` (``realtime.session.lifecycle``).

The peer connection (aiortc) carries three things. The data channel ``oai-events`` carries the
client and server events as JSON text, exactly as the WebSocket does, except the reply's audio
deltas: those go to the reply track (``media.ReplyTrack``), and the client hears them as Opus.
The client's microphone track becomes ``input_audio_buffer.append`` events of PCM16 at 24 kHz,
in order with the data channel's events. And the WebRTC-only events are the call's own: the
reply track says ``output_audio_buffer.started`` / ``.stopped``; the client's
``output_audio_buffer.clear`` drops the queued audio, cuts the playing item where playback
stopped (a ``conversation.item.truncate`` of the played length) and answers ``.cleared``. A
reply cancelled while it plays, and one the user talks over (``speech_started`` with
``interrupt_response``, even when its response is done: the TTS runs ahead of playback), is
cleared from the track the same way: over WebRTC the server holds the playback buffer.

A hangup (the data channel or the peer connection closed, ICE failed: a peer that vanished is
found by ICE's consent checks, about 30 s) ends the session like a WebSocket close.
"""

import asyncio
import base64
import json
import logging

from pool.conf import get_config
from pool.ids import new_id
from pool.states import CloseCode, EndReason
from realtime.errors import ProtocolError
from realtime.events import read_client_message
from realtime.webrtc.media import RATE, ReplyTrack, track_pcm16

log = logging.getLogger(__name__)

EVENTS_CHANNEL = "oai-events"  # the data channel's label, OpenAI's

CALLS = {}  # call id -> WebRTCCall: this process's calls, for their hangup endpoint
# Microphone frames (20 ms) waiting for the session: past 10 s of them the unit is not keeping
# up (it is wedged, and will be quarantined), and newer frames are dropped rather than held.
MAX_QUEUED_FRAMES = 500


class WebRTCCall:
    """The transport of one call: ``pc`` its ``RTCPeerConnection``, ``call_id`` the id in the
    ``Location`` of its ``POST /v1/realtime/calls``. ``attach(live)`` once the session is open."""

    name = "webrtc"
    media_format = {"type": "audio/pcm", "rate": RATE}

    def __init__(self, call_id, pc):
        self.id, self.pc = call_id, pc
        self.live = None
        self.key = None  # the credentials that opened the call (its hangup needs the same)
        self.channel = None
        self._early = []  # server events before the data channel opened
        self._inbox = asyncio.Queue()  # client events and appends, in order, for the session
        self._tasks = set()
        self.dropped_frames = 0
        self.reply = ReplyTrack(self._playback)
        pc.addTrack(self.reply)
        pc.on("datachannel", self._on_datachannel)
        pc.on("track", self._on_track)
        pc.on("connectionstatechange", self._on_connection_state)
        self.ended = asyncio.Event()

    def attach(self, live):
        """Start carrying ``live``'s events (a ``LiveSession`` whose transport this is)."""
        self.live = live
        CALLS[self.id] = self
        self._spawn(self._deliver())

    def _spawn(self, coroutine):
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # --- the Transport of realtime.session.lifecycle ------------------------------------------

    def send_event(self, event):
        kind = event["type"]
        if kind == "response.output_audio.delta":
            self.reply.push(base64.b64decode(event["delta"]), event["response_id"], event["item_id"])
            return
        self._send(event)
        if kind == "response.done":
            response = event["response"]
            if response["status"] != "cancelled":
                self.reply.finish(response["id"])
            elif self.reply.playing == response["id"]:
                # Cancelled by the server (barge-in) or the client while it plays: cleared, not
                # stopped, even when the track has caught up with the TTS (a stall on a slow CPU)
                # and holds none of it: the reply did not play to its end.
                asyncio.get_running_loop().call_soon(self._clear_output, None)
            else:  # queued behind another reply: none of it was heard
                for item_id in self.reply.drop(response["id"]):
                    asyncio.get_running_loop().call_soon(self._truncate, item_id, 0, None)
        elif kind == "input_audio_buffer.speech_started" and self.reply.playing is not None and self._interrupts():
            # The user talks over a reply still playing (its response may be done: the TTS runs
            # ahead of playback). A WebSocket client stops its own playback here; this one is ours.
            asyncio.get_running_loop().call_soon(self._clear_output, None)

    async def close_session(self, code):
        """Close the call (the events sent so far are on the data channel's way)."""
        await self.hangup(code)

    # --- the call --------------------------------------------------------------------------------

    def _send(self, event):
        if self.channel is not None and self.channel.readyState == "open":
            self.channel.send(json.dumps(event))
        elif self.channel is None:
            self._early.append(event)

    def _on_datachannel(self, channel):
        if channel.label != EVENTS_CHANNEL:
            log.info("call %s: data channel %r ignored", self.id, channel.label)
            return
        self.channel = channel
        channel.on("message", self._on_message)
        channel.on("close", lambda: self._spawn(self.hangup(CloseCode.NORMAL)))
        early, self._early = self._early, []
        for event in early:
            channel.send(json.dumps(event))

    def _on_message(self, message):
        if self.live is None:
            return
        text, data = (message, None) if isinstance(message, str) else (None, message)
        try:
            event = read_client_message(text, data, get_config()["MAX_MESSAGE_BYTES"])
        except ProtocolError as error:
            self.live.reject(error)
            return
        self._inbox.put_nowait(event)

    def _on_track(self, track):
        if track.kind == "audio":
            self._spawn(track_pcm16(track, self._append))

    def _append(self, pcm16):
        if self._inbox.qsize() >= MAX_QUEUED_FRAMES:
            self.dropped_frames += 1
            if self.dropped_frames == 1:
                log.warning("call %s: the unit is not keeping up; microphone audio is dropped", self.id)
            return
        self._inbox.put_nowait({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm16).decode()})

    async def _deliver(self):
        """Hand the inbox to the session in order (an event may wait for room on the unit)."""
        while self.live is not None:
            event = await self._inbox.get()
            if event["type"] == "output_audio_buffer.clear":
                self._clear_output(event.get("event_id"))
            elif self.live is not None:
                await self.live.receive(event)

    def _clear_output(self, event_id):
        """Drop the reply audio queued on the track; cut the playing item at what was played;
        ``output_audio_buffer.cleared``."""
        if self.live is None:
            return
        cleared = self.reply.clear()
        if cleared is None:
            return
        response_id, item_id, played_ms = cleared
        self._truncate(item_id, played_ms, event_id)
        self._send({"type": "output_audio_buffer.cleared", "event_id": _event_id(), "response_id": response_id})

    def _truncate(self, item_id, played_ms, event_id):
        """Cut ``item_id`` where its playback stopped, as the client's truncate would."""
        session = self.live.session if self.live is not None else None
        if item_id is not None and session is not None and item_id in session.items:
            session.handle_client_event({"type": "conversation.item.truncate", "item_id": item_id,
                                         "content_index": 0, "audio_end_ms": int(played_ms),
                                         **({"event_id": event_id} if event_id else {})})

    def _interrupts(self):
        """Whether the session's turn detection lets user speech interrupt the assistant."""
        session = self.live.session if self.live is not None else None
        turn_detection = session.config["audio"]["input"]["turn_detection"] if session is not None else None
        return bool(turn_detection and turn_detection.get("interrupt_response", True))

    def _playback(self, kind, response_id):
        self._send({"type": f"output_audio_buffer.{kind}", "event_id": _event_id(), "response_id": response_id})

    def _on_connection_state(self):
        if self.pc.connectionState in ("failed", "closed"):
            self._spawn(self.hangup(CloseCode.GOING_AWAY if self.pc.connectionState == "failed" else CloseCode.NORMAL))

    async def hangup(self, code=CloseCode.NORMAL, reason=None):
        """End the call (once): the session ends, its unit is released, the peer connection
        closes."""
        live, self.live = self.live, None
        CALLS.pop(self.id, None)
        if live is not None:
            if reason is not None:
                live.end_reason = reason
            elif self.pc.connectionState == "failed":
                live.end_reason = EndReason.CONNECTION_LOST
            live.end(code)
        self.reply.stop()
        await self.pc.close()
        for task in list(self._tasks):
            if task is not asyncio.current_task():
                task.cancel()
        self.ended.set()


def _event_id():
    return new_id("event")

"""A WebRTC client for the tests and benchmarks, on aiortc: it offers a microphone track that
plays what it is given (in real time, silence otherwise) and the ``oai-events`` data channel,
posts the offer, and records the server's events and the audio it hears.

Its traffic stays on loopback: it offers 127.0.0.1 only (``realtime.webrtc.network``, the same
switch the server uses) and drops every candidate of the server's answer outside 127.0.0.0/8.
"""

import asyncio
import ipaddress
import json
import time

import numpy as np
from aiortc import RTCPeerConnection, RTCSessionDescription

from realtime.webrtc import network
from realtime.webrtc.media import RATE, ReplyTrack, track_pcm16


def loopback_only(sdp):
    """``sdp`` without the ``a=candidate`` lines of addresses outside the loopback range."""
    def keep(line):
        if not line.startswith("a=candidate:"):
            return True
        try:
            return ipaddress.ip_address(line.split()[4]).is_loopback
        except (IndexError, ValueError):
            return False

    return "\r\n".join(line for line in sdp.split("\r\n") if keep(line))


class Microphone(ReplyTrack):
    """An audio track playing the float32 24 kHz samples given to ``play``, then silence: the
    server's reply track (the same pacing and framing), with one endless "reply"."""

    def __init__(self):
        super().__init__(lambda kind, response_id: None)

    def play(self, samples):
        self.push((np.clip(samples, -1, 1) * 32767).astype(np.int16).tobytes(), "microphone", "microphone")

    @property
    def has_audio(self):
        """Whether some of what it was given is still to be sent."""
        return bool(self._queue)


class WebRTCClient:
    """One call. ``await call(post)`` with ``post(sdp) -> (status, headers, body)``; then
    ``events`` (every server event, in order), ``until(type)``, ``send(event)``, ``heard``
    ((arrival time, int16 samples at 24 kHz) of the server's audio) and ``hangup()``."""

    def __init__(self):
        network.use_host_addresses(["127.0.0.1"])
        self.pc = RTCPeerConnection()
        self.channel = self.pc.createDataChannel("oai-events")
        self.microphone = Microphone()
        self.pc.addTrack(self.microphone)
        self.events, self.arrived, self.heard = [], [], []  # arrived: each event's monotonic time
        self._queue = asyncio.Queue()
        self._opened = asyncio.Event()
        self._tasks = []
        self.channel.on("open", self._opened.set)
        self.channel.on("message", self._on_message)
        self.pc.on("track", lambda track: self._tasks.append(asyncio.ensure_future(self._listen(track))))

    async def call(self, post):
        """Offer, post, answer. Returns ``(status, headers, body)`` of the post; on 201 waits for
        the data channel."""
        await self.pc.setLocalDescription(await self.pc.createOffer())
        status, headers, body = await post(self.pc.localDescription.sdp)
        if status == 201:
            await self.pc.setRemoteDescription(RTCSessionDescription(loopback_only(body), "answer"))
            await asyncio.wait_for(self._opened.wait(), 10)
        return status, headers, body

    def _on_message(self, message):
        event = json.loads(message)
        self.events.append(event)
        self.arrived.append(time.monotonic())
        self._queue.put_nowait(event)

    async def _listen(self, track):
        await track_pcm16(track, lambda pcm: self.heard.append((time.monotonic(), np.frombuffer(pcm, np.int16))))

    async def until(self, event_type, timeout=20):
        while True:
            event = await asyncio.wait_for(self._queue.get(), timeout)
            if event["type"] == event_type:
                return event

    def send(self, event):
        self.channel.send(json.dumps(event))

    def heard_audio(self, since=0.0, until=float("inf")):
        """Seconds of audible sound (frames above -40 dBFS) heard between ``since`` and ``until``
        (monotonic)."""
        loud = [len(s) for t, s in self.heard
                if since <= t < until and np.sqrt(np.mean((s / 32768.0) ** 2)) > 0.01]
        return sum(loud) / RATE

    def types(self):
        return [e["type"] for e in self.events]

    async def hangup(self):
        for task in self._tasks:
            task.cancel()
        await self.pc.close()

"""A WebRTC call's audio: the microphone track to PCM16 for the session, and the reply track.

aiortc decodes the client's Opus (48 kHz) into ``av.AudioFrame``s; ``track_pcm16`` resamples
them (PyAV's ``AudioResampler``) to PCM16 mono at 24 kHz, the session's input over WebRTC.
``ReplyTrack`` is what the client hears: the reply's PCM16 at 24 kHz in 20 ms frames, paced in
real time (aiortc's encoder resamples it to Opus' 48 kHz), silence when nothing plays. It knows
what has been played of each item, which the protocol's ``output_audio_buffer.*`` events and
truncation use: over WebRTC the server, not the client, holds the playback buffer.
"""

import asyncio
import fractions
import time
from collections import deque

import av
import numpy as np
from aiortc import MediaStreamTrack
from aiortc.mediastreams import MediaStreamError

RATE = 24000  # Hz: the session's PCM16 and the reply track's frames
FRAME_MS = 20  # aiortc's audio packetisation time (AUDIO_PTIME) and Opus' usual frame
FRAME_SAMPLES = RATE * FRAME_MS // 1000


async def track_pcm16(track, deliver):
    """Read ``track`` (a remote audio track: the client's microphone) until it ends;
    ``deliver(pcm16_bytes)`` each frame as PCM16 mono at 24 kHz (20 ms, 960 bytes, for Opus'
    usual 20 ms frames)."""
    resampler = av.AudioResampler(format="s16", layout="mono", rate=RATE)
    while True:
        try:
            frame = await track.recv()
        except MediaStreamError:
            return
        for out in resampler.resample(frame):
            deliver(out.to_ndarray().tobytes())


class ReplyTrack(MediaStreamTrack):
    """The assistant's audio to the client. ``push`` queues a reply's PCM16; ``recv`` (called by
    aiortc's sender) returns the next 20 ms frame at the real-time pace.

    ``on_playback(kind, response_id)`` is called on the event loop when a response's audio starts
    playing ("started") and when it has all played ("stopped", after ``finish``). ``played_ms``:
    item id -> milliseconds of it played so far.
    """

    kind = "audio"

    def __init__(self, on_playback):
        super().__init__()
        self._on_playback = on_playback
        self._queue = deque()  # [samples (int16 array), response_id, item_id]
        self._finished = set()  # responses whose audio is all queued
        self.playing = None  # the response whose audio is playing
        self._item = None  # the item of it played last (the queue may be empty between phrases)
        self.played_ms = {}
        self._start = None
        self._timestamp = 0

    def push(self, pcm16, response_id, item_id):
        """Queue ``pcm16`` (bytes, 24 kHz mono) of ``item_id`` of ``response_id``."""
        self._queue.append([np.frombuffer(pcm16, dtype=np.int16), response_id, item_id])

    def finish(self, response_id):
        """All of ``response_id``'s audio is queued: "stopped" follows once it has played."""
        self._finished.add(response_id)
        if self.playing == response_id and not self._queue:
            self._stopped()

    def drop(self, response_id):
        """Drop the queued audio of ``response_id``, which has not started playing (a reply
        cancelled while another still played). Returns the ids of its items that had audio
        queued."""
        items = [item_id for _, rid, item_id in self._queue if rid == response_id]
        self._queue = deque(entry for entry in self._queue if entry[1] != response_id)
        self._finished.discard(response_id)
        return list(dict.fromkeys(items))

    def clear(self):
        """Drop the queued audio now. Returns ``(response_id, item_id, played_ms)`` of the reply
        playing (its queue may be empty while the TTS catches up), or None when none was."""
        self._queue.clear()
        response_id, self.playing = self.playing, None
        if response_id is None:
            return None
        self._finished.discard(response_id)
        return response_id, self._item, self.played_ms.get(self._item, 0)

    async def recv(self):
        if self.readyState != "live":
            raise MediaStreamError
        if self._start is None:
            self._start = time.time()
        else:
            self._timestamp += FRAME_SAMPLES
            wait = self._start + self._timestamp / RATE - time.time()
            if wait > 0:
                await asyncio.sleep(wait)
        frame = av.AudioFrame.from_ndarray(self._next_samples().reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = RATE
        frame.pts = self._timestamp
        frame.time_base = fractions.Fraction(1, RATE)
        return frame

    def _next_samples(self):
        """The next FRAME_SAMPLES of the queue (of one item at most), padded with silence."""
        out = np.zeros(FRAME_SAMPLES, dtype=np.int16)
        if not self._queue:
            return out
        entry = self._queue[0]
        samples, response_id, item_id = entry
        if self.playing != response_id:
            if self.playing is not None:  # the previous reply played to its end, the next follows at once
                self._stopped()
            self.playing = response_id
            self._on_playback("started", response_id)
        self._item = item_id
        taken = samples[:FRAME_SAMPLES]
        out[:len(taken)] = taken
        entry[0] = samples[len(taken):]
        self.played_ms[item_id] = self.played_ms.get(item_id, 0) + len(taken) * 1000 / RATE
        if not len(entry[0]):
            self._queue.popleft()
        if not self._queue and response_id in self._finished:
            self._stopped()
        return out

    def _stopped(self):
        response_id, self.playing = self.playing, None
        self._finished.discard(response_id)
        self._on_playback("stopped", response_id)

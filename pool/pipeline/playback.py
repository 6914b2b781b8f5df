"""What a client is playing of the assistant's replies, on the server's clock.

A client plays a reply's audio in real time from the moment its first delta arrives, one delta
after another, and stops when the reply is cancelled or truncated. ``Playback`` follows that
from what the server sent: turn-taking asks whether the assistant is still audible
(``realtime.session.turns``), and, for a session whose microphone may hear its own speakers, the
VAD stage asks what was playing at the moment each microphone sample was captured, the
reference of its echo canceller (``pool.backends.echo``).
"""

import collections
import threading
import time

import numpy as np
import soxr

from pool.backends.base import SPEECH_RATE

KEEP_SECONDS = 3.0  # reference audio kept after it played: the longest echo path plus its tail
# Reference audio kept ahead of what plays: a client given replies faster than it plays them
# (back-to-back text turns) would otherwise make the server keep every second it sent
# (64 KB a second at 16 kHz). Audio due later than this is not cancelled as echo.
AHEAD_SECONDS = 60.0


class Playback:
    """One session's playback model. ``sent(seconds, samples)`` and ``stopped()`` are called on
    the event loop as the session sends audio and stops it; ``end`` and ``reference`` may be read
    on any thread.

    ``keeps_audio``: whether the samples are kept (for ``reference``); otherwise only times.
    """

    def __init__(self, keeps_audio=False, clock=time.monotonic):
        self.keeps_audio = keeps_audio
        self._clock = clock
        self._lock = threading.Lock()
        self._end = 0.0
        self._chunks = collections.deque()  # (start, float32 @ 16 kHz), in playing order

    @property
    def end(self):
        """When the client will have played all the audio sent so far, on ``clock``
        (``time.monotonic()`` seconds by default); 0.0 before any was sent."""
        return self._end

    def held(self):
        """Seconds of audio sent that the client has not played yet (0.0: it plays nothing)."""
        return max(0.0, self._end - self._clock())

    def playing(self, now=None):
        """Whether the client is still playing audio sent."""
        return (self._clock() if now is None else now) < self._end

    def sent(self, seconds, samples=None):
        """The client got ``seconds`` more of a reply (``samples``: the same, float32 at 24 kHz,
        kept for ``reference`` when ``keeps_audio``); it plays them after what it holds."""
        now = self._clock()
        with self._lock:
            start = max(self._end, now)
            self._end = start + seconds
            if self.keeps_audio and samples is not None and len(samples) and start - now < AHEAD_SECONDS:
                self._chunks.append((start, soxr.resample(samples, 24_000, SPEECH_RATE).astype(np.float32)))
                while self._chunks and self._chunks[0][0] + len(self._chunks[0][1]) / SPEECH_RATE < now - KEEP_SECONDS:
                    self._chunks.popleft()

    def stopped(self):
        """The client stopped playing (a cancelled or truncated reply): nothing more plays."""
        now = self._clock()
        with self._lock:
            self._end = min(self._end, now)
            kept = collections.deque()
            for start, samples in self._chunks:
                if start < now:
                    kept.append((start, samples[: max(0, int((now - start) * SPEECH_RATE))]))
            self._chunks = kept

    def reference(self, start, samples):
        """What was playing from ``start`` (monotonic seconds) for ``samples`` samples at 16 kHz:
        float32, zeros where nothing played."""
        out = np.zeros(samples, np.float32)
        with self._lock:
            chunks = list(self._chunks)
        for chunk_start, audio in chunks:
            offset = int(round((chunk_start - start) * SPEECH_RATE))
            if offset >= samples or offset + len(audio) <= 0:
                continue
            lo, hi = max(0, offset), min(samples, offset + len(audio))
            out[lo:hi] = audio[lo - offset:hi - offset]
        return out

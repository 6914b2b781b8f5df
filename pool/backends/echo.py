"""Acoustic echo cancellation before the VAD and the STT: WebRTC's echo canceller (AEC3), run
with the audio the server sent as its reference.

A client on laptop speakers without echo cancellation (a WebSocket client, a phone bridge) sends
the assistant's own voice back as microphone audio; heard as speech over the assistant, it
interrupted the reply (huggingface/speech-to-speech #134 and #483). The server knows what it sent
and when the client plays it (``pool.pipeline.playback``), so it can cancel the echo itself, as a
browser's WebRTC stack does on the client. The canceller is WebRTC's audio processing module as
the ``livekit`` wheel ships it (``livekit.rtc.AudioProcessingModule``, Apache-2.0): AEC3 estimates
the echo path's delay (what the client buffers, the room, the microphone's upload) and adapts
its filter to the room; what remains of the echo it suppresses, while speech on top passes.
Measured here (BENCHMARKS.md, section 14): Kokoro's reply fed back 100-250 ms late, 10-25 dB
quieter through a room, came out 18-55 dB quieter, and Whisper heard nothing in it.
"""

import numpy as np

from pool.backends.base import SPEECH_RATE

FRAME = SPEECH_RATE // 100  # AEC3 takes 10 ms frames


class EchoCanceller:
    """The echo canceller of the pool, one per process; each unit's VAD thread owns a stream.
    Raises ImportError when the ``livekit`` wheel is missing."""

    def __init__(self):
        from livekit import rtc

        self._rtc = rtc

    def new_stream(self):
        return EchoStream(self._rtc)


class EchoStream:
    """One unit's canceller state. ``process(captured, reference)`` takes the microphone's float32
    samples at 16 kHz and what was playing at the same moments (the same length), and returns
    ``(the microphone with the echo removed, the microphone)``, in whole 10 ms frames: a last
    part-frame waits for the next call (up to 10 ms). ``bypass(captured)`` passes audio through while nothing plays.
    ``reset()`` forgets the session: the room and the delay it learnt."""

    def __init__(self, rtc):
        self._rtc = rtc
        self.reset()

    def reset(self):
        self._apm = self._rtc.AudioProcessingModule(echo_cancellation=True, high_pass_filter=True)
        self._captured = np.zeros(0, np.float32)
        self._reference = np.zeros(0, np.float32)

    def _frame(self, samples):
        pcm = np.clip(samples * 32768.0, -32768, 32767).astype(np.int16)
        return self._rtc.AudioFrame(pcm.tobytes(), SPEECH_RATE, 1, FRAME)

    def bypass(self, captured):
        """``captured`` as it is, after what ``process`` held back: for while nothing plays (the
        canceller keeps what it learnt of the room)."""
        out, self._captured = np.concatenate([self._captured, captured]), np.zeros(0, np.float32)
        self._reference = np.zeros(0, np.float32)
        return out

    def process(self, captured, reference):
        captured = np.concatenate([self._captured, captured])
        reference = np.concatenate([self._reference, reference])
        whole = len(captured) - len(captured) % FRAME
        out = np.zeros(whole, np.float32)
        for start in range(0, whole, FRAME):
            self._apm.process_reverse_stream(self._frame(reference[start:start + FRAME]))
            frame = self._frame(captured[start:start + FRAME])
            self._apm.process_stream(frame)  # in place
            out[start:start + FRAME] = np.frombuffer(frame.data, np.int16) / 32768.0
        self._captured, self._reference = captured[whole:], reference[whole:]
        return out, captured[:whole]


def similarity(captured, reference, floor=10 ** (-50 / 20)):
    """``best_match(captured, reference, floor)``'s score alone."""
    return best_match(captured, reference, floor)[0]


def best_match(captured, reference, floor=10 ** (-50 / 20)):
    """``(score, offset)``: how much of ``captured`` is ``reference`` played back, and where:
    ``captured`` matches ``reference[offset:offset + len(captured)]`` best. The score is the peak normalised
    cross-correlation (0 to 1) of ``captured`` against ``reference`` delayed by 0 up to
    ``len(reference) - len(captured)`` samples. Both float32, same rate; ``reference`` ends where
    ``captured`` ends. Both are pre-emphasised first (a first difference: a slow drift or low
    hum correlates with anything), and delays at which the reference is quieter than ``floor``
    (RMS) are not counted: a near-silent stretch of it matches noise by chance. An echo that the
    canceller has not learnt yet (its first second or two, or after the room changed) scores 0.3
    to 0.7; a voice on top of it, or noise, 0.1-0.2 (BENCHMARKS.md, 14)."""
    n, m = len(captured), len(reference)
    if n < 2 or m < n:
        return 0.0, 0
    x = np.diff(captured.astype(np.float64))
    r = np.diff(reference.astype(np.float64))
    n, m = len(x), len(r)
    x -= x.mean()
    size = 1 << (m + n - 1).bit_length()
    dots = np.fft.irfft(np.fft.rfft(r, size) * np.conj(np.fft.rfft(x, size)), size)[: m - n + 1]
    energy = np.concatenate([[0.0], np.cumsum(r ** 2)])
    sums = np.concatenate([[0.0], np.cumsum(r)])
    window = energy[n:] - energy[:-n]  # sum of r^2 over each delay's window
    mean = (sums[n:] - sums[:-n]) / n
    spread = np.sqrt(np.maximum(window - n * mean ** 2, 1e-12))
    scores = np.abs(dots) / (spread * (np.sqrt(np.sum(x ** 2)) + 1e-12))
    # The reference's level at each delay, before the difference (which lowers it by the
    # signal's pitch): loud enough to be heard.
    level = np.concatenate([[0.0], np.cumsum(reference.astype(np.float64) ** 2)])
    heard = np.sqrt((level[n + 1:] - level[1:-n]) / n) >= floor
    heard = heard[: len(scores)]
    if not heard.any():
        return 0.0, 0
    offset = int(np.argmax(np.where(heard, scores, -1.0)))
    return float(scores[offset]), offset

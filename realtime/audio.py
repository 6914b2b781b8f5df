"""Audio formats of the Realtime protocol, and stateful conversion to and from the pipeline.

Wire formats (OpenAI Realtime GA, ``audio.input.format`` / ``audio.output.format``):

- ``audio/pcm``: 16-bit little-endian signed mono PCM at 24,000 Hz (the only rate allowed).
- ``audio/pcmu`` / ``audio/pcma``: ITU-T G.711 mu-law / A-law, 8-bit samples at 8,000 Hz.

The pipeline works in float32 mono: 16,000 Hz for VAD and STT (what Silero VAD and Whisper take),
24,000 Hz out of TTS (what Kokoro speaks). Resampling goes through soxr's ``ResampleStream``, one
per direction per session, so chunk boundaries leave no clicks. G.711 uses the standard library's
``audioop`` (``audioop-lts`` on Python 3.13+).

Every rule of the wire's audio is here: base64, PCM16 framing (float -> PCM16 rounds, for the wire
and the recordings alike) and the cut of a reply into ``DELTA_MS`` deltas. The decoder and the
encoder are handed to the unit with each session's settings, and run on its stage threads (the
event loop only parses and routes, docs/DESIGN.md).
"""

import base64
import binascii
import warnings

import numpy as np
import soxr

from pool.backends.base import SPEECH_RATE, TTS_RATE

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    import audioop  # stdlib until 3.12, the audioop-lts package after

PCM_RATE = 24_000  # Hz, audio/pcm on the wire
G711_RATE = 8_000  # Hz, audio/pcmu and audio/pcma on the wire

FORMAT_TYPES = ("audio/pcm", "audio/pcmu", "audio/pcma")
DELTA_MS = 200  # audio per response.output_audio.delta: small for any client's message limit


class AudioFormatError(ValueError):
    """An append that cannot be audio in the declared format: ``code`` is the ``error`` event's,
    ``invalid_base64`` (not base64) or ``invalid_audio`` (e.g. PCM16 with an odd byte count)."""

    def __init__(self, message, code="invalid_audio"):
        super().__init__(message)
        self.code = code


def wire_rate(fmt):
    """Sample rate (Hz) of a wire format dict such as ``{"type": "audio/pcm", "rate": 24000}``."""
    return PCM_RATE if fmt["type"] == "audio/pcm" else G711_RATE


def bytes_per_second(fmt):
    """Bytes of one second of audio in a wire format (PCM16: 2 per sample; G.711: 1)."""
    return wire_rate(fmt) * (2 if fmt["type"] == "audio/pcm" else 1)


def pcm16_to_float(data):
    """PCM16 little-endian bytes -> float32 array in [-1, 1). Raises AudioFormatError on odd length."""
    if len(data) % 2:
        raise AudioFormatError(f"PCM16 audio must have an even number of bytes, got {len(data)}")
    return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0


def float_to_pcm16(samples):
    """float32 array in [-1, 1] -> PCM16 little-endian bytes (clipped, rounded)."""
    clipped = np.clip(np.asarray(samples, dtype=np.float32), -1.0, 1.0)
    return np.round(clipped * 32767.0).astype("<i2").tobytes()


def _g711_decode(data, fmt_type):
    decode = audioop.ulaw2lin if fmt_type == "audio/pcmu" else audioop.alaw2lin
    return decode(data, 2)


def _g711_encode(pcm16, fmt_type):
    encode = audioop.lin2ulaw if fmt_type == "audio/pcmu" else audioop.lin2alaw
    return encode(pcm16, 2)


class InputAudioDecoder:
    """Wire audio of one session -> float32 mono at SPEECH_RATE, resampled statefully.

    ``decode(audio_b64)`` takes the ``audio`` of one ``input_audio_buffer.append`` (base64) and
    returns float32 samples at 16 kHz. Raises AudioFormatError for text that is not base64, or
    bytes the format cannot hold.
    """

    def __init__(self, fmt):
        self.format_type = fmt["type"]
        self._resampler = soxr.ResampleStream(wire_rate(fmt), SPEECH_RATE, 1, dtype="float32")

    def decode(self, audio_b64):
        try:
            data = base64.b64decode(audio_b64, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise AudioFormatError(f"'audio' is not valid base64: {exc}.", "invalid_base64") from None
        if self.format_type != "audio/pcm":
            data = _g711_decode(data, self.format_type)
        return self._resampler.resample_chunk(pcm16_to_float(data))


class OutputAudioEncoder:
    """TTS float32 mono at TTS_RATE -> the ``delta`` strings of one session's output format.

    PCM at 24 kHz needs no resampling; G.711 is resampled statefully to 8 kHz first.
    ``deltas(samples, last=False)`` returns base64 strings of at most DELTA_MS each.
    """

    def __init__(self, fmt):
        self.format_type = fmt["type"]
        self.bytes_per_second = bytes_per_second(fmt)
        self._resampler = None
        if wire_rate(fmt) != TTS_RATE:
            self._resampler = soxr.ResampleStream(TTS_RATE, wire_rate(fmt), 1, dtype="float32")

    def encode(self, samples, last=False):
        """Wire bytes of ``samples`` (``last``: the end of the reply, the resampler's tail)."""
        if self._resampler is not None:
            samples = self._resampler.resample_chunk(samples, last=last)
        pcm16 = float_to_pcm16(samples)
        if self.format_type == "audio/pcm":
            return pcm16
        return _g711_encode(pcm16, self.format_type)

    def deltas(self, samples, last=False):
        """``samples`` as the base64 ``delta`` strings of ``response.output_audio.delta``."""
        wire = self.encode(samples, last)
        step = self.bytes_per_second * DELTA_MS // 1000
        return [base64.b64encode(wire[i:i + step]).decode("ascii") for i in range(0, len(wire), step)]

"""Wire audio: PCM16 and G.711 decoding, stateful resampling, odd byte counts."""

import base64

import numpy as np
import pytest
import soxr

from realtime.audio import AudioFormatError, InputAudioDecoder, OutputAudioEncoder, float_to_pcm16, pcm16_to_float
from realtime.client import load_audio

from .helpers import JFK


def test_odd_pcm16_byte_count_is_an_audio_format_error():
    with pytest.raises(AudioFormatError):
        InputAudioDecoder({"type": "audio/pcm", "rate": 24000}).decode(base64.b64encode(b"\x00\x01\x02").decode())


def test_chunked_decoding_matches_one_shot_resampling():
    speech = load_audio(JFK)[: 24_000 * 2]
    pcm = float_to_pcm16(speech)
    decoder = InputAudioDecoder({"type": "audio/pcm", "rate": 24000})
    chunks = [decoder.decode(base64.b64encode(pcm[i:i + 1920]).decode())
              for i in range(0, len(pcm), 1920)]  # 40 ms appends
    streamed = np.concatenate(chunks)
    whole = soxr.resample(pcm16_to_float(pcm), 24_000, 16_000)
    n = min(len(streamed), len(whole)) - 200  # the stream holds back a few samples of delay
    assert len(streamed) >= len(whole) - 400
    assert np.max(np.abs(streamed[:n] - whole[:n])) < 1e-3


@pytest.mark.parametrize("fmt", ["audio/pcmu", "audio/pcma"])
def test_g711_round_trip_is_8khz_one_byte_per_sample(fmt):
    t = np.arange(24_000) / 24_000
    tone = (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    wire = OutputAudioEncoder({"type": fmt}).encode(tone, last=True)
    assert abs(len(wire) - 8_000) < 50  # one second at 8 kHz, one byte per sample
    decoded = InputAudioDecoder({"type": fmt}).decode(base64.b64encode(wire).decode())
    assert 14_500 <= len(decoded) <= 16_000  # less the stream resampler's delay (about 66 ms)
    spectrum = np.abs(np.fft.rfft(decoded[2000:14000]))
    peak_hz = np.argmax(spectrum) * 16_000 / 12_000
    assert abs(peak_hz - 440) < 5

"""noise_reduction: RNNoise before the VAD and the STT (``pool.backends.denoise``), on real
speech mixed with noise the server did not make; and through the protocol on the scripted
backend, where the STT hears what the VAD stage passed on."""

import numpy as np
import pytest
import soxr

from pool.backends.denoise import RNNoise
from pool.backends.scripted import SCRIPT
from realtime.client import load_audio

from .helpers import JFK, appends


def db(samples):
    return 10 * np.log10(np.mean(np.square(samples, dtype=np.float64)) + 1e-12)


def noise(seconds, level=0.05, seed=0):
    return (np.random.default_rng(seed).standard_normal(int(seconds * 16_000)) * level).astype(np.float32)


def denoise(stream, samples, pieces=100):
    return np.concatenate([stream.process(piece) for piece in np.array_split(samples, pieces)])


def test_rnnoise_removes_steady_noise_and_keeps_speech():
    stream = RNNoise().new_stream()
    hiss = noise(5.0)
    assert db(denoise(stream, hiss)[8000:]) < db(hiss) - 20  # after its first half second
    stream.reset()
    speech = soxr.resample(load_audio(JFK), 24_000, 16_000).astype(np.float32)
    out = denoise(stream, speech + noise(len(speech) / 16_000))
    assert abs(len(out) - len(speech)) < 0.1 * 16_000  # about 50 ms behind (frames, resamplers)
    assert abs(db(out) - db(speech)) < 3  # the speech stays (its power within 3 dB)


@pytest.mark.usefixtures("scripted_pool")
@pytest.mark.parametrize("noise_reduction", [None, {"type": "near_field"}, {"type": "far_field"}])
async def test_the_stt_hears_the_denoised_input_when_the_session_asks_for_it(connect, noise_reduction):
    SCRIPT.transcript = lambda audio: f"{db(audio):.0f} dB"
    client = await connect()
    await client.until("session.created")
    await client.send({"type": "session.update", "session": {"audio": {"input": {
        "turn_detection": None, "noise_reduction": noise_reduction, "transcription": {"model": "whisper-1"}}}}})
    updated = await client.until("session.updated")
    assert updated["session"]["audio"]["input"]["noise_reduction"] == noise_reduction
    hiss = soxr.resample(noise(2.0), 16_000, 24_000).astype(np.float32)
    for append in appends(hiss):
        await client.send(append)
    await client.send({"type": "input_audio_buffer.commit"})
    heard = float((await client.until("conversation.item.input_audio_transcription.completed"))["transcript"][:-3])
    if noise_reduction is None:
        assert heard > db(hiss) - 3
    else:
        assert heard < db(hiss) - 15
    await client.ws.disconnect()


def test_noise_reduction_is_checked():
    from realtime import session_config as sc
    from realtime.errors import ProtocolError

    session = sc.default_session("sess_1", "m", "i", "alloy")
    with pytest.raises(ProtocolError) as refused:
        sc.apply_update(session, {"audio": {"input": {"noise_reduction": {"type": "studio"}}}})
    assert refused.value.param == "session.audio.input.noise_reduction.type"

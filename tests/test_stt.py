"""The real Whisper tiny.en on real recordings: the short encoder window for a turn, and the
ordinary 30 s path for long audio."""

import numpy as np
import pytest
import soxr

from pool.backends.cache import default_paths
from pool.backends.stt import MIN_WINDOW_SECONDS, SHORT_WINDOW_MAX_SECONDS, WhisperSTT, encoder_frames
from pool.conf import get_config
from realtime.client import load_audio

from .helpers import AUDIO_DIR, HOTWORDS, JFK, JFK_WORDS, normalise


def _16k(path):
    return soxr.resample(load_audio(path), 24_000, 16_000).astype(np.float32)


@pytest.fixture(scope="module")
def stt():
    return WhisperSTT(default_paths(get_config()["MODEL_CACHE_DIR"])["stt"])


def test_encoder_window_keeps_its_margin_and_bounds():
    assert encoder_frames(0.5) == encoder_frames(6.0) == 1000  # 10 s floor
    assert encoder_frames(0.5, floor=0) == 500  # 0.5 s + 4 s margin, rounded up
    assert encoder_frames(11.0) == 1500  # 11 s + 4 s margin
    assert encoder_frames(25.9) == 3000  # capped at Whisper's 30 s window


class _EncodeSpy:
    """Whisper's CTranslate2 model, recording the log-mel frames of every window it encodes."""

    def __init__(self, model):
        self._model, self.windows = model, []

    def encode(self, features, *args, **kwargs):
        self.windows.append(features.shape[-1])
        return self._model.encode(features, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._model, name)


@pytest.mark.parametrize("peek_floor, windows", [(MIN_WINDOW_SECONDS, [1000, 1000]), (0, [600, 1000])])
def test_a_peek_encodes_the_window_chosen_for_this_cpu_and_a_turn_keeps_the_floor(stt, monkeypatch, peek_floor,
                                                                                   windows):
    """A peek (``hear``: speech over the reply, due within the decision budget) encodes at least
    ``peek_floor`` seconds; without a floor, the audio plus the 4 s margin: 2 s -> 6 s, for about
    half the cost (BENCHMARKS.md 14g). A turn's transcript keeps the 10 s floor either way. The
    peek still hears the words, and they are not a backchannel."""
    config = get_config()
    spy = _EncodeSpy(stt.model.model)
    monkeypatch.setattr(stt.model, "model", spy)
    monkeypatch.setattr(stt, "peek_floor", peek_floor)
    audio = _16k(JFK)[: 2 * 16_000]  # "And so my fellow"
    text, likeness = stt.hear(audio, "en", prompt=config["BACKCHANNEL_PROMPT"],
                              phrases=config["BACKCHANNEL_PHRASES"]["en"])
    assert normalise(text).startswith("and so my"), text
    assert likeness < config["BACKCHANNEL_LIKENESS"]
    stt.transcribe(audio, "en")
    assert spy.windows == windows


def test_short_window_transcribes_a_whole_recording(stt):
    audio = _16k(JFK)
    assert len(audio) / 16_000 < SHORT_WINDOW_MAX_SECONDS
    assert JFK_WORDS in normalise(stt.transcribe(audio, "en"))


def test_short_window_hears_short_turns(stt):
    assert "fellow americans" in normalise(stt.transcribe(_16k(JFK)[: 3 * 16_000], "en"))
    text = normalise(stt.transcribe(_16k(HOTWORDS), "en"))
    assert "comfy" in text and "folder" in text, text


def test_long_audio_is_transcribed_to_its_end(stt):
    """28 s (past the short window): the 30 s path hears the last recording too."""
    audio = np.concatenate([_16k(JFK), _16k(HOTWORDS), _16k(AUDIO_DIR / "stereo_diarization.wav"), _16k(JFK)])
    audio = audio[: 28 * 16_000]
    text = normalise(stt.transcribe(audio, "en"))
    assert text.count("fellow americans") == 2, text
    assert "comfy" in text and "curtain" in text, text


def test_silence_is_no_words(stt):
    assert stt.transcribe(np.zeros(16_000, np.float32), "en") == ""


def test_a_batch_of_turns_is_transcribed_as_each_turn_alone(stt):
    """What the compute queue runs for turns that end together (``transcribe_batch``): the same
    transcripts as one by one, with prompts of two lengths (two decodes), a silent turn, a turn
    of a longer window (encoded apart: padded to 30 s, "comfyUI" came back "ComfyUI") and audio
    past the short window (the 30 s path, alone; its temperature fallback samples on this audio:
    22 to 68 words in runs, so it is only checked to be there)."""
    jfk, hotwords = _16k(JFK), _16k(HOTWORDS)
    both = np.concatenate([jfk, hotwords, jfk, hotwords])
    turns = [(jfk[: 4 * 16_000], "en", None), (hotwords[: 5 * 16_000], "en", "ComfyUI folder."),
             (np.zeros(16_000, np.float32), "en", None), (both[: 20 * 16_000], "en", None),
             (both[: 28 * 16_000], "en", None), (jfk[4 * 16_000: 8 * 16_000], None, None)]
    alone = [stt.transcribe_detect(*turn) for turn in turns]
    batch = stt.transcribe_batch(turns)
    assert batch[:4] + batch[5:] == alone[:4] + alone[5:]
    assert "fellow americans" in normalise(alone[0][0]) and "folder" in normalise(alone[1][0])
    assert alone[2] == ("", "en") and alone[5][1] == "en"
    assert batch[4][1] == "en" and batch[4][0]

"""The multilingual preset with the real models over a live server and the openai SDK: speech in
Spanish and French, made by the project's own Kokoro voices for those languages and streamed in
real time, is heard in its language and answered in it (a scripted test LLM stands in for a
multilingual one: tests/multilingual_backend.py), and a language never outlives its session."""

import json

import numpy as np
import pytest
import soundfile
import soxr

from pool.backends.cache import prepare
from pool.conf import get_config
from pool.testing import LiveServer
from realtime.audio import PCM_RATE
from realtime.client import talk

from .helpers import JFK, JFK_WORDS, normalise

pytestmark = [pytest.mark.models, pytest.mark.live]

# language -> (the voice that says it, what it says, words the transcript must hold)
SPEECH = {
    "es": ("ef_dora", "Hola, ¿qué tiempo hace hoy en Madrid?", ["tiempo", "madrid"]),
    "fr": ("ff_siwis", "Bonjour, pouvez-vous me donner la météo de Paris pour demain ?", ["paris", "demain"]),
}


@pytest.fixture(scope="module")
def paths():
    return prepare(get_config()["MODEL_CACHE_DIR"], progress=False, preset="multilingual")


@pytest.fixture(scope="module")
def live(paths, tmp_path_factory):
    env = {"S2S_PRESET": "multilingual", "S2S_BACKEND": "tests.multilingual_backend.load",
           "S2S_JSON": json.dumps({"CONNECTS_PER_MINUTE": None})}
    with LiveServer(tmp_path_factory.mktemp("multilingual"), pool_size=1, env=env) as server:
        yield server


@pytest.fixture(scope="module")
def recordings(paths, tmp_path_factory):
    """A WAV file (24 kHz) per language, spoken by our Kokoro voice of that language."""
    from pool.backends.tts import KokoroTTS

    kokoro = KokoroTTS(paths["tts_model"], paths["tts_voices"])
    folder = tmp_path_factory.mktemp("speech")
    files = {}
    for language, (voice, text, _) in SPEECH.items():
        speech = kokoro.synthesize(text, voice)
        files[language] = folder / f"{language}.wav"
        soundfile.write(files[language], np.concatenate([np.zeros(PCM_RATE // 2, np.float32), speech]), PCM_RATE)
    return files


@pytest.fixture(scope="module")
def whisper_base(paths):
    from pool.backends.stt import WhisperSTT

    return WhisperSTT(paths["stt"])


async def converse(live, recording, session=None):
    events = []
    result = await talk(live.base_url, recording, session=session, timeout_s=180,
                        on_event=lambda e: events.append(e.to_dict()))
    return result, events


@pytest.mark.parametrize("language", ["es", "fr"])
async def test_speech_in_spanish_and_french_is_heard_and_answered_in_its_language(
        live, recordings, whisper_base, language):
    result, events = await converse(live, recordings[language])
    completed = [e for e in events if e["type"] == "conversation.item.input_audio_transcription.completed"]
    assert completed and {e["language"] for e in completed} == {language}, completed
    heard = normalise(" ".join(e["transcript"] for e in completed))
    assert all(word in heard for word in SPEECH[language][2]), heard
    assert result.status == "completed" and len(result.audio) > PCM_RATE  # over half a second
    reply = np.frombuffer(result.audio, dtype="<i2").astype(np.float32) / 32768
    words, spoken = whisper_base.transcribe_detect(soxr.resample(reply, PCM_RATE, 16_000))
    assert spoken == language, words
    created = next(e["session"] for e in events if e["type"] == "session.created")
    assert created["audio"]["input"]["transcription"]["model"] == "whisper-base"  # the model loaded
    session_id = created["id"]
    voices = {row[0] for row in live.query(
        f"select voice from pool_conversationitem where session_id = '{session_id}' and role = 'assistant'")}
    assert voices == {SPEECH[language][0]}  # the preset's voice of that language (the session's is alloy)
    heard_in = {row[0] for row in live.query(
        f"select language from pool_conversationitem where session_id = '{session_id}' and role = 'user'")}
    assert heard_in == {language}  # the session history keeps each turn's language


async def test_a_language_set_by_one_session_never_reaches_the_next_on_the_same_unit(live, recordings):
    french = {"type": "realtime", "audio": {"input": {"transcription": {"language": "fr"}}}}
    _, events = await converse(live, recordings["fr"], session=french)
    assert {e["language"] for e in events if e["type"].endswith("transcription.completed")} == {"fr"}
    result, events = await converse(live, JFK)  # the same unit: the pool has one
    completed = [e for e in events if e["type"].endswith("transcription.completed")]
    assert {e["language"] for e in completed} == {"en"}
    assert JFK_WORDS in normalise(result.user_transcript)

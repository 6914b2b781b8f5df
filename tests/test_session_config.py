"""session.update semantics: deep merge, turn detection, beta names, validation with param."""

import pytest

from realtime import session_config as sc
from realtime.errors import ProtocolError


@pytest.fixture
def session():
    return sc.default_session("sess_1", "model", "Be brief.", "alloy")


def test_deep_merge_keeps_untouched_fields(session):
    updated = sc.apply_update(session, {"audio": {"output": {"voice": "coral"}}})
    assert updated["audio"]["output"] == {**session["audio"]["output"], "voice": "coral"}
    assert updated["audio"]["input"] == session["audio"]["input"]
    assert updated["instructions"] == "Be brief."


def test_partial_turn_detection_keeps_server_vad(session):
    updated = sc.apply_update(session, {"audio": {"input": {"turn_detection": {"threshold": 0.8}}}})
    td = updated["audio"]["input"]["turn_detection"]
    assert td["type"] == "server_vad"
    assert td["threshold"] == 0.8
    assert td["silence_duration_ms"] == sc.SERVER_VAD_DEFAULTS["silence_duration_ms"]


def test_null_turn_detection_means_manual_turns_and_can_come_back(session):
    manual = sc.apply_update(session, {"audio": {"input": {"turn_detection": None}}})
    assert manual["audio"]["input"]["turn_detection"] is None
    back = sc.apply_update(manual, {"audio": {"input": {"turn_detection": {"silence_duration_ms": 900}}}})
    assert back["audio"]["input"]["turn_detection"]["type"] == "server_vad"
    assert back["audio"]["input"]["turn_detection"]["silence_duration_ms"] == 900


def test_switching_to_semantic_vad_drops_server_vad_fields(session):
    updated = sc.apply_update(session, {"audio": {"input": {"turn_detection": {"type": "semantic_vad"}}}})
    td = updated["audio"]["input"]["turn_detection"]
    assert td == {**sc.SEMANTIC_VAD_DEFAULTS}
    assert sc.effective_silence_ms(td) == sc.EAGERNESS_SILENCE_MS["auto"]


def test_beta_fields_map_to_ga(session):
    updated = sc.apply_update(session, {
        "modalities": ["text", "audio"], "voice": "echo", "input_audio_format": "g711_ulaw",
        "output_audio_format": "pcm16", "turn_detection": {"type": "server_vad", "threshold": 0.7},
        "input_audio_transcription": {"model": "whisper-1"}, "temperature": 0.8,
    })
    assert updated["output_modalities"] == ["audio"]
    assert updated["audio"]["output"]["voice"] == "echo"
    assert updated["audio"]["input"]["format"] == {"type": "audio/pcmu"}
    assert updated["audio"]["output"]["format"] == {"type": "audio/pcm", "rate": 24000}
    assert updated["audio"]["input"]["turn_detection"]["threshold"] == 0.7
    assert updated["audio"]["input"]["transcription"]["model"] == "whisper-1"
    assert "temperature" not in updated


@pytest.mark.parametrize("update, param", [
    ({"audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000}}}}, "session.audio.input.format.rate"),
    ({"audio": {"input": {"turn_detection": {"threshold": 7}}}}, "session.audio.input.turn_detection.threshold"),
    ({"audio": {"input": {"turn_detection": {"silence_duration_ms": -5}}}},
     "session.audio.input.turn_detection.silence_duration_ms"),
    ({"audio": {"input": {"turn_detection": {"threshold": "high"}}}}, "session.audio.input.turn_detection.threshold"),
    ({"instructions": "x" * (sc.MAX_INSTRUCTIONS_CHARS + 1)}, "session.instructions"),
    ({"instructions": 5}, "session.instructions"),
    ({"output_modalities": ["video"]}, "session.output_modalities"),
    ({"max_output_tokens": 0}, "session.max_output_tokens"),
    ({"audio": {"output": {"speed": 9}}}, "session.audio.output.speed"),
    ({"colour": "blue"}, "session.colour"),
    ({"audio": {"input": {"loudness": 3}}}, "session.audio.input.loudness"),
    ({"audio": "loud"}, "session.audio"),
    ({"tools": [{"type": "function"}]}, "session.tools[0].name"),
])
def test_bad_updates_name_the_field_and_change_nothing(session, update, param):
    before = sc.default_session("sess_1", "model", "Be brief.", "alloy")
    with pytest.raises(ProtocolError) as caught:
        sc.apply_update(session, update)
    assert caught.value.param == param
    assert caught.value.code in ("invalid_value", "invalid_type", "unknown_parameter")
    assert session == before


def test_unknown_voice_is_accepted_and_spoken_by_a_mapped_voice(session):
    from pool.backends.voices import DEFAULT_VOICE, OPENAI_VOICES, resolve_voice

    updated = sc.apply_update(session, {"audio": {"output": {"voice": "no-such-voice"}}})
    available = set(OPENAI_VOICES.values())
    assert resolve_voice(updated["audio"]["output"]["voice"], available) == DEFAULT_VOICE
    for name in OPENAI_VOICES:
        assert resolve_voice(name, available) in available

"""Client frame parsing and the LLM -> TTS phrase splitter."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pool.stages import PhraseSplitter
from realtime.errors import ProtocolError
from realtime.events import parse_client_frame


@pytest.mark.parametrize("text, code", [
    ("{not json", "invalid_json"),
    ("[1, 2]", "invalid_event"),
    ('"session.update"', "invalid_event"),
    ("42", "invalid_event"),
    ("{}", "missing_required_parameter"),
    ('{"type": 7}', "invalid_type"),
    ('{"type": "session.explode"}', "unknown_event_type"),
    ('{"type": "response.create", "event_id": 5}', "invalid_type"),
])
def test_bad_frames_raise_protocol_errors_with_codes(text, code):
    with pytest.raises(ProtocolError) as caught:
        parse_client_frame(text)
    assert caught.value.code == code


def test_binary_frame_is_refused_with_a_code():
    with pytest.raises(ProtocolError) as caught:
        parse_client_frame(None, b"\x00\x01")
    assert caught.value.code == "invalid_frame"


def test_event_id_is_echoed_in_errors():
    with pytest.raises(ProtocolError) as caught:
        parse_client_frame('{"type": "nope", "event_id": "evt_1"}')
    assert caught.value.to_error()["event_id"] == "evt_1"


def _split(tokens):
    splitter = PhraseSplitter()
    phrases = [p for t in tokens for p in splitter.push(t)]
    rest = splitter.flush()
    return phrases + ([rest] if rest else [])


def test_first_phrase_is_short_and_sentences_end_phrases():
    tokens = ["Sure", ",", " I", " can", " help", " with", " that", ".", " The", " capital", " of",
              " France", " is", " Paris", ".", " Anything", " else", "?"]
    phrases = _split(tokens)
    assert phrases[0] == "Sure, I can help with that."
    assert phrases[1] == " The capital of France is Paris."
    assert phrases[2] == " Anything else?"


def test_long_first_sentence_is_cut_early_at_a_word_boundary():
    words = "one two three four five six seven eight nine ten eleven twelve".split()
    phrases = _split([w + " " for w in words])
    assert phrases[0].split() == words[: PhraseSplitter.FIRST_MAX_WORDS]


def test_numbers_with_points_do_not_end_a_phrase():
    phrases = _split(["It is 3.5 degrees.", " Cold."])
    assert phrases[0] == "It is 3.5 degrees."


@given(st.lists(st.text(max_size=12), max_size=40))
def test_phrases_concatenate_back_to_the_text(tokens):
    assert "".join(_split(tokens)) == "".join(tokens)

"""Client frame parsing and the LLM -> TTS phrase splitter."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pool.pipeline.phrases import PhraseSplitter
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


def test_sentences_end_phrases():
    tokens = ["Yes", ".", " The", " capital", " of", " France", " is", " Paris", ".", " Anything", " else", "?"]
    assert _split(tokens) == ["Yes.", " The capital of France is Paris.", " Anything else?"]


def test_first_phrases_are_cut_short_and_grow():
    words = [f"w{i}" for i in range(80)]
    phrases = _split([w + " " for w in words])
    assert [len(p.split()) for p in phrases[:4]] == [*PhraseSplitter.MAX_WORDS, PhraseSplitter.MAX_WORDS[-1]]


def test_an_early_comma_ends_the_first_phrase():
    assert _split(["Well", " sure", ",", " I", " can", " help", "."])[0] == "Well sure,"


def test_numbers_with_points_do_not_end_a_phrase():
    phrases = _split(["It is 3.5 degrees.", " Cold."])
    assert phrases[0] == "It is 3.5 degrees."


@given(st.lists(st.text(max_size=12), max_size=40))
def test_phrases_concatenate_back_to_the_text(tokens):
    assert "".join(_split(tokens)) == "".join(tokens)

"""What counts as an interruption of the assistant, and the words of a transcript (pure rules
of ``realtime.turns``; the behaviour over the protocol is in test_turn_taking.py)."""

import pytest

from pool.conf import DEFAULTS
from realtime.turns import interrupts, words


@pytest.mark.parametrize("heard, expected", [
    ("Mm-hmm.", False), ("Mm-huh.", False), ("Uh-huh.", False), ("And Mm-hmm.", False),
    ("Mm-hums.", False), ("Yeah.", False), ("Yeah, okay.", False), ("Yes.", False),
    ("Right, right.", False), ("Yeah, f-", False), ("", False), ("...", False), ("S...", False),
    ("I'm", False),  # Whisper's spelling of the start of a hum; "I'm sorry" is words
    ("I'm sorry, what?", True),
    ("Wait.", True), ("Wait, stop.", True), ("Stop.", True), ("No.", True), ("What?", True),
    ("Yeah, but", True), ("Ask not.", True), ("Okay, tell me more", True),
])
def test_what_interrupts_the_assistant(heard, expected):
    assert interrupts(heard, frozenset(DEFAULTS["BACKCHANNEL_WORDS"])) is expected


def test_words_join_hyphens_and_drop_punctuation():
    assert words("Mm-hmm. Don't STOP!") == ["mmhmm", "dont", "stop"]

"""Speech pacing: a phrase is cut to what can be synthesized before the client runs out of
audio, and the TTS stage speaks it in those pieces."""

import queue
import threading
import time

from hypothesis import given
from hypothesis import strategies as st

from pool.backends.base import Backends, LLMRequest
from pool.backends.scripted import ScriptedTTS
from pool.pipeline import messages as m
from pool.pipeline.pacing import MIN_PIECE_WORDS, SpeechPace
from pool.pipeline.stages.tts import TTSStage
from realtime.audio import OutputAudioEncoder

from .helpers import wait_for

SENTENCE = " The capital of France is Paris, a city of lights, art and very good food."


def test_before_the_first_audio_and_with_a_long_lead_the_phrase_is_whole():
    pace = SpeechPace(real_time_factor=0.8, seconds_per_word=0.35)
    assert pace.next_piece(SENTENCE, None) == (SENTENCE, "")
    assert pace.next_piece(SENTENCE, 10.0) == (SENTENCE, "")


def test_a_short_lead_cuts_the_phrase_at_a_comma_within_the_budget():
    pace = SpeechPace(real_time_factor=0.8, seconds_per_word=0.35)
    piece, rest = pace.next_piece(SENTENCE, 2.0)  # 2.0 / 0.28 = 7 words fit
    assert piece == " The capital of France is Paris," and piece + rest == SENTENCE


def test_no_piece_is_shorter_than_the_minimum_even_with_no_lead():
    pace = SpeechPace()
    piece, _ = pace.next_piece(SENTENCE, -1.0)  # the client is already waiting
    assert len(piece.split()) == MIN_PIECE_WORDS


def test_while_other_work_waits_a_piece_is_cut_to_a_bounded_compute():
    """One synthesis cannot be paused: with other units' work waiting, a long lead no longer
    lets a whole sentence hold the cores (0.6 s / (0.2 x 0.35 s) = 8 words fit)."""
    pace = SpeechPace(real_time_factor=0.2, seconds_per_word=0.35)
    assert pace.next_piece(SENTENCE, 10.0) == (SENTENCE, "")
    piece, rest = pace.next_piece(SENTENCE, 10.0, contended=True)
    assert piece == " The capital of France is Paris," and piece + rest == SENTENCE
    assert pace.next_piece(SENTENCE, 0.5, contended=True) == pace.next_piece(SENTENCE, 0.5)  # the lead is shorter


def test_the_estimates_follow_what_the_tts_measured():
    pace = SpeechPace(real_time_factor=0.8, seconds_per_word=0.35)
    for _ in range(30):
        pace.observe(words=10, audio_seconds=3.0, compute_seconds=0.9)
    assert abs(pace.real_time_factor - 0.3) < 0.01 and abs(pace.seconds_per_word - 0.3) < 0.01


@given(st.lists(st.sampled_from(["a", "word,", "longer", "end.", " ", "  "]), max_size=40),
       st.one_of(st.none(), st.floats(-5, 20)))
def test_pieces_concatenate_back_to_the_phrase(tokens, lead):
    text = " ".join(tokens)
    piece, rest = SpeechPace().next_piece(text, lead)
    assert piece + rest == text and (piece.strip() or not text.strip())


def _speak(phrases, seconds_per_char, real_time_factor=1.0, contended=False):
    """The TTS stage speaks ``phrases`` of one response with the scripted TTS; returns the
    transcripts of the audio events it sent. ``contended``: other work waits in the compute
    queue all along."""
    from pool.backends.scripted import SCRIPT

    SCRIPT.reset()
    SCRIPT.seconds_per_char = seconds_per_char
    tts = ScriptedTTS()
    stage = TTSStage(Backends(None, None, None, tts))
    stage._pace = SpeechPace(real_time_factor=real_time_factor, seconds_per_word=0.35)
    if contended:
        stage._pace.observe = lambda *measured: None  # the scripted TTS's speed is not the point here
        stage._queue.due_waiting = lambda: 1  # this test's own queue (one per Backends)
    events = queue.Queue()
    ctx = m.SessionContext(events.put)
    job = m.ResponseJob("resp_1", LLMRequest([], 10), "audio", "alloy", 1.0,
                        OutputAudioEncoder({"type": "audio/pcm", "rate": 24000}))
    try:
        for phrase in phrases:
            stage.handle(ctx, m.Phrase(job, phrase))
    finally:
        stage.stop()
        SCRIPT.reset()
    sent = []
    while not events.empty():
        sent.append(events.get().transcript)
    return sent


def test_the_tts_stage_speaks_a_long_phrase_in_pieces_when_the_lead_is_short(monkeypatch):
    # Synthesis at half real time, a one-word first phrase: the lead is too short for the
    # whole sentence.
    first, second = "Sure,", SENTENCE
    real = ScriptedTTS.synthesize

    def slow(self, text, voice, speed=1.0):
        audio = real(self, text, voice, speed)
        time.sleep(len(audio) / 24_000 * 0.5)
        return audio

    monkeypatch.setattr(ScriptedTTS, "synthesize", slow)
    sent = _speak([first, second], seconds_per_char=0.02)
    assert sent[0] == first and "".join(sent[1:]) == second and len(sent) > 2


def test_the_tts_stage_keeps_phrases_whole_when_synthesis_is_far_ahead():
    sent = _speak(["Sure, I can help.", SENTENCE], seconds_per_char=0.05, real_time_factor=0.05)
    assert sent == ["Sure, I can help.", SENTENCE]


def test_the_tts_stage_cuts_a_long_phrase_while_other_units_work_waits():
    first = "Sure, I can help you with that today."  # 7.6 s of audio: a lead for 100 words here
    assert _speak([first, SENTENCE], seconds_per_char=0.2, real_time_factor=0.2) == [first, SENTENCE]
    sent = _speak([first, SENTENCE], seconds_per_char=0.2, real_time_factor=0.2, contended=True)
    assert sent == [first, " The capital of France is Paris,", " a city of lights, art and very good food."]


def test_synthesis_may_wait_only_while_the_lead_outlasts_the_shortest_piece():
    pace = SpeechPace(real_time_factor=0.5, seconds_per_word=0.4)  # 3 words: 0.6 s of compute
    assert not pace.can_wait(None)  # nothing plays yet: a user waits for the first audio
    assert not pace.can_wait(0.7)
    assert pace.can_wait(2.0)


def _undecided_job(lead_seconds):
    """A reply whose client holds ``lead_seconds`` of audio, with user speech over it undecided."""
    job = m.ResponseJob("resp_1", LLMRequest([], 10), "audio", "alloy", 1.0,
                        OutputAudioEncoder({"type": "audio/pcm", "rate": 24000}))
    job.audio_sent(lead_seconds)
    job.overlap_undecided.set()
    return job


def test_while_speech_over_the_reply_is_undecided_synthesis_waits_if_the_lead_allows():
    from pool.backends.scripted import SCRIPT

    SCRIPT.reset()
    stage = TTSStage(Backends(None, None, None, ScriptedTTS()))
    stage._pace = SpeechPace(real_time_factor=0.5, seconds_per_word=0.4)  # can_wait: a lead over 0.85 s
    stage._pace.observe = lambda *measured: None  # the scripted TTS's speed is not the point here
    events = queue.Queue()
    job = _undecided_job(lead_seconds=30.0)
    speaking = threading.Thread(target=stage.handle, args=(m.SessionContext(events.put), m.Phrase(job, SENTENCE)))
    try:
        speaking.start()
        assert not wait_for(lambda: SCRIPT.tts_texts, timeout=0.3)  # the peeks have the cores
        job.overlap_undecided.clear()  # a backchannel: the reply goes on
        assert wait_for(lambda: SCRIPT.tts_texts == [SENTENCE.strip()])
        speaking.join(5)
        # With too little lead left to wait, it speaks at once, undecided or not.
        short = _undecided_job(lead_seconds=0.5)
        stage.handle(m.SessionContext(events.put), m.Phrase(short, SENTENCE))
        assert len(SCRIPT.tts_texts) > 1
    finally:
        job.cancelled.set()
        speaking.join(5)
        stage.stop()
        SCRIPT.reset()

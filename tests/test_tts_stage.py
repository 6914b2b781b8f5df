"""The TTS stage alone (``pool.testing.run_stage``) on the scripted TTS: what it emits for each
phrase, a cancel while a phrase is being synthesized, and a function call between phrases."""

import threading

import pytest

from pool.backends.base import Backends, LLMRequest
from pool.backends.scripted import SCRIPT, ScriptedTTS
from pool.pipeline import messages as m
from pool.pipeline.stages.tts import TTSStage
from pool.testing import run_stage
from realtime.audio import OutputAudioEncoder


@pytest.fixture
def stage():
    SCRIPT.reset()
    tts = TTSStage(Backends(None, None, None, ScriptedTTS()))
    yield tts
    tts.stop()
    SCRIPT.reset()


def job():
    return m.ResponseJob("resp_1", LLMRequest([], 10), "audio", "alloy", 1.0,
                         OutputAudioEncoder({"type": "audio/pcm", "rate": 24000}))


def test_each_phrase_is_one_audio_event_with_its_words_then_the_reply_finishes(stage):
    reply = job()
    emitted, _ = run_stage(stage, [m.Phrase(reply, "Sure, I can help."), m.Phrase(reply, " Paris it is."),
                                   m.JobEnd(reply, {"output_tokens": 7})])
    audio = [e for e in emitted if isinstance(e, m.ResponseAudio)]
    assert [e.transcript for e in audio] == ["Sure, I can help.", " Paris it is."]
    assert all(e.chunks and e.audio_ms > 0 for e in audio) and reply.phrases_spoken == 2
    assert isinstance(emitted[-1], m.ResponseFinished) and emitted[-1].usage == {"output_tokens": 7}
    assert reply.marks.tts_first_audio is not None  # the first phrase's audio is the reply's first


def test_a_cancel_during_synthesis_frees_the_stage_at_once_and_sends_nothing_of_the_phrase(stage, monkeypatch):
    real, synthesized, release = ScriptedTTS.synthesize, threading.Event(), threading.Event()
    finished = threading.Event()

    def slow(self, text, voice, speed=1.0):
        release.wait(10)  # a TTS that cannot stop mid-run: this one lasts until released
        synthesized.set()
        try:
            return real(self, text, voice, speed)
        finally:
            finished.set()

    monkeypatch.setattr(ScriptedTTS, "synthesize", slow)
    reply = job()
    threading.Timer(0.1, reply.cancelled.set).start()
    emitted, _ = run_stage(stage, [m.Phrase(reply, "A long sentence that takes a while.")])
    assert not synthesized.is_set()  # the stage let go while the synthesis still ran
    release.set()
    assert emitted == [] and reply.phrases_spoken == 0
    emitted, _ = run_stage(stage, [m.JobEnd(reply, {})])  # the reply still ends, without final audio
    assert [type(e) for e in emitted] == [m.ResponseFinished]
    # The run the stage let go of ends within this test: it records its text in the shared
    # SCRIPT, and a CI run saw it land in the next test's record, after that test's reset.
    assert finished.wait(10)


def test_a_cancel_stops_the_synthesis_running_for_it_and_the_cores_go_to_the_next_call():
    """A TTS that ``stops`` (Kokoro) is asked to end the cancelled reply's run: the compute queue's
    worker is free for another unit's phrase at once, instead of after the unheard synthesis."""
    from pool.backends.base import RunStoppedError

    stopped, started = threading.Event(), threading.Event()

    class StoppingTTS(ScriptedTTS):
        stops = True

        def synthesize(self, text, voice, speed=1.0, stop=None):
            if text.startswith("A long"):
                started.set()
                stop.on_request(stopped.set)
                if stopped.wait(10):  # a run that only a stop ends early
                    raise RunStoppedError(text)
            return super().synthesize(text, voice, speed)

    SCRIPT.reset()
    backends = Backends(None, None, None, StoppingTTS())
    cancelled_unit, other_unit = TTSStage(backends), TTSStage(backends)
    reply = job()
    threading.Thread(target=lambda: (started.wait(5), reply.cancelled.set())).start()
    emitted, _ = run_stage(cancelled_unit, [m.Phrase(reply, "A long sentence that takes a while.")])
    assert emitted == [] and stopped.is_set()
    other = job()
    emitted, _ = run_stage(other_unit, [m.Phrase(other, "Next.")])  # the worker is free: no 10 s wait
    assert [e.transcript for e in emitted] == ["Next."]
    assert SCRIPT.tts_texts == ["Next."]  # the stopped run made nothing


def test_a_function_call_between_phrases_keeps_its_place(stage):
    reply = job()
    emitted, _ = run_stage(stage, [m.Phrase(reply, "Let me check."), m.FunctionCall(reply, "call_1", "get_weather", "{}"),
                                   m.JobEnd(reply, {})])
    kinds = [type(e).__name__ for e in emitted]
    assert kinds == ["ResponseAudio", "ResponseFunctionCall", "ResponseFinished"]
    assert emitted[1].call_id == "call_1" and emitted[1].name == "get_weather"

"""The LLM stage on the scripted LLM: it pauses after each phrase until TTS has spoken it, by
stopping and resuming a backend that resumes (llama.cpp) and by blocking one that does not; and
what it hands the TTS around a function call."""

import queue

import pytest

from pool.backends.base import Backends, LLMRequest
from pool.backends.scripted import SCRIPT, ScriptedLLM, ScriptedTTS
from pool.pipeline import messages as m
from pool.pipeline.stages.llm import LLMStage
from pool.testing import run_stage

REPLY = "Sure, I can help with that. Paris is the capital of France."


@pytest.fixture
def script():
    SCRIPT.reset()
    SCRIPT.reply = REPLY
    yield SCRIPT
    SCRIPT.reset()


def _job(max_tokens=50):
    request = LLMRequest([{"role": "system", "content": "s"}, {"role": "user", "content": "u"}], max_tokens)
    return m.ResponseJob("resp_1", request, "audio", "af_heart", 1.0, encoder=None)


def _run(llm, job, on_phrase=None):
    """The stage on ``job`` (``pool.testing.run_stage``), with a stand-in TTS that speaks each
    phrase at once; before it does, ``on_phrase(job, index)`` is called (it may cancel).
    Returns what the stage sent the TTS."""
    inbox = queue.Queue()
    phrases = []

    def tts(message):
        if isinstance(message, m.Phrase):
            if on_phrase:
                on_phrase(job, len(phrases))
            phrases.append(message)
            job.phrase_spoken()

    _emitted, sent = run_stage(LLMStage(Backends(None, None, llm, ScriptedTTS()), inbox), [job], inbox, tts)
    return sent


def test_a_resuming_llm_stops_at_each_phrase_and_resumes_once_it_is_spoken(script):
    job = _job()
    requests_at_phrase = []

    def on_phrase(job, index):
        requests_at_phrase.append(len(script.requests))  # the LLM has stopped at this phrase

    sent = _run(ScriptedLLM(), job, on_phrase)
    phrases = [s.text for s in sent if isinstance(s, m.Phrase)]
    assert phrases == ["Sure, I can help", " with that.", " Paris is the capital of France."]
    # One request per phrase: each ended at a phrase and the next began after it was spoken.
    assert requests_at_phrase == [1, 2, 3] and len(script.requests) == 3
    resumed = script.requests[1]
    # It stopped where the splitter knew the phrase had ended (one more word with its space).
    assert resumed.prefix == "Sure, I can help with that." and resumed.max_output_tokens == 50 - 6
    assert sent[-1].usage["output_tokens"] == len(REPLY.split()) and sent[-1].error is None


def test_a_cancel_during_the_pause_does_not_resume(script):
    job = _job()
    sent = _run(ScriptedLLM(), job, lambda job, index: job.cancelled.set())
    assert len(script.requests) == 1 and isinstance(sent[-1], m.JobEnd)


def test_max_output_tokens_counts_every_part(script):
    job = _job(max_tokens=8)
    sent = _run(ScriptedLLM(), job)
    assert "".join(s.text for s in sent if isinstance(s, m.Phrase)) == "Sure, I can help with that. Paris is"
    assert script.requests[1].max_output_tokens == 2 and sent[-1].usage["output_tokens"] == 8


class BlockingLLM(ScriptedLLM):
    resumes = False


def test_a_non_resuming_llm_is_paused_by_blocking_its_stream(script):
    job = _job()
    spoken_before = []

    def on_phrase(job, index):
        spoken_before.append(job.phrases_spoken)

    sent = _run(BlockingLLM(), job, on_phrase)
    assert "".join(s.text for s in sent if isinstance(s, m.Phrase)) == REPLY
    assert len(script.requests) == 1
    # Each phrase was written only after the one before it was spoken.
    assert spoken_before == list(range(len(spoken_before)))


class CallingLLM(ScriptedLLM):
    """Says a sentence, then calls a tool (as a model that announces what it does)."""

    resumes = False

    def generate(self, request, on_text, should_stop, on_function_call=None):
        for word in ["Let", " me", " check", " the", " weather."]:
            on_text(word)
        on_function_call("get_weather", '{"city": "Paris"}', "call_1")
        return {"input_tokens": 1, "output_tokens": 6}


def test_text_said_before_a_function_call_is_spoken_before_it(script):
    job = _job()
    sent = _run(CallingLLM(), job)
    kinds = [(type(s).__name__, getattr(s, "text", getattr(s, "name", None))) for s in sent]
    assert kinds == [("Phrase", "Let me check the weather."), ("FunctionCall", "get_weather"), ("JobEnd", None)]
    assert sent[1].call_id == "call_1" and sent[1].arguments == '{"city": "Paris"}'

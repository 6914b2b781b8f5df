"""The LLM stage on the scripted LLM: the first-phrase pause, by stopping and resuming for a
backend that resumes (llama.cpp) and by blocking for one that does not."""

import queue
import threading
from types import SimpleNamespace

import pytest

from pool import messages as m
from pool.backends.llm import LLMRequest
from pool.backends.scripted import SCRIPT, ScriptedLLM
from pool.stages import LLMStage

REPLY = "Sure, I can help with that. Paris is the capital of France."


class Ctx:
    closed = False

    def emit(self, event):
        pass


@pytest.fixture
def script():
    SCRIPT.reset()
    SCRIPT.reply = REPLY
    yield SCRIPT
    SCRIPT.reset()


def _job(max_tokens=50):
    request = LLMRequest([{"role": "system", "content": "s"}, {"role": "user", "content": "u"}], max_tokens)
    return m.ResponseJob("resp_1", request, "audio", "af_heart", 1.0, encoder=None)


def _run(llm, job, after_first_phrase=None):
    """Runs the stage in a thread; ``after_first_phrase(job)`` is called once TTS got the first
    phrase. Returns what the stage sent to TTS."""
    inbox = queue.Queue()
    stage = LLMStage(SimpleNamespace(llm=llm), inbox)
    thread = threading.Thread(target=stage.handle, args=(Ctx(), job))
    thread.start()
    sent = [inbox.get(timeout=5)[1]]
    if after_first_phrase:
        after_first_phrase(job)
    while not isinstance(sent[-1], m.JobEnd):
        sent.append(inbox.get(timeout=5)[1])
    thread.join(5)
    return sent


def test_a_resuming_llm_stops_at_the_first_phrase_and_resumes_after_its_audio(script):
    job = _job()
    seen = {}

    def first_phrase_spoken(job):
        seen["requests"] = len(script.requests)  # the LLM has stopped: one request so far
        job.first_audio.set()

    sent = _run(ScriptedLLM(), job, first_phrase_spoken)
    phrases = [s.text for s in sent if isinstance(s, m.Phrase)]
    assert "".join(phrases) == REPLY and phrases[0] == "Sure, I can help"
    assert seen["requests"] == 1 and len(script.requests) == 2
    resumed = script.requests[1]
    # It stopped where the splitter knew the phrase had ended (one more word with its space).
    assert resumed.prefix == "Sure, I can help with that." and resumed.max_output_tokens == 50 - 6
    assert sent[-1].usage["output_tokens"] == len(REPLY.split()) and sent[-1].error is None


def test_a_cancel_during_the_pause_does_not_resume(script):
    job = _job()
    sent = _run(ScriptedLLM(), job, lambda job: job.cancelled.set())
    assert len(script.requests) == 1 and isinstance(sent[-1], m.JobEnd)


def test_max_output_tokens_counts_both_parts(script):
    job = _job(max_tokens=8)
    sent = _run(ScriptedLLM(), job, lambda job: job.first_audio.set())
    assert "".join(s.text for s in sent if isinstance(s, m.Phrase)) == "Sure, I can help with that. Paris is"
    assert script.requests[1].max_output_tokens == 2 and sent[-1].usage["output_tokens"] == 8


class BlockingLLM(ScriptedLLM):
    resumes = False


def test_a_non_resuming_llm_is_paused_by_blocking_its_stream(script):
    job = _job()
    seen = {}

    def first_phrase_spoken(job):
        seen["requests"] = len(script.requests)
        job.first_audio.set()

    sent = _run(BlockingLLM(), job, first_phrase_spoken)
    assert "".join(s.text for s in sent if isinstance(s, m.Phrase)) == REPLY
    assert seen["requests"] == len(script.requests) == 1

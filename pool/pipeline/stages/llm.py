"""The LLM stage: a response's text, phrase by phrase to the TTS, paused while it is spoken."""

import time
from dataclasses import replace

from pool.backends.voices import voice_language
from pool.ids import new_id
from pool.pipeline import messages as m
from pool.pipeline.compute import queue_of
from pool.pipeline.phrases import PhraseSplitter
from pool.pipeline.spoken import SpokenText
from pool.pipeline.stages.base import Stage


class LLMStage(Stage):
    """Generates a response's text; speakable phrases go to TTS as soon as they are complete.

    After each phrase, generation pauses until TTS has spoken it (at most SPEECH_WAIT seconds):
    on a small CPU the two would otherwise share the cores, the first audio would come later and
    the listener would hear gaps, while the LLM writes far faster than speech is spoken. A
    backend that ``resumes`` (llama.cpp) is paused by stopping it and continuing from the text so
    far; any other by blocking its stream.

    A backend that resumes runs each part (up to the next phrase) in the process's deadline-first
    compute queue (``pool.pipeline.compute``), due at ``job.due()``; one that blocks its stream
    (transformers, an endpoint) runs on the stage's thread: it could not hold the queue while it
    waits for its own phrases to be spoken, and an endpoint computes elsewhere.

    A speculative reply (``job.speculative``) stops after its first phrase until the session
    adopts it (or cancels it): the rest is written only for a turn that is really answered.

    What is spoken passes ``SpokenText`` first (markdown, links, emoji and numbers made
    speakable, in the voice's language); text-only responses are sent as the LLM wrote them.
    """

    name = "llm"
    SPEECH_WAIT = 10.0

    def __init__(self, backends, tts_inbox):
        self._llm = backends.llm
        self._tts = backends.tts
        self._queue = queue_of(backends) if backends.llm.resumes else None
        self._tts_inbox = tts_inbox

    def _generate(self, job, request, *callbacks):
        if self._queue is None:
            return self._llm.generate(request, *callbacks)
        return self._queue.result(self._queue.submit(job.due, self._llm.generate, request, *callbacks))

    def handle(self, ctx, job):
        if job.cancelled.is_set():
            self._tts_inbox.put((ctx, m.JobEnd(job, {})))
            return
        splitter = PhraseSplitter()
        spoken = SpokenText(voice_language(self._tts.resolve_voice(job.voice)))
        job.marks.reach("llm_start")
        started = job.marks.llm_start
        resumes = self._llm.resumes
        said = []  # the reply's text so far
        queued = 0  # phrases sent to TTS
        pause = False  # a resuming backend stops after each phrase

        def ended():
            return job.cancelled.is_set() or ctx.closed

        def on_text(text):
            nonlocal pause, queued
            if job.marks.reach("llm_first_text"):
                text = text.lstrip()
            said.append(text)
            if job.modality == "text":
                ctx.emit(m.ResponseText(job.response_id, text))
                return
            for phrase in splitter.push(spoken.push(text)):
                job.marks.reach("llm_first_phrase")
                self._tts_inbox.put((ctx, m.Phrase(job, phrase)))
                queued += 1
                if resumes:
                    pause = True
                else:
                    job.wait_spoken(queued, self.SPEECH_WAIT, ended)
                    job.wait_adopted(ended)  # a speculative reply makes its first phrase only

        def should_stop():
            return pause or ended()

        def on_function_call(name, arguments, call_id=None):
            rest = "".join(splitter.push(spoken.flush())) + splitter.flush()  # said before the call: spoken before it
            if rest.strip() and job.modality == "audio":
                self._tts_inbox.put((ctx, m.Phrase(job, rest)))
            self._tts_inbox.put((ctx, m.FunctionCall(job, call_id or new_id("call"), name, arguments)))

        error, usage = None, {}
        request = job.request
        try:
            while True:
                part = self._generate(job, request, on_text, should_stop, on_function_call)
                # The input is the prompt of the first part that read one: a part resumed after
                # another's words also reads those words, which are output.
                if not usage.get("input_tokens"):
                    usage["input_tokens"] = part.get("input_tokens", 0)
                    usage["cached_tokens"] = part.get("cached_tokens", 0)
                usage["output_tokens"] = usage.get("output_tokens", 0) + part.get("output_tokens", 0)
                if not pause:  # finished, or cancelled
                    break
                job.wait_spoken(queued, self.SPEECH_WAIT, ended)  # stopped at a phrase: resume once it is spoken
                job.wait_adopted(ended)  # a speculative reply makes its first phrase only, then waits
                pause = False
                left = job.request.max_output_tokens - usage["output_tokens"]
                if left <= 0 or ended():
                    break
                request = replace(job.request, prefix="".join(said), max_output_tokens=left)
        except Exception as exc:  # noqa: BLE001 - a model failure fails the response, not the thread
            error = f"{type(exc).__name__}: {exc}"
        rest = "".join(splitter.push(spoken.flush())) + splitter.flush()
        if rest.strip() and job.modality == "audio":
            job.marks.reach("llm_first_phrase")
            self._tts_inbox.put((ctx, m.Phrase(job, rest)))
        usage["llm_seconds"] = time.perf_counter() - started
        self._tts_inbox.put((ctx, m.JobEnd(job, usage, error)))

"""The four stages of a unit: what each thread does with one message.

A stage handles ``(ctx, message)`` pairs from its inbox and passes work to the next stage. Per-
session values live on the stage and are reset by ``end_session()`` when SESSION_END passes.
The loop around ``handle`` (skipping closed sessions, forwarding SESSION_END, surviving errors)
is the unit's (``pool.pipeline.unit``), not the stages'.
"""

import base64
import binascii
import collections
import re
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import replace

import numpy as np

from pool import metrics
from pool.backends.base import SPEECH_RATE, TTS_RATE
from pool.backends.vad import WINDOW_SAMPLES
from pool.ids import new_id
from pool.pipeline import messages as m
from pool.pipeline.pacing import pace_of

MIN_COMMIT_MS = 100  # input_audio_buffer.commit needs at least this much audio (OpenAI's rule)
MAX_BUFFER_SECONDS = 15 * 60  # manual-turn input buffer bound
DELTA_MS = 200  # audio per response.output_audio.delta
NEG_THRESHOLD_GAP = 0.15  # speech ends below threshold - 0.15 (Silero's get_speech_timestamps)
# Voiced audio (ms) before a candidate counts as speech: a breath or a click is not a turn and
# does not interrupt. Silero's get_speech_timestamps uses 250 ms; shorter keeps a quick "No.".
MIN_SPEECH_MS = 160
# Speculative transcription: at this much silence the speech so far is transcribed, so a turn that
# ends at this pause has its transcript ready (or under way) when the silence commits it. With
# an end-of-turn model it starts halfway to the model's check, which may commit at once.
SPECULATE_MS = 200


class Stage:
    """One step of a unit's chain, run by its own thread (``pool.pipeline.unit``) on its own inbox.

    ``handle(ctx, msg)`` does the work of one message of session ``ctx``; ``end_session()`` is
    called when SESSION_END reaches the stage (forget the session); ``stop()`` when the unit's
    threads are replaced or stopped (release what the stage owns). ``name`` names its inbox and
    thread.
    """

    name = None

    def handle(self, ctx, msg):
        raise NotImplementedError

    def end_session(self):
        pass

    def stop(self):
        pass


def _ms(samples):
    return int(samples * 1000 // SPEECH_RATE)


class VADStage(Stage):
    """Owns the input audio buffer: decodes appends, runs Silero VAD, detects turns, commits."""

    name = "vad"

    def __init__(self, backends, stt_inbox):
        self._stream = backends.vad.new_stream()
        self._turn = backends.turn
        self._stt_inbox = stt_inbox
        self.busy = False
        self.input_lag_max = 0.0  # seconds from an append's arrival to its VAD, this session
        self.end_session()

    def end_session(self):
        self._stream.reset()
        self.decoder = None
        self.turn_detection = None
        self.language = None
        self._pending = np.zeros(0, dtype=np.float32)  # decoded, not yet a whole window
        self._buffer = []  # windows since the last commit (manual turns, or during speech)
        self._prefix = collections.deque()  # recent windows before speech (prefix padding)
        self._samples_seen = 0
        self._speech_item = None
        self._silence = 0  # samples of silence since the last speech window
        self._voiced, self._announced, self._speech_start = 0, False, 0  # the current speech
        self._asked = False  # the end-of-turn model was asked about the current pause
        self._speculated = None  # samples of the speech transcribed at the current pause
        self._peek = None  # (voiced samples, prompt) at which to peek at the current speech
        self._last = None  # (item id, audio, voiced samples) of the last speech committed
        self.input_lag_max = 0.0

    def handle(self, ctx, msg):
        if isinstance(msg, m.ConfigureInput):
            self.decoder, self.language = msg.decoder, msg.language
            self.turn_detection = msg.turn_detection
            if msg.turn_detection is None and self._speech_item:
                self._speech_item = None  # switching to manual turns keeps the buffered audio
        elif isinstance(msg, m.AppendInput):
            self.busy = True  # read by the protocol: a reply waits until all input is heard
            try:
                self._append(ctx, msg)
            finally:
                self.busy = False
        elif isinstance(msg, m.CommitInput):
            self._commit(ctx, msg.event_id, self._speech_item or new_id("item"))
        elif isinstance(msg, m.PeekInput):
            self._peek_request(ctx, msg)
        elif isinstance(msg, m.ClearInput):
            if self._peek is not None:
                ctx.emit(m.SpeechPeeked(self._speech_item, "", 0))
            self._buffer, self._pending, self._speech_item, self._peek = [], self._pending[:0], None, None
            self._prefix.clear()
            ctx.emit(m.InputCleared(msg.event_id))

    def _append(self, ctx, msg):
        try:
            data = base64.b64decode(msg.audio_b64, validate=True)
        except (binascii.Error, ValueError) as exc:
            ctx.emit(m.InputRejected("invalid_base64", f"'audio' is not valid base64: {exc}.", msg.event_id, "audio"))
            return
        try:
            samples = self.decoder.decode(data)
        except ValueError as exc:
            ctx.emit(m.InputRejected("invalid_audio", str(exc), msg.event_id, "audio"))
            return
        buffered = len(self._buffer) * WINDOW_SAMPLES + len(self._pending)
        if buffered + len(samples) > MAX_BUFFER_SECONDS * SPEECH_RATE:
            ctx.emit(m.InputRejected(
                "input_audio_buffer_full",
                f"The input audio buffer holds at most {MAX_BUFFER_SECONDS} s; commit or clear it.",
                msg.event_id))
            return
        if ctx.recording is not None:
            ctx.recording.user(samples)
        audio = np.concatenate([self._pending, samples]) if len(self._pending) else samples
        whole = len(audio) - len(audio) % WINDOW_SAMPLES
        for start in range(0, whole, WINDOW_SAMPLES):
            self._window(ctx, audio[start:start + WINDOW_SAMPLES])
        self._pending = audio[whole:].copy()
        self.input_lag_max = max(self.input_lag_max, time.monotonic() - msg.received_at)

    def _window(self, ctx, window):
        probability = self._stream.probability(window)
        self._samples_seen += WINDOW_SAMPLES
        td = self.turn_detection
        if td is None:
            self._buffer.append(window)
            return
        voiced = probability >= td.threshold
        if self._speech_item is None:
            self._prefix.append(window)
            while len(self._prefix) * WINDOW_SAMPLES > td.prefix_padding_ms * SPEECH_RATE // 1000 + WINDOW_SAMPLES:
                self._prefix.popleft()
            if voiced:  # a candidate: speech once it has MIN_SPEECH_MS of voiced windows
                self._speech_item = new_id("item")
                self._buffer = list(self._prefix)
                self._prefix.clear()
                self._silence, self._voiced, self._announced = 0, 1, False
                self._speech_start = self._samples_seen - len(self._buffer) * WINDOW_SAMPLES
            return
        self._buffer.append(window)
        self._voiced += voiced
        if not self._announced and self._voiced * WINDOW_SAMPLES * 1000 >= MIN_SPEECH_MS * SPEECH_RATE:
            self._announced = True
            ctx.emit(m.SpeechStarted(self._speech_item, _ms(max(self._speech_start, 0))))
        if probability < max(td.threshold - NEG_THRESHOLD_GAP, 0.01):
            self._silence += WINDOW_SAMPLES
        else:
            self._silence, self._asked, self._speculated = 0, False, None
        if not self._announced:
            if self._silence * 1000 >= MIN_SPEECH_MS * SPEECH_RATE:
                self._drop_candidate()
            return
        self._maybe_peek(ctx)
        self._maybe_speculate(ctx, td)
        if self._silence * 1000 >= td.silence_ms * SPEECH_RATE or self._finished_early(td):
            item_id = self._speech_item
            ctx.emit(m.SpeechStopped(item_id, _ms(self._samples_seen - self._silence)))
            self._commit(ctx, None, item_id)

    def _drop_candidate(self):
        """A click or a breath: too little voiced audio to be speech. Its windows become the
        prefix padding of the next speech."""
        self._prefix = collections.deque(self._buffer)
        self._buffer, self._speech_item = [], None

    def _maybe_speculate(self, ctx, td):
        """Early in a pause (SPECULATE_MS, shorter than the turn's silence), transcribe the
        speech so far: the STT keeps the result for the commit, which reuses it when nothing but
        silence came between."""
        at_ms = min(SPECULATE_MS, td.check_ms // 2) if td.check_ms else SPECULATE_MS
        if (self._speculated is not None or td.silence_ms <= at_ms
                or self._silence * 1000 < at_ms * SPEECH_RATE):
            return
        audio = np.concatenate(self._buffer)
        self._speculated = len(audio)
        self._stt_inbox.put((ctx, m.Speculate(self._speech_item, audio, self.language)))

    def _finished_early(self, td):
        """semantic_vad: at the first ``check_ms`` of a pause, the end-of-turn model decides."""
        if (td.check_ms is None or self._turn is None or self._asked
                or self._silence * 1000 < td.check_ms * SPEECH_RATE):
            return False
        self._asked = True
        return self._turn.is_complete(np.concatenate(self._buffer))

    def _peek_request(self, ctx, msg):
        """Peek at the current speech once it is voiced enough; at the last item, which ended
        before the request came (the input was ahead of the protocol), as a whole."""
        after = msg.after_ms * SPEECH_RATE // 1000
        if msg.item_id == self._speech_item:
            self._peek = (after, msg.prompt)
            self._maybe_peek(ctx)
        elif self._last is not None and msg.item_id == self._last[0] and self._last[2] >= after:
            item_id, audio, voiced = self._last
            self._stt_inbox.put((ctx, m.Peek(item_id, audio, self.language, msg.prompt, _ms(voiced))))
        else:  # too short, or long gone: no words to hear
            ctx.emit(m.SpeechPeeked(msg.item_id, "", 0))

    def _maybe_peek(self, ctx):
        voiced = self._voiced * WINDOW_SAMPLES
        if self._peek is not None and voiced >= self._peek[0]:
            audio = np.concatenate(self._buffer)
            self._stt_inbox.put((ctx, m.Peek(self._speech_item, audio, self.language, self._peek[1], _ms(voiced))))
            self._peek = None

    def _commit(self, ctx, event_id, item_id):
        parts = self._buffer + ([self._pending] if len(self._pending) else [])
        audio = np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)
        if _ms(len(audio)) < MIN_COMMIT_MS:
            ctx.emit(m.InputRejected(
                "input_audio_buffer_commit_empty",
                f"Error committing input audio buffer: buffer too small. Expected at least "
                f"{MIN_COMMIT_MS}ms of audio, but buffer only has {_ms(len(audio))}ms of audio.",
                event_id))
            return
        if self._peek is not None:  # it ended before it was voiced enough to be peeked at
            ctx.emit(m.SpeechPeeked(item_id, "", _ms(self._voiced * WINDOW_SAMPLES)))
        # Kept for a peek asked for after the speech ended (server VAD turns only: a manual
        # buffer may hold minutes of audio).
        self._last = (item_id, audio, self._voiced * WINDOW_SAMPLES) if self.turn_detection else None
        self._buffer, self._pending, self._speech_item = [], self._pending[:0], None
        self._prefix.clear()
        speculated, self._speculated = self._speculated, None
        self._peek, self._asked, self._voiced = None, False, 0
        ctx.emit(m.InputCommitted(item_id, _ms(len(audio)), event_id))
        self._stt_inbox.put((ctx, m.Transcribe(item_id, audio, self.language, speculated)))


class STTStage(Stage):
    """Transcribes committed items (every item gets Transcribed or TranscriptionFailed), peeks
    at speech still in progress (SpeechPeeked, or nothing when the peek fails), and transcribes
    speech at its first pause ahead of its commit (Speculate; kept, used by the commit or
    dropped)."""

    name = "stt"

    def __init__(self, backends):
        self._stt = backends.stt
        self._speculation = None  # (item id, samples, transcript, seconds) of the last Speculate

    def end_session(self):
        self._speculation = None

    def _transcribe(self, msg):
        """``(transcript, language)`` of ``msg.audio``. An STT backend without
        ``transcribe_detect`` (one written before it) hears the session's language, or None."""
        detect = getattr(self._stt, "transcribe_detect", None)
        if detect is None:
            return self._stt.transcribe(msg.audio, msg.language), msg.language
        return detect(msg.audio, msg.language)

    def handle(self, ctx, msg):
        if isinstance(msg, m.Peek):
            try:
                transcript = self._stt.transcribe(msg.audio, msg.language, prompt=msg.prompt)
            except Exception:  # noqa: BLE001 - a failed peek hears no words; the item goes on
                transcript = ""
            ctx.emit(m.SpeechPeeked(msg.item_id, transcript, msg.voiced_ms))
            return
        speculation, self._speculation = self._speculation, None
        if speculation and isinstance(msg, m.Transcribe) and speculation[:2] == (msg.item_id, msg.speculated_samples):
            metrics.SPECULATIONS.labels(metrics.PROCESS, "used").inc()
            ctx.emit(m.Transcribed(msg.item_id, speculation[2], len(msg.audio) / SPEECH_RATE, speculation[3],
                                   speculative=True, language=speculation[4]))
            return
        if speculation:  # the user went on speaking after the pause: the work is thrown away
            metrics.SPECULATIONS.labels(metrics.PROCESS, "discarded").inc()
        if isinstance(msg, m.Speculate):
            started = time.perf_counter()
            try:
                transcript, language = self._transcribe(msg)
            except Exception:  # noqa: BLE001 - the commit transcribes again and reports it
                return
            self._speculation = (msg.item_id, len(msg.audio), transcript, time.perf_counter() - started, language)
            return
        started = time.perf_counter()
        try:
            transcript, language = self._transcribe(msg)
        except Exception as exc:  # noqa: BLE001 - any model failure fails the item, not the thread
            ctx.emit(m.TranscriptionFailed(msg.item_id, f"{type(exc).__name__}: {exc}"))
            return
        ctx.emit(m.Transcribed(msg.item_id, transcript, len(msg.audio) / SPEECH_RATE,
                               time.perf_counter() - started, language=language))


class PhraseSplitter:
    """Cuts streamed LLM text into speakable phrases, the first ones as early as possible.

    A phrase ends at ``.!?;:`` followed by whitespace, at a comma once it has COMMA_WORDS words,
    or at MAX_WORDS words. Both limits grow with the phrase's position: the first phrase is a
    few words (its synthesis is the wait before the first audio), the second a little longer
    (it must be ready before the first has been heard), later ones whole sentences (better
    prosody). Concatenating every phrase returned gives back exactly the text pushed in.
    """

    COMMA_WORDS = (2, 4, 8)  # by phrase position; the last applies to every later phrase
    MAX_WORDS = (4, 8, 30)
    _END = re.compile(r"[.!?;:]+[\"')\]]*\s")
    _COMMA = re.compile(r",\s")
    _WORD = re.compile(r"\S+\s")

    def __init__(self):
        self._text = ""
        self._count = 0  # phrases returned so far

    def push(self, text):
        """Add streamed text; returns the phrases it completed (possibly none)."""
        self._text += text
        phrases = []
        while (cut := self._cut()) is not None:
            phrases.append(self._text[:cut])
            self._text = self._text[cut:]
            self._count += 1
        return phrases

    def flush(self):
        """The text not yet returned (the last phrase)."""
        rest, self._text = self._text, ""
        return rest

    def _cut(self):
        match = self._END.search(self._text)
        if match:
            return match.end() - 1
        position = min(self._count, len(self.MAX_WORDS) - 1)
        for comma in self._COMMA.finditer(self._text):
            if len(self._text[:comma.start()].split()) >= self.COMMA_WORDS[position]:
                return comma.end() - 1
        max_words = self.MAX_WORDS[position]
        words = list(self._WORD.finditer(self._text))
        if len(words) > max_words:  # one more word seen: the cut point is a real word boundary
            return words[max_words - 1].end() - 1
        return None


class LLMStage(Stage):
    """Generates a response's text; speakable phrases go to TTS as soon as they are complete.

    After each phrase, generation pauses until TTS has spoken it (at most SPEECH_WAIT seconds):
    on a small CPU the two would otherwise share the cores, the first audio would come later and
    the listener would hear gaps, while the LLM writes far faster than speech is spoken. A
    backend that ``resumes`` (llama.cpp) is paused by stopping it and continuing from the text so
    far; any other by blocking its stream.
    """

    name = "llm"
    SPEECH_WAIT = 10.0

    def __init__(self, backends, tts_inbox):
        self._llm = backends.llm
        self._tts_inbox = tts_inbox

    def handle(self, ctx, job):
        if job.cancelled.is_set():
            self._tts_inbox.put((ctx, m.JobEnd(job, {})))
            return
        splitter = PhraseSplitter()
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
            for phrase in splitter.push(text):
                job.marks.reach("llm_first_phrase")
                self._tts_inbox.put((ctx, m.Phrase(job, phrase)))
                queued += 1
                if resumes:
                    pause = True
                else:
                    job.wait_spoken(queued, self.SPEECH_WAIT, ended)

        def should_stop():
            return pause or ended()

        def on_function_call(name, arguments, call_id=None):
            rest = splitter.flush()  # text said before the call is spoken before it
            if rest.strip() and job.modality == "audio":
                self._tts_inbox.put((ctx, m.Phrase(job, rest)))
            self._tts_inbox.put((ctx, m.FunctionCall(job, call_id or new_id("call"), name, arguments)))

        error, usage = None, {}
        request = job.request
        try:
            while True:
                part = self._llm.generate(request, on_text, should_stop, on_function_call)
                usage = {"input_tokens": usage.get("input_tokens", part.get("input_tokens", 0)),
                         "output_tokens": usage.get("output_tokens", 0) + part.get("output_tokens", 0)}
                if not pause:  # finished, or cancelled
                    break
                job.wait_spoken(queued, self.SPEECH_WAIT, ended)  # stopped at a phrase: resume once it is spoken
                pause = False
                left = job.request.max_output_tokens - usage["output_tokens"]
                if left <= 0 or ended():
                    break
                request = replace(job.request, prefix="".join(said), max_output_tokens=left)
        except Exception as exc:  # noqa: BLE001 - a model failure fails the response, not the thread
            error = f"{type(exc).__name__}: {exc}"
        rest = splitter.flush()
        if rest.strip() and job.modality == "audio":
            job.marks.reach("llm_first_phrase")
            self._tts_inbox.put((ctx, m.Phrase(job, rest)))
        usage["llm_seconds"] = time.perf_counter() - started
        self._tts_inbox.put((ctx, m.JobEnd(job, usage, error)))


class TTSStage(Stage):
    """Speaks phrases and sends their audio in DELTA_MS chunks; passes function calls on and
    closes each response, in the order the LLM produced them.

    A phrase longer than the client's unplayed audio lasts is spoken in pieces
    (``pool.pipeline.pacing``), so the listener hears no gap while the next piece is synthesized.

    Synthesis of one phrase cannot be interrupted (one ONNX run, up to ~1.5 s), so it runs on the
    stage's own worker thread while the stage waits, watching for cancellation: a cancelled or
    closed session frees the stage (and so the drain) within CANCEL_POLL_SECONDS; the worker
    finishes the stale phrase and drops it.
    """

    name = "tts"
    CANCEL_POLL_SECONDS = 0.02

    def __init__(self, backends, thread_name="tts-worker"):
        self._tts = backends.tts
        self._pace = pace_of(backends.tts)
        self._worker = ThreadPoolExecutor(1, thread_name_prefix=thread_name)

    def stop(self):
        self._worker.shutdown(wait=False, cancel_futures=True)

    def _synthesize(self, ctx, job, text):
        """float32 @ 24 kHz, or None when the response was cancelled or the session closed."""
        future = self._worker.submit(self._tts.synthesize, text, job.voice, job.speed)
        while True:
            try:
                return future.result(timeout=self.CANCEL_POLL_SECONDS)
            except FutureTimeout:
                if job.cancelled.is_set() or ctx.closed:
                    return None

    def handle(self, ctx, msg):
        job = msg.job
        if isinstance(msg, m.FunctionCall):
            ctx.emit(m.ResponseFunctionCall(job.response_id, msg.call_id, msg.name, msg.arguments))
            return
        if isinstance(msg, m.JobEnd):
            if not job.cancelled.is_set():
                self._send(ctx, job, "", job.encoder.encode(np.zeros(0, np.float32), last=True), 0.0, 0.0)
            ctx.emit(m.ResponseFinished(job.response_id, msg.usage, msg.error))
            return
        if job.cancelled.is_set():
            return
        rest = msg.text
        if not rest.strip():
            self._send(ctx, job, rest, b"", 0.0, 0.0)
        while rest.strip() and not job.cancelled.is_set():
            piece, rest = self._pace.next_piece(rest, self._lead(job))
            if not self._speak(ctx, job, piece):
                return
        job.phrase_spoken()

    @staticmethod
    def _lead(job):
        """Seconds of the reply's audio the client holds and has not played (played in real
        time from the first audio), or None before the first audio."""
        first = job.marks.tts_first_audio
        return None if first is None else job.audio_seconds - (time.perf_counter() - first)

    def _speak(self, ctx, job, text):
        """Synthesize ``text`` and send it; False when the response or session ended meanwhile."""
        started = time.perf_counter()
        samples = self._synthesize(ctx, job, text.strip())
        if samples is None:
            return False
        seconds = time.perf_counter() - started
        self._pace.observe(len(text.split()), len(samples) / TTS_RATE, seconds)
        if job.marks.reach("tts_first_audio"):
            job.marks.tts_first_compute_s = seconds
            job.marks.tts_first_phrase_audio_s = len(samples) / TTS_RATE
        job.audio_seconds += len(samples) / TTS_RATE
        if ctx.recording is not None:
            ctx.recording.write_sent()  # what the session forwarded of the earlier phrases
        self._send(ctx, job, text, job.encoder.encode(samples), len(samples) * 1000 / TTS_RATE, seconds,
                   samples if ctx.recording is not None else None)
        return True

    @staticmethod
    def _send(ctx, job, transcript, wire, audio_ms, tts_seconds, samples=None):
        if not wire and not transcript:
            return
        step = job.encoder.bytes_per_second * DELTA_MS // 1000
        chunks = [base64.b64encode(wire[i:i + step]).decode("ascii") for i in range(0, len(wire), step)]
        ctx.emit(m.ResponseAudio(job.response_id, transcript, chunks, audio_ms, tts_seconds, samples))

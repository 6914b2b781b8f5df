"""The STT stage: transcripts of committed items, peeks at speech in progress, speculation."""

import threading
import time
from dataclasses import dataclass

from pool import metrics
from pool.backends.base import SPEECH_RATE
from pool.pipeline import messages as m
from pool.pipeline.compute import queue_of
from pool.pipeline.stages.base import Stage


@dataclass(eq=False)
class _Speculation:
    """A Speculate in the compute queue or done: ``samples`` of item ``item_id`` heard,
    ``due``: its deadline (``time.perf_counter()`` seconds; now, once its commit waits for it),
    ``future``: its ``((transcript, language), seconds)``."""

    item_id: str
    samples: int
    due: float
    future: object = None
    used: bool = False  # a commit took it, and waits for it


class STTStage(Stage):
    """Transcribes committed items (every item gets Transcribed or TranscriptionFailed), peeks
    at speech still in progress (SpeechPeeked, or nothing when the peek fails), and transcribes
    speech at its first pause ahead of its commit (Speculate; kept, used by the commit or
    dropped).

    Transcriptions of turns run in the process's deadline-first compute queue
    (``pool.pipeline.compute``): a commit's is due now, a speculation's when its commit could
    come (``Speculate.commit_in_ms``: the silence timer or the end-of-turn check).
    A peek runs at once, beside the queue. The stage waits for a commit's transcript, never for a
    speculation's: a speculation behind other units' synthesis must not hold up a peek or
    another item's commit (a peek behind one waited 2.0-2.2 s in an e2e run). Its Speculated is
    emitted from the compute worker when it is done, unless the commit took it first.
    """

    name = "stt"

    def __init__(self, backends):
        self._stt = backends.stt
        self._queue = queue_of(backends)
        self._speculation = None  # the last Speculate's _Speculation, until a commit takes it
        self._lock = threading.Lock()  # orders a speculation's Speculated before its commit's Transcribed

    def end_session(self):
        self._drop(self._take())

    def stop(self):
        self.end_session()

    def _submit(self, due, msg):
        """The Future of ``((transcript, language), compute seconds)`` of ``msg.audio`` with the
        session's prompt, run in the compute queue, due at ``due`` (a perf_counter time or a
        callable returning one), batched with other units' transcriptions waiting with it where
        the backend has ``transcribe_batch``. An STT backend without ``transcribe_detect`` (one
        written before it) hears the session's language, or None."""
        detect = getattr(self._stt, "transcribe_detect", None)
        batch = getattr(self._stt, "transcribe_batch", None)
        if detect is None:
            def detect(audio, language, prompt):
                return self._stt.transcribe(audio, language, prompt=prompt), language
            batch = None
        return self._queue.submit(due, detect, msg.audio, msg.language, msg.prompt, batch=batch)

    def _result(self, future):
        """``((transcript, language), compute seconds)`` of a submitted transcription. Raises
        what the model raised (CancelledError if it was dropped)."""
        return self._queue.result(future), future.compute_seconds

    def _take(self, commit=None):
        """The pending speculation, no longer pending: its Speculated is not emitted after this.
        If it is the one ``commit`` (a Transcribe) can use, it is due now: the commit waits for it."""
        with self._lock:
            speculation, self._speculation = self._speculation, None
            if speculation and commit and (speculation.item_id, speculation.samples) == (
                    commit.item_id, commit.speculated_samples):
                speculation.due = time.perf_counter()
                speculation.used = True
        return speculation

    @staticmethod
    def _drop(speculation):
        """A speculation of no use: out of the queue at once if it has not started."""
        if speculation is not None:
            speculation.future.cancel()
            metrics.SPECULATIONS.labels(metrics.PROCESS, "discarded").inc()

    def _speculated(self, ctx, speculation, future):
        """A speculation is done (on the compute worker): the session is told, unless a commit,
        another speculation or the session's end came first."""
        if future.cancelled() or future.exception() is not None:
            return  # a failed one: the commit transcribes again and reports it
        transcript, language = future.result()
        with self._lock:
            if self._speculation is speculation and transcript:
                ctx.emit(m.Speculated(speculation.item_id, transcript, language, speculation.samples))

    def _speculate(self, ctx, msg):
        speculation = _Speculation(msg.item_id, len(msg.audio), time.perf_counter() + msg.commit_in_ms / 1000)
        speculation.future = self._submit(lambda: speculation.due, msg)
        with self._lock:
            self._speculation = speculation
        # Added after it is pending: a speculation done at once is announced from here.
        speculation.future.add_done_callback(lambda future: self._speculated(ctx, speculation, future))

    def handle(self, ctx, msg):
        if isinstance(msg, m.Peek):
            hear = getattr(self._stt, "hear", None)  # an STT written before it: words only
            started = time.monotonic()
            try:
                # Not queued: a peek decides whether a playing reply stops, and would wait behind
                # the synthesis running (up to ~1.5 s; the queue does not preempt).
                if hear is None:
                    transcript, likeness = self._stt.transcribe(msg.audio, msg.language, prompt=msg.prompt), None
                else:
                    transcript, likeness = hear(msg.audio, msg.language, prompt=msg.prompt, phrases=msg.phrases)
            except Exception:  # noqa: BLE001 - a failed peek hears no words; the item goes on
                transcript, likeness = "", None
            timing = (msg.input_lag_ms, round((started - msg.asked_at) * 1000), round((time.monotonic() - started) * 1000))
            ctx.emit(m.SpeechPeeked(msg.item_id, transcript, msg.voiced_ms, likeness, msg.final, timing))
            return
        speculation = self._take(msg if isinstance(msg, m.Transcribe) else None)
        if speculation and speculation.used:
            try:
                (transcript, language), seconds = self._result(speculation.future)
            except Exception:  # noqa: BLE001 - transcribed again below; a real failure shows there
                metrics.SPECULATIONS.labels(metrics.PROCESS, "discarded").inc()
            else:
                metrics.SPECULATIONS.labels(metrics.PROCESS, "used").inc()
                ctx.emit(m.Transcribed(msg.item_id, transcript, len(msg.audio) / SPEECH_RATE, seconds,
                                       speculative=True, language=language))
                return
        else:  # the user went on speaking after the pause (or a new pause): the work is thrown away
            self._drop(speculation)
        if isinstance(msg, m.Speculate):
            self._speculate(ctx, msg)
            return
        try:
            (transcript, language), seconds = self._result(self._submit(time.perf_counter(), msg))
        except Exception as exc:  # noqa: BLE001 - any model failure fails the item, not the thread
            ctx.emit(m.TranscriptionFailed(msg.item_id, f"{type(exc).__name__}: {exc}"))
            return
        ctx.emit(m.Transcribed(msg.item_id, transcript, len(msg.audio) / SPEECH_RATE, seconds, language=language))

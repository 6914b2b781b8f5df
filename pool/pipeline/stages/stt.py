"""The STT stage: transcripts of committed items, peeks at speech in progress, speculation."""

import time

from pool import metrics
from pool.backends.base import SPEECH_RATE
from pool.conf import get_config
from pool.pipeline import messages as m
from pool.pipeline.compute import queue_of
from pool.pipeline.stages.base import Stage

# A speculation (the speech at its first pause) is of use if done by the commit: at the default
# server_vad, 500 ms of silence against the 200 ms it starts at (stages.vad.SPECULATE_MS).
SPECULATION_SLACK_S = 0.3


class STTStage(Stage):
    """Transcribes committed items (every item gets Transcribed or TranscriptionFailed), peeks
    at speech still in progress (SpeechPeeked, or nothing when the peek fails), and transcribes
    speech at its first pause ahead of its commit (Speculate; kept, used by the commit or
    dropped).

    Transcriptions of turns run in the process's deadline-first compute queue
    (``pool.pipeline.compute``): a commit's is due now, a speculation's SPECULATION_SLACK_S later.
    A peek runs at once, beside the queue.
    """

    name = "stt"

    def __init__(self, backends):
        self._stt = backends.stt
        self._queue = queue_of(backends, get_config()["COMPUTE_RUNS_AT_ONCE"])
        self._speculation = None  # (item id, samples, transcript, seconds) of the last Speculate

    def end_session(self):
        self._speculation = None

    def _run(self, due_in, fn, *args, **kwargs):
        """``(fn(*args, **kwargs), its compute seconds)``, run in the compute queue, due
        ``due_in`` seconds from now. Raises what ``fn`` raises."""
        future = self._queue.submit(time.perf_counter() + due_in, fn, *args, **kwargs)
        return self._queue.result(future), future.compute_seconds

    def _transcribe(self, msg, due_in=0.0):
        """``((transcript, language), compute seconds)`` of ``msg.audio``, with the session's
        prompt. An STT backend without ``transcribe_detect`` (one written before it) hears the
        session's language, or None."""
        detect = getattr(self._stt, "transcribe_detect", None)
        if detect is None:
            transcript, seconds = self._run(due_in, self._stt.transcribe, msg.audio, msg.language, prompt=msg.prompt)
            return (transcript, msg.language), seconds
        return self._run(due_in, detect, msg.audio, msg.language, prompt=msg.prompt)

    def handle(self, ctx, msg):
        if isinstance(msg, m.Peek):
            hear = getattr(self._stt, "hear", None)  # an STT written before it: words only
            try:
                # Not queued: a peek decides whether a playing reply stops, and would wait behind
                # the synthesis running (up to ~1.5 s; the queue does not preempt).
                if hear is None:
                    transcript, likeness = self._stt.transcribe(msg.audio, msg.language, prompt=msg.prompt), None
                else:
                    transcript, likeness = hear(msg.audio, msg.language, prompt=msg.prompt, phrases=msg.phrases)
            except Exception:  # noqa: BLE001 - a failed peek hears no words; the item goes on
                transcript, likeness = "", None
            ctx.emit(m.SpeechPeeked(msg.item_id, transcript, msg.voiced_ms, likeness, msg.final))
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
            try:
                (transcript, language), seconds = self._transcribe(msg, SPECULATION_SLACK_S)
            except Exception:  # noqa: BLE001 - the commit transcribes again and reports it
                return
            self._speculation = (msg.item_id, len(msg.audio), transcript, seconds, language)
            if transcript:
                ctx.emit(m.Speculated(msg.item_id, transcript, language, len(msg.audio)))  # a reply may start on it
            return
        try:
            (transcript, language), seconds = self._transcribe(msg)
        except Exception as exc:  # noqa: BLE001 - any model failure fails the item, not the thread
            ctx.emit(m.TranscriptionFailed(msg.item_id, f"{type(exc).__name__}: {exc}"))
            return
        ctx.emit(m.Transcribed(msg.item_id, transcript, len(msg.audio) / SPEECH_RATE, seconds, language=language))

"""The STT stage: transcripts of committed items, peeks at speech in progress, speculation."""

import time

from pool import metrics
from pool.backends.base import SPEECH_RATE
from pool.pipeline import messages as m
from pool.pipeline.stages.base import Stage


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
        """``(transcript, language)`` of ``msg.audio``, with the session's prompt. An STT backend
        without ``transcribe_detect`` (one written before it) hears the session's language, or None."""
        detect = getattr(self._stt, "transcribe_detect", None)
        if detect is None:
            return self._stt.transcribe(msg.audio, msg.language, prompt=msg.prompt), msg.language
        return detect(msg.audio, msg.language, prompt=msg.prompt)

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

"""The timeline of one response: when each step of the turn it answers happened, and its cost.

``Marks`` are ``time.perf_counter()`` values, each set once where it happens: the session (end of
speech, commit, transcript, response created, first audio sent) and the stages (LLM start, first
text, first phrase, first TTS audio). ``TurnTimings`` is what is kept of them: milliseconds from
the end of the user's speech. It is the one record of turn latency, read by the session history
(``pool.models.SessionResponse`` has a field for each of its fields), the Prometheus histograms
(``pool.metrics.turn``) and the benchmarks (``bench.turn_latency``).
"""

import dataclasses
import time
from dataclasses import dataclass


@dataclass
class Marks:
    """``time.perf_counter()`` seconds of one turn and its response; None until reached.
    ``*_compute_s``: seconds of a stage's own work; ``tts_first_phrase_audio_s``: seconds of audio
    in the first phrase; ``stt_speculative``: transcribed at a pause, before the commit."""

    speech_stopped: float | None = None
    committed: float | None = None
    transcribed: float | None = None
    response_created: float | None = None
    llm_start: float | None = None
    llm_first_text: float | None = None
    llm_first_phrase: float | None = None
    tts_first_audio: float | None = None
    first_audio_sent: float | None = None
    stt_compute_s: float | None = None
    stt_speculative: bool = False
    tts_first_compute_s: float | None = None
    tts_first_phrase_audio_s: float | None = None

    def take_turn(self, turn):
        """A speculative reply's marks become its turn's: the turn's own marks (the end of its
        speech, its commit and transcript, set by the session on ``turn``) join the stages'."""
        for name in ("speech_stopped", "committed", "transcribed", "stt_compute_s", "stt_speculative"):
            setattr(self, name, getattr(turn, name))

    def reach(self, name):
        """Set mark ``name`` to now unless it is set already; returns whether it was set now."""
        if getattr(self, name) is not None:
            return False
        setattr(self, name, time.perf_counter())
        return True


def _ms(seconds):
    return None if seconds is None else round(seconds * 1000, 1)


@dataclass(frozen=True)
class TurnTimings:
    """One voice turn's latency, in milliseconds from the end of the user's speech (the VAD's
    ``speech_stopped``), and each stage's own compute time (ms). None: never reached (a reply
    cancelled before its first audio, a text-only response)."""

    committed_ms: float | None
    transcribed_ms: float | None
    response_created_ms: float | None
    llm_start_ms: float | None
    llm_first_text_ms: float | None
    llm_first_phrase_ms: float | None
    tts_first_audio_ms: float | None
    first_audio_sent_ms: float | None
    stt_compute_ms: float | None
    llm_compute_ms: float | None  # from the LLM's start to its first phrase
    tts_first_compute_ms: float | None
    tts_first_phrase_audio_ms: float | None
    stt_speculative: bool

    @classmethod
    def from_marks(cls, marks):
        """The timings of ``marks`` (``Marks``), or None when no speech ended the turn (a
        response the client asked for after text or a manual commit)."""
        stopped = marks.speech_stopped
        if stopped is None:
            return None

        def since(t):
            return None if t is None else _ms(t - stopped)

        llm = None
        if marks.llm_start is not None and marks.llm_first_phrase is not None:
            llm = _ms(marks.llm_first_phrase - marks.llm_start)
        return cls(
            committed_ms=since(marks.committed), transcribed_ms=since(marks.transcribed),
            response_created_ms=since(marks.response_created), llm_start_ms=since(marks.llm_start),
            llm_first_text_ms=since(marks.llm_first_text), llm_first_phrase_ms=since(marks.llm_first_phrase),
            tts_first_audio_ms=since(marks.tts_first_audio), first_audio_sent_ms=since(marks.first_audio_sent),
            stt_compute_ms=_ms(marks.stt_compute_s), llm_compute_ms=llm,
            tts_first_compute_ms=_ms(marks.tts_first_compute_s),
            tts_first_phrase_audio_ms=_ms(marks.tts_first_phrase_audio_s),
            stt_speculative=marks.stt_speculative)

    def as_dict(self):
        return dataclasses.asdict(self)


FIELDS = tuple(f.name for f in dataclasses.fields(TurnTimings))

"""What travels between the protocol and a unit's stage threads.

Into a unit, the protocol submits the ``*Input`` messages (handled by the VAD stage, which owns
the input audio buffer) and ``ResponseJob`` (handled by the LLM stage, then TTS). Out of a unit,
stages emit the events below through the session's ``SessionContext``; once the context is
closed (the session ended), nothing more of it reaches anyone.
"""

import threading
import time
from dataclasses import dataclass, field

from pool.pipeline.compute import WHENEVER
from pool.pipeline.playback import Playback
from pool.pipeline.timings import Marks


class SessionContext:
    """One session's link to its unit. ``sink(event)`` is called from stage threads; the VAD
    and TTS stages add the session's audio to ``recording`` when it is recorded. ``playback``
    (a ``pool.pipeline.playback.Playback``, or None) is what the client is playing: the VAD
    stage cancels its echo from the microphone when it keeps the audio.

    ``close()`` makes every later ``emit`` a no-op and tells stages to skip this session's
    queued work: the structural guarantee that no output of a session reaches a later one.
    """

    def __init__(self, sink, recording=None, playback=None):
        self._sink = sink
        self.closed = False
        self.recording = recording  # a pool.history.recordings.SessionRecording, or None
        self.playback = playback

    def emit(self, event):
        sink = self._sink  # one read: close() may run on another thread
        if sink is not None:
            sink(event)

    def close(self):
        self.closed = True
        self._sink = None  # work still queued for this session no longer holds its consumer


# --- into the unit -----------------------------------------------------------------------------

class UnitInput:
    """Work the protocol submits to a unit; ``inbox``: the stage that takes it first."""

    inbox = "vad"  # the VAD stage owns the input audio buffer


class StageWork:
    """Work one stage hands the next, inside a unit."""


class UnitEvent:
    """What a unit's stages emit to the session (``SessionContext.emit``), handled on the event
    loop by ``RealtimeSession._on_<name>``."""


@dataclass(frozen=True)
class TurnDetection:
    """What the VAD stage needs of a session's ``turn_detection``: ``threshold`` (speech
    probability), ``prefix_padding_ms``, ``silence_ms`` (the silence that always ends a turn)
    and ``check_ms`` (None, or the pause after which the end-of-turn model is asked whether the
    turn is finished: semantic_vad)."""

    threshold: float
    prefix_padding_ms: int
    silence_ms: int
    check_ms: int | None = None


@dataclass
class ConfigureInput(UnitInput):
    """Input settings. ``decoder``: has ``decode(bytes) -> float32 @ 16 kHz``; ``turn_detection``:
    a ``TurnDetection``, or None for manual turns; ``language``: ISO 639-1 or None (detect);
    ``prompt``: the STT's initial prompt for the session's turns, or None."""

    decoder: object
    turn_detection: TurnDetection | None
    language: str | None
    prompt: str | None = None
    noise_reduction: bool = False  # denoise the input before the VAD and the STT


@dataclass
class AppendInput(UnitInput):
    audio_b64: str
    event_id: str | None = None
    received_at: float = field(default_factory=time.monotonic)  # for the input lag measure


@dataclass
class CommitInput(UnitInput):
    event_id: str | None = None


@dataclass
class ClearInput(UnitInput):
    event_id: str | None = None


@dataclass
class TimeoutInput(UnitInput):
    """server_vad's idle timeout ran out (``idle_ms``): unless speech has begun, commit the silent
    buffer as a user turn. Always answered by one InputTimedOut."""

    idle_ms: int


@dataclass
class CatchUpInput(UnitInput):
    """Asks the VAD stage to say when it has heard the first ``appends`` AppendInputs of the
    session: answered by InputCaughtUp once every append queued before this one is through."""

    appends: int


@dataclass
class PeekInput(UnitInput):
    """Transcribe the speech of ``item_id`` so far once it holds ``after_ms`` of voiced speech,
    or at its first pause, or when it ends, whichever comes first (the protocol asks, to tell a
    backchannel from an interruption), with ``prompt`` as the STT's initial prompt, and score it
    against ``phrases`` (a listener's backchannels). Always answered by exactly one SpeechPeeked:
    with the transcript, or with "" when the item is unknown or long gone."""

    item_id: str
    after_ms: int
    prompt: str | None = None
    phrases: tuple = ()


@dataclass
class ResponseJob(UnitInput):
    """One response: the LLM request, then speech (``modality`` "audio") or text only ("text").

    ``encoder``: has ``encode(float32 @ 24 kHz, last=False) -> wire bytes``. ``cancelled`` is
    set by the protocol to stop generation and speech at the next token or phrase.
    """

    inbox = "llm"

    response_id: str
    request: object
    modality: str
    voice: str
    speed: float
    encoder: object
    cancelled: threading.Event = field(default_factory=threading.Event)
    # Phrases the TTS has spoken (synthesized and sent). The LLM waits for each phrase it queued
    # before it writes the next, so that synthesis has the cores to itself: on 2 cores the two
    # would otherwise slow each other down, and the LLM outpaces speech anyway.
    phrases_spoken: int = 0
    spoken: threading.Condition = field(default_factory=threading.Condition)
    # The turn's marks (pool.pipeline.timings): the session sets its own, the LLM and TTS stages theirs.
    marks: Marks = field(default_factory=Marks)
    audio_seconds: float = 0.0  # speech synthesized so far (TTS stage)
    # A speculative reply (to a transcript made at a pause, before the turn is committed) makes
    # its first phrase and waits: nothing of it reaches the client unless the session adopts it
    # (``adopt``) when the turn commits with the same words; until then its work is due never.
    speculative: bool = False
    adopted: threading.Event = field(default_factory=threading.Event)
    # Set while user speech over this reply is undecided (``realtime.session.turns``): the TTS
    # then starts no synthesis the client's audio can wait for, so that the peeks that decide
    # whether the reply stops have the cores (``pool.pipeline.stages.tts``).
    overlap_undecided: threading.Event = field(default_factory=threading.Event)
    # What the client plays of this reply, on the compute queue's clock: each piece after the
    # last, from when it arrives. A client whose audio ran out (a stall) starts again at the
    # next piece, so its audio runs out next at that piece's end, not at its first delta plus
    # all the audio sent (which, after a stall, is in the past and stays there: such a reply
    # went before every user waiting for a first word, and was cut into 3-word pieces).
    playout: Playback = field(default_factory=lambda: Playback(clock=time.perf_counter), repr=False)
    _audio_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self):
        if not self.speculative:
            self.adopted.set()

    def adopt(self):
        """The session took this speculative reply as the turn's: it goes on, due as any reply,
        and the client plays what it made from now."""
        with self._audio_lock:
            self.adopted.set()
            if self.audio_seconds:
                self.playout.sent(self.audio_seconds)

    def audio_sent(self, seconds):
        """TTS: ``seconds`` more speech synthesized and sent (held until it is adopted, for a
        speculative reply)."""
        with self._audio_lock:
            self.audio_seconds += seconds
            if self.adopted.is_set():
                self.playout.sent(seconds)

    def held_seconds(self):
        """Seconds of this reply's audio the client holds and has not played yet, or None
        before it plays any."""
        return self.playout.held() if self.playout.end else None

    def due(self):
        """When this reply's next piece of work (LLM text or speech) is due, in
        ``time.perf_counter()`` seconds (``pool.pipeline.compute``): before its first audio, when
        the user stopped speaking (now, for a response without speech); after, when the audio the
        client holds runs out (``playout``). A speculative reply not adopted: never
        (``WHENEVER``), it runs when nothing else waits."""
        if not self.adopted.is_set():
            return WHENEVER
        return self.playout.end or self.marks.speech_stopped or time.perf_counter()

    def wait_adopted(self, stop, poll=0.02):
        """LLM: block until the session adopts this reply or ``stop()`` is true; returns
        whether it was adopted."""
        while not self.adopted.wait(poll):
            if stop():
                return False
        return True

    def phrase_spoken(self):
        """TTS: one more phrase synthesized and sent."""
        with self.spoken:
            self.phrases_spoken += 1
            self.spoken.notify_all()

    def wait_spoken(self, count, timeout, stop, poll=0.02):
        """LLM: block until ``count`` phrases are spoken, ``stop()`` is true or ``timeout``
        seconds pass. Returns whether they were spoken."""
        deadline = time.monotonic() + timeout
        with self.spoken:
            while self.phrases_spoken < count:
                if stop() or time.monotonic() > deadline:
                    return False
                self.spoken.wait(poll)
        return True


@dataclass
class Transcribe(StageWork):
    """VAD -> STT: a committed item. ``speculated_samples``: the length of the item's audio when
    it was speculatively transcribed, if nothing but silence came after (the transcript of that
    speculation is the item's); else None."""

    item_id: str
    audio: object  # float32 @ 16 kHz
    language: str | None
    speculated_samples: int | None = None
    prompt: str | None = None  # the session's STT prompt (ConfigureInput)


@dataclass
class Speculate(StageWork):
    """VAD -> STT: the speech of an item at the first pause; transcribed ahead of a commit that
    may follow. Nothing is sent to the protocol unless the commit comes with no speech between."""

    item_id: str
    audio: object  # float32 @ 16 kHz
    language: str | None
    prompt: str | None = None  # the session's STT prompt (ConfigureInput)
    commit_in_ms: int = 300  # the earliest the commit can come if the pause goes on (its deadline)


@dataclass
class Peek(StageWork):
    """VAD -> STT: the speech of an item so far (``final``: all of it, it has ended)."""

    item_id: str
    audio: object  # float32 @ 16 kHz
    language: str | None
    prompt: str | None
    voiced_ms: int
    phrases: tuple = ()
    final: bool = False
    input_lag_ms: int | None = None  # how far the VAD was behind the client's audio when it asked
    asked_at: float = field(default_factory=time.monotonic)


@dataclass
class Phrase(StageWork):
    job: ResponseJob
    text: str  # exactly as the LLM wrote it (leading space kept), the transcript delta


@dataclass
class FunctionCall(StageWork):
    """The LLM asks the client to run a function (LLM -> TTS, to keep output order)."""

    job: ResponseJob
    call_id: str
    name: str
    arguments: str  # JSON text


@dataclass
class JobEnd(StageWork):
    job: ResponseJob
    usage: dict
    error: str | None = None


class SessionEnd(StageWork):
    """The end of a session's work: travels VAD -> STT -> LLM -> TTS behind everything queued
    for it; when it has passed the last stage, the unit is drained."""


SESSION_END = SessionEnd()


# --- out of the unit ---------------------------------------------------------------------------

@dataclass
class SpeechStarted(UnitEvent):
    item_id: str
    audio_start_ms: int


@dataclass
class SpeechStopped(UnitEvent):
    item_id: str
    audio_end_ms: int


@dataclass
class InputCommitted(UnitEvent):
    item_id: str
    audio_ms: int
    event_id: str | None = None


@dataclass
class InputCleared(UnitEvent):
    event_id: str | None = None


@dataclass
class InputTimedOut(UnitEvent):
    """The answer to a TimeoutInput: the item the silence is committed as (an InputCommitted
    follows), and the silent segment (``audio_start_ms`` .. ``audio_end_ms`` of the input); or
    ``item_id`` None when speech had begun and nothing was committed."""

    item_id: str | None
    audio_start_ms: int = 0
    audio_end_ms: int = 0


@dataclass
class InputCaughtUp(UnitEvent):
    """The VAD stage has heard the session's first ``appends`` appends (CatchUpInput)."""

    appends: int


@dataclass
class InputRejected(UnitEvent):
    """An input the VAD stage refused: an ``error`` with ``code`` and ``param`` (the field of
    the client event at fault)."""

    code: str
    message: str
    event_id: str | None = None
    param: str | None = None


@dataclass
class Transcribed(UnitEvent):
    item_id: str
    transcript: str
    audio_seconds: float
    stt_seconds: float
    speculative: bool = False  # transcribed at a pause, before the commit
    language: str | None = None  # ISO 639-1: the session's, or what the STT detected


@dataclass
class Speculated(UnitEvent):
    """The STT transcribed an item at its first pause, before its commit (``Speculate``): the
    session may start a speculative reply to it (``ResponseJob.speculative``)."""

    item_id: str
    transcript: str
    language: str | None = None
    samples: int = 0  # the pause it was made at: how much of the item's audio it heard (16 kHz)


@dataclass
class SpeechResumed(UnitEvent):
    """Speech went on after the pause its speculation was made at: that speculation, and any
    reply to it, is of no use. ``samples``: that pause, as in ``Speculated``; the STT's
    ``Speculated`` for it may still be on its way."""

    item_id: str
    samples: int = 0


@dataclass
class SpeechPeeked(UnitEvent):
    """The transcript of an item's speech so far (the answer to a PeekInput); ``likeness``: how
    like one of the peek's ``phrases`` it sounds (``pool.backends.stt.WhisperSTT.hear``; None:
    not scored); ``final``: it covered the item to its end."""

    item_id: str
    transcript: str
    voiced_ms: int  # voiced speech in the audio transcribed
    likeness: float | None = None
    final: bool = False
    # (VAD behind the client's audio, the peek's wait for the STT, the STT's compute), ms, or None
    timing: tuple | None = None


@dataclass
class TranscriptionFailed(UnitEvent):
    item_id: str
    message: str


@dataclass
class ResponseText(UnitEvent):
    response_id: str
    text: str


@dataclass
class ResponseAudio(UnitEvent):
    """One spoken phrase: its transcript delta and its audio as base64 wire-format chunks;
    ``samples``: the same audio as the TTS made it (float32, 24 kHz), for a recording or the
    echo canceller's reference (else None)."""

    response_id: str
    transcript: str
    chunks: list
    audio_ms: float
    tts_seconds: float
    samples: object = None


@dataclass
class EchoRemoved(UnitEvent):
    """The echo canceller took the client's own playback out of the microphone from
    ``start_ms`` to ``end_ms`` of the session's input audio: no speech, no turn, no interruption."""

    start_ms: int
    end_ms: int


@dataclass
class ResponseFunctionCall(UnitEvent):
    response_id: str
    call_id: str
    name: str
    arguments: str


@dataclass
class ResponseFinished(UnitEvent):
    response_id: str
    usage: dict
    error: str | None = None


@dataclass
class StageFailed(UnitEvent):
    stage: str
    message: str

"""The VAD stage: the input audio buffer, Silero VAD, turn detection and commits."""

import collections
import time
from dataclasses import dataclass, field

import numpy as np

from pool.backends.base import SPEECH_RATE, VAD_WINDOW_SAMPLES
from pool.ids import new_id
from pool.pipeline import messages as m
from pool.pipeline.stages.base import Stage
from pool.pipeline.stages.base import ms as _ms

MIN_COMMIT_MS = 100  # input_audio_buffer.commit needs at least this much audio (OpenAI's rule)
MAX_BUFFER_SECONDS = 15 * 60  # manual-turn input buffer bound
NEG_THRESHOLD_GAP = 0.15  # speech ends below threshold - 0.15 (Silero's get_speech_timestamps)
# Voiced audio (ms) before a candidate counts as speech: a breath or a click is not a turn and
# does not interrupt. Silero's get_speech_timestamps uses 250 ms; shorter keeps a quick "No.".
MIN_SPEECH_MS = 160
# Speculative transcription: at this much silence the speech so far is transcribed, so a turn that
# ends at this pause has its transcript ready (or under way) when the silence commits it. With
# an end-of-turn model it starts halfway to the model's check, which may commit at once.
SPECULATE_MS = 200


@dataclass
class _Speech:
    """The speech in progress: a candidate until MIN_SPEECH_MS of it is voiced, then announced
    (``SpeechStarted``) and a turn once its silence ends it."""

    item_id: str
    start: int  # samples into the session's audio where it (with its prefix padding) begins
    voiced: int = 1  # windows at or above the threshold
    announced: bool = False
    silence: int = 0  # samples of silence since its last speech window
    asked: bool = False  # the end-of-turn model was asked about the current pause
    speculated: int | None = None  # samples of it transcribed at the current pause
    peek: tuple | None = None  # (voiced samples, prompt) at which to peek at it


@dataclass
class _Input:
    """One session's input: its settings and its input audio buffer. The stage holds one per
    session and replaces it whole when the session ends, so nothing of it reaches the next."""

    decoder: object = None  # has decode(audio_b64) -> float32 @ 16 kHz (realtime.audio)
    turn_detection: m.TurnDetection | None = None  # None: manual turns
    language: str | None = None
    prompt: str | None = None  # the STT's initial prompt for this session's turns
    noise_reduction: bool = False
    pending: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.float32))  # not yet a window
    buffer: list = field(default_factory=list)  # windows since the last commit (manual turns, or speech)
    prefix: collections.deque = field(default_factory=collections.deque)  # windows before speech (padding)
    samples_seen: int = 0
    speech: _Speech | None = None
    last: tuple | None = None  # (item id, audio, voiced samples) of the last speech committed
    lag_max: float = 0.0  # seconds from an append's arrival to its VAD, this session

    def audio(self, pending=False):
        """The buffered audio as one array (``pending``: with the part-window at its end)."""
        parts = self.buffer + ([self.pending] if pending and len(self.pending) else [])
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)


class VADStage(Stage):
    """Owns the input audio buffer: decodes appends, runs Silero VAD, detects turns, commits."""

    name = "vad"

    def __init__(self, backends, stt_inbox):
        self._stream = backends.vad.new_stream()
        self._denoise = backends.denoise.new_stream() if backends.denoise is not None else None
        self._turn = backends.turn
        self._stt_inbox = stt_inbox
        self.end_session()

    def end_session(self):
        self._stream.reset()
        if self._denoise is not None:
            self._denoise.reset()
        self._in = _Input()

    @property
    def input_lag_max(self):
        return self._in.lag_max

    def handle(self, ctx, msg):
        state = self._in
        if isinstance(msg, m.ConfigureInput):
            state.decoder, state.language, state.turn_detection = msg.decoder, msg.language, msg.turn_detection
            state.prompt = msg.prompt
            if msg.noise_reduction and not state.noise_reduction and self._denoise is not None:
                self._denoise.reset()  # a new stretch of denoised input
            state.noise_reduction = msg.noise_reduction
            if msg.turn_detection is None:
                state.speech = None  # switching to manual turns keeps the buffered audio
        elif isinstance(msg, m.AppendInput):
            self._append(ctx, msg)
        elif isinstance(msg, m.TimeoutInput):
            self._timeout(ctx, msg.idle_ms)
        elif isinstance(msg, m.CatchUpInput):  # the inbox is FIFO: every earlier append is heard
            ctx.emit(m.InputCaughtUp(msg.appends))
        elif isinstance(msg, m.CommitInput):
            self._commit(ctx, msg.event_id, state.speech.item_id if state.speech else new_id("item"))
        elif isinstance(msg, m.PeekInput):
            self._peek_request(ctx, msg)
        elif isinstance(msg, m.ClearInput):
            if state.speech is not None and state.speech.peek is not None:
                ctx.emit(m.SpeechPeeked(state.speech.item_id, "", 0))
            state.buffer, state.pending, state.speech = [], state.pending[:0], None
            state.prefix.clear()
            ctx.emit(m.InputCleared(msg.event_id))

    def _append(self, ctx, msg):
        state = self._in
        try:
            samples = state.decoder.decode(msg.audio_b64)
        except ValueError as exc:  # the decoder's AudioFormatError names its code
            ctx.emit(m.InputRejected(getattr(exc, "code", "invalid_audio"), str(exc), msg.event_id, "audio"))
            return
        buffered = len(state.buffer) * VAD_WINDOW_SAMPLES + len(state.pending)
        if buffered + len(samples) > MAX_BUFFER_SECONDS * SPEECH_RATE:
            ctx.emit(m.InputRejected(
                "input_audio_buffer_full",
                f"The input audio buffer holds at most {MAX_BUFFER_SECONDS} s; commit or clear it.",
                msg.event_id))
            return
        if ctx.recording is not None:
            ctx.recording.user(samples)  # as the user sent it
        if state.noise_reduction and self._denoise is not None:
            samples = self._denoise.process(samples)
        audio = np.concatenate([state.pending, samples]) if len(state.pending) else samples
        whole = len(audio) - len(audio) % VAD_WINDOW_SAMPLES
        for start in range(0, whole, VAD_WINDOW_SAMPLES):
            self._window(ctx, audio[start:start + VAD_WINDOW_SAMPLES])
        state.pending = audio[whole:].copy()
        state.lag_max = max(state.lag_max, time.monotonic() - msg.received_at)

    def _window(self, ctx, window):
        state = self._in
        probability = self._stream.probability(window)
        state.samples_seen += VAD_WINDOW_SAMPLES
        td = state.turn_detection
        if td is None:
            state.buffer.append(window)
            return
        voiced = probability >= td.threshold
        speech = state.speech
        if speech is None:
            state.prefix.append(window)
            while len(state.prefix) * VAD_WINDOW_SAMPLES > td.prefix_padding_ms * SPEECH_RATE // 1000 + VAD_WINDOW_SAMPLES:
                state.prefix.popleft()
            if voiced:  # a candidate: speech once it has MIN_SPEECH_MS of voiced windows
                state.buffer = list(state.prefix)
                state.prefix.clear()
                state.speech = _Speech(new_id("item"), state.samples_seen - len(state.buffer) * VAD_WINDOW_SAMPLES)
            return
        state.buffer.append(window)
        speech.voiced += voiced
        if not speech.announced and speech.voiced * VAD_WINDOW_SAMPLES * 1000 >= MIN_SPEECH_MS * SPEECH_RATE:
            speech.announced = True
            ctx.emit(m.SpeechStarted(speech.item_id, _ms(max(speech.start, 0))))
        if probability < max(td.threshold - NEG_THRESHOLD_GAP, 0.01):
            speech.silence += VAD_WINDOW_SAMPLES
        else:
            speech.silence, speech.asked, speech.speculated = 0, False, None
        if not speech.announced:
            if speech.silence * 1000 >= MIN_SPEECH_MS * SPEECH_RATE:
                self._drop_candidate()
            return
        self._maybe_peek(ctx)
        self._maybe_speculate(ctx, td)
        if speech.silence * 1000 >= td.silence_ms * SPEECH_RATE or self._finished_early(td):
            ctx.emit(m.SpeechStopped(speech.item_id, _ms(state.samples_seen - speech.silence)))
            self._commit(ctx, None, speech.item_id)

    def _drop_candidate(self):
        """A click or a breath: too little voiced audio to be speech. Its windows become the
        prefix padding of the next speech."""
        state = self._in
        state.prefix = collections.deque(state.buffer)
        state.buffer, state.speech = [], None

    def _maybe_speculate(self, ctx, td):
        """Early in a pause (SPECULATE_MS, shorter than the turn's silence), transcribe the
        speech so far: the STT keeps the result for the commit, which reuses it when nothing but
        silence came between."""
        speech = self._in.speech
        at_ms = min(SPECULATE_MS, td.check_ms // 2) if td.check_ms else SPECULATE_MS
        if (speech.speculated is not None or td.silence_ms <= at_ms
                or speech.silence * 1000 < at_ms * SPEECH_RATE):
            return
        audio = self._in.audio()
        speech.speculated = len(audio)
        self._stt_inbox.put((ctx, m.Speculate(speech.item_id, audio, self._in.language, self._in.prompt)))

    def _finished_early(self, td):
        """semantic_vad: at the first ``check_ms`` of a pause, the end-of-turn model decides."""
        speech = self._in.speech
        if (td.check_ms is None or self._turn is None or speech.asked
                or speech.silence * 1000 < td.check_ms * SPEECH_RATE):
            return False
        speech.asked = True
        return self._turn.is_complete(self._in.audio())

    def _peek_request(self, ctx, msg):
        """Peek at the current speech once it is voiced enough; at the last item, which ended
        before the request came (the input was ahead of the protocol), as a whole."""
        state = self._in
        after = msg.after_ms * SPEECH_RATE // 1000
        if state.speech is not None and msg.item_id == state.speech.item_id:
            state.speech.peek = (after, msg.prompt)
            self._maybe_peek(ctx)
        elif state.last is not None and msg.item_id == state.last[0] and state.last[2] >= after:
            item_id, audio, voiced = state.last
            self._stt_inbox.put((ctx, m.Peek(item_id, audio, state.language, msg.prompt, _ms(voiced))))
        else:  # too short, or long gone: no words to hear
            ctx.emit(m.SpeechPeeked(msg.item_id, "", 0))

    def _maybe_peek(self, ctx):
        speech = self._in.speech
        voiced = speech.voiced * VAD_WINDOW_SAMPLES
        if speech.peek is not None and voiced >= speech.peek[0]:
            self._stt_inbox.put((ctx, m.Peek(speech.item_id, self._in.audio(), self._in.language, speech.peek[1],
                                             _ms(voiced))))
            speech.peek = None

    def _timeout(self, ctx, idle_ms):
        """server_vad's idle timeout: no speech has begun, so the silence buffered (the prefix
        padding, at least one window) is committed as the user's turn; the session answers it."""
        state = self._in
        if state.speech is not None or state.turn_detection is None:
            ctx.emit(m.InputTimedOut(None))
            return
        end_ms = _ms(state.samples_seen + len(state.pending))
        item_id = new_id("item")
        ctx.emit(m.InputTimedOut(item_id, max(0, end_ms - idle_ms), end_ms))
        state.buffer = list(state.prefix) or [np.zeros(VAD_WINDOW_SAMPLES, dtype=np.float32)]
        state.prefix.clear()
        self._commit(ctx, None, item_id, minimum_ms=0)

    def _commit(self, ctx, event_id, item_id, minimum_ms=MIN_COMMIT_MS):
        state, speech = self._in, self._in.speech
        audio = state.audio(pending=True)
        if _ms(len(audio)) < minimum_ms:
            ctx.emit(m.InputRejected(
                "input_audio_buffer_commit_empty",
                f"Error committing input audio buffer: buffer too small. Expected at least "
                f"{MIN_COMMIT_MS}ms of audio, but buffer only has {_ms(len(audio))}ms of audio.",
                event_id))
            return
        voiced = speech.voiced * VAD_WINDOW_SAMPLES if speech else 0
        if speech is not None and speech.peek is not None:  # it ended before it was voiced enough to be peeked at
            ctx.emit(m.SpeechPeeked(item_id, "", _ms(voiced)))
        # Kept for a peek asked for after the speech ended (server VAD turns only: a manual
        # buffer may hold minutes of audio).
        state.last = (item_id, audio, voiced) if state.turn_detection else None
        state.buffer, state.pending, state.speech = [], state.pending[:0], None
        state.prefix.clear()
        ctx.emit(m.InputCommitted(item_id, _ms(len(audio)), event_id))
        self._stt_inbox.put((ctx, m.Transcribe(item_id, audio, state.language, speech.speculated if speech else None,
                                               state.prompt)))

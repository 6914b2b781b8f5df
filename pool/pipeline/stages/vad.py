"""The VAD stage: the input audio buffer, Silero VAD, turn detection and commits."""

import collections
import time

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
            samples = self.decoder.decode(msg.audio_b64)
        except ValueError as exc:  # the decoder's AudioFormatError names its code
            ctx.emit(m.InputRejected(getattr(exc, "code", "invalid_audio"), str(exc), msg.event_id, "audio"))
            return
        buffered = len(self._buffer) * VAD_WINDOW_SAMPLES + len(self._pending)
        if buffered + len(samples) > MAX_BUFFER_SECONDS * SPEECH_RATE:
            ctx.emit(m.InputRejected(
                "input_audio_buffer_full",
                f"The input audio buffer holds at most {MAX_BUFFER_SECONDS} s; commit or clear it.",
                msg.event_id))
            return
        if ctx.recording is not None:
            ctx.recording.user(samples)
        audio = np.concatenate([self._pending, samples]) if len(self._pending) else samples
        whole = len(audio) - len(audio) % VAD_WINDOW_SAMPLES
        for start in range(0, whole, VAD_WINDOW_SAMPLES):
            self._window(ctx, audio[start:start + VAD_WINDOW_SAMPLES])
        self._pending = audio[whole:].copy()
        self.input_lag_max = max(self.input_lag_max, time.monotonic() - msg.received_at)

    def _window(self, ctx, window):
        probability = self._stream.probability(window)
        self._samples_seen += VAD_WINDOW_SAMPLES
        td = self.turn_detection
        if td is None:
            self._buffer.append(window)
            return
        voiced = probability >= td.threshold
        if self._speech_item is None:
            self._prefix.append(window)
            while len(self._prefix) * VAD_WINDOW_SAMPLES > td.prefix_padding_ms * SPEECH_RATE // 1000 + VAD_WINDOW_SAMPLES:
                self._prefix.popleft()
            if voiced:  # a candidate: speech once it has MIN_SPEECH_MS of voiced windows
                self._speech_item = new_id("item")
                self._buffer = list(self._prefix)
                self._prefix.clear()
                self._silence, self._voiced, self._announced = 0, 1, False
                self._speech_start = self._samples_seen - len(self._buffer) * VAD_WINDOW_SAMPLES
            return
        self._buffer.append(window)
        self._voiced += voiced
        if not self._announced and self._voiced * VAD_WINDOW_SAMPLES * 1000 >= MIN_SPEECH_MS * SPEECH_RATE:
            self._announced = True
            ctx.emit(m.SpeechStarted(self._speech_item, _ms(max(self._speech_start, 0))))
        if probability < max(td.threshold - NEG_THRESHOLD_GAP, 0.01):
            self._silence += VAD_WINDOW_SAMPLES
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
        voiced = self._voiced * VAD_WINDOW_SAMPLES
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
            ctx.emit(m.SpeechPeeked(item_id, "", _ms(self._voiced * VAD_WINDOW_SAMPLES)))
        # Kept for a peek asked for after the speech ended (server VAD turns only: a manual
        # buffer may hold minutes of audio).
        self._last = (item_id, audio, self._voiced * VAD_WINDOW_SAMPLES) if self.turn_detection else None
        self._buffer, self._pending, self._speech_item = [], self._pending[:0], None
        self._prefix.clear()
        speculated, self._speculated = self._speculated, None
        self._peek, self._asked, self._voiced = None, False, 0
        ctx.emit(m.InputCommitted(item_id, _ms(len(audio)), event_id))
        self._stt_inbox.put((ctx, m.Transcribe(item_id, audio, self.language, speculated)))

"""The VAD stage: the input audio buffer, Silero VAD, turn detection and commits."""

import collections
import time
from dataclasses import dataclass, field

import numpy as np

from pool.backends.base import SPEECH_RATE, VAD_WINDOW_SAMPLES
from pool.backends.echo import best_match
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
# ends at this pause has its transcript, and its speculative reply its first phrase, ready (or
# under way) when the silence commits it. With an end-of-turn model it starts halfway to the
# model's check, which may commit at once. Not 100: the first phrase came ~100 ms sooner, but
# Whisper tiny.en heard JFK's pauses worse 100 ms in ("S NOT", "like your cut" for "what your
# country can do"), and the commit reuses what the speculation heard (BENCHMARKS.md, section 1f).
SPECULATE_MS = 200
# A peek asked for (speech over the assistant) is made at the first pause this long, before it
# holds the voiced audio asked for: "Wait." is 0.4 s of speech.
PEEK_PAUSE_MS = 200
# The input's clock (``_Input.clock``) follows the appends' arrival; a client that falls this far
# behind or ahead of real time (a pause, a file sent at once) starts it again from an arrival.
CLOCK_SLACK_S = 0.25
ECHO_TAIL_S = 1.0  # the canceller runs until this long after the client stopped playing
# An append is echo when the canceller took at least this much of a sound out of it.
ECHO_REMOVED_DB = 12.0
SOUND_RMS = 10 ** (-50 / 20)  # quieter than this (dBFS) is silence, not a sound removed
ECHO_GAP_MS = 300  # echo heard again within this much is one stretch of it
# Speech that starts while the client plays is first compared with what it played: the last
# ECHO_CHECK_MS of it, against the playback up to ECHO_DELAY_MS earlier; at ECHO_SIMILARITY or
# more it is echo (tuned on the corpus's tune part: bench.interruptions, BENCHMARKS.md 14).
ECHO_CHECK_MS = 400
ECHO_DELAY_MS = 500
ECHO_LEAD_MS = 100
ECHO_SIMILARITY = 0.22
# A match this strong is the playback at once (an echo the canceller has not learnt scores 0.3 to
# 0.7); between ECHO_SIMILARITY and this, voices resembled the playback by chance (up to 0.27
# measured, BENCHMARKS.md 14a), so such a match counts only when a second one agrees on its delay.
ECHO_SURE_SIMILARITY = 0.35
ECHO_PROBE_S = 0.25  # while the client plays and no echo is known, listen for it this often
# A real echo comes back at one delay (the client's buffer, the room); a voice that resembles the
# playback by chance matches it at any. The canceller starts only when two matches agree this well:
# run on a voice, AEC3 takes its words away (an e2e "Wait, stop, ..." was removed as echo after
# one chance match of a "Yeah").
ECHO_DELAY_AGREE_MS = 30
ECHO_MATCHES_S = 3.0  # weak matches older than this confirm nothing
ECHO_AGREED_SIMILARITY = 0.15  # enough at the delay of a weak match (within ECHO_AGREED_DELAY_MS)
ECHO_AGREED_DELAY_MS = 50
# Before the canceller starts, a match is checked on the last ECHO_CONFIRM_MS of the microphone,
# window by window at its delay: an echo follows the playback in most windows, a voice resembles
# it by chance in one or two, and the (lower) median window must reach ECHO_AGREED_SIMILARITY.
# On matches of 400 ms alone, Kokoro's voices talking over its af_alloy started the canceller in
# 6 of 36 held-out cases (one matched at 0.45; others piled up weak matches until two agreed),
# and AEC3 took their words (bench.double_talk, BENCHMARKS.md 14f). Windows of 200 ms: a moment
# of likeness straddling two of 400 ms made their median at the start of a reply.
ECHO_CONFIRM_MS = 2000
ECHO_CONFIRM_WINDOW_MS = 200
# No match is made on less microphone than one such window, nor at a delay that leaves less than
# ECHO_MIN_PLAYED_MS of sound played to match it against, and the windows that confirm one are
# windows the playback had been sounding before (``_window_likenesses``): over a few tens of ms,
# a normalised correlation finds 0.35 or more between any two voices at one of the hundreds of
# delays it tries. A reply's first probe, on 30 ms of a voice that began before the reply, took
# the playback for echo at once, and the canceller took seconds of words from a microphone that
# heard no echo at all (an e2e "what your country can"; 17 and 21 of 270 offsets of a voice and
# a reply in a scan, BENCHMARKS.md 14s); so did matches at delays reaching back to the reply's
# start (40 and 107 ms of it played), confirmed by the one window they were made on.
# An echo is announced as speech 160-250 ms after it begins: asking for 200 ms of playback there
# missed the echo of a reply's first words (bench.double_talk: echo alone heard 2 -> 3 and 5 of 8).
ECHO_MIN_HEARD_MS = ECHO_CONFIRM_WINDOW_MS
ECHO_MIN_PLAYED_MS = 100
# A microphone that did not follow the playback through this much of it audible (its windows
# before the last ECHO_CHECK_MS, lower median under ECHO_AGREED_SIMILARITY) has no echo path: a
# sound that then resembles the playback is a voice. One chance match of af_sarah's "What"
# against af_alloy dropped it as echo, and the user's first word was lost (BENCHMARKS.md 14r).
# Shorter than this, early in a reply, the echo is judged as before (an echo's first check there
# scored 0.149 on 0.2 s of microphone, 14f).
ECHO_ABSENT_MS = 600


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
    peek: tuple | None = None  # (voiced samples, prompt, phrases) of the peek asked for
    peeked: bool = False  # peeks were asked for: speech over the assistant, being judged
    pause_peeked: bool = False  # the current pause was peeked at


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
    vad_pending: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.float32))  # the same, as the VAD hears it
    buffer: list = field(default_factory=list)  # windows since the last commit (manual turns, or speech)
    prefix: collections.deque = field(default_factory=collections.deque)  # windows before speech (padding)
    samples_seen: int = 0
    speech: _Speech | None = None
    last: tuple | None = None  # (item id, audio, voiced samples) of the last speech committed
    lag_max: float = 0.0  # seconds from an append's arrival to its VAD, this session
    received_at: float | None = None  # time.monotonic() at which the append being heard arrived
    clock: float | None = None  # time.monotonic() at which the input so far was captured (about)
    raw: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.float32))  # the last ECHO_CONFIRM_MS as captured
    echo_found: bool = False  # the microphone hears the client's playback: cancel it
    echo_matches: list = field(default_factory=list)  # (delay, end): how late (s) weak matches of the playback came back, and when
    probe_in: float = 0.0  # seconds of playback until the next listen for its echo
    echo: list | None = None  # [first ms, last ms] of the echo being removed, or None

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
        self._echo = backends.echo.new_stream() if backends.echo is not None else None
        self._turn = backends.turn
        self._stt_inbox = stt_inbox
        self.end_session()

    def end_session(self):
        self._stream.reset()
        if self._denoise is not None:
            self._denoise.reset()
        if self._echo is not None:
            self._echo.reset()
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
                ctx.emit(m.SpeechPeeked(state.speech.item_id, "", 0, final=True))
            state.buffer, state.pending, state.vad_pending, state.speech = [], state.pending[:0], state.pending[:0], None
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
        heard = None  # what the STT is given, when it is not what the VAD hears
        if self._echo is not None and ctx.playback is not None and ctx.playback.keeps_audio:
            samples, heard = self._cancel_echo(ctx, msg.received_at, samples)
        if state.noise_reduction and self._denoise is not None:
            samples, heard = self._denoise.process(samples), None
        audio = np.concatenate([state.vad_pending, samples]) if len(state.vad_pending) else samples
        state.received_at = msg.received_at
        kept = audio if heard is None else np.concatenate([state.pending, heard])
        whole = len(audio) - len(audio) % VAD_WINDOW_SAMPLES
        for start in range(0, whole, VAD_WINDOW_SAMPLES):
            self._window(ctx, audio[start:start + VAD_WINDOW_SAMPLES], kept[start:start + VAD_WINDOW_SAMPLES])
        state.vad_pending, state.pending = audio[whole:].copy(), kept[whole:].copy()
        state.lag_max = max(state.lag_max, time.monotonic() - msg.received_at)

    def _cancel_echo(self, ctx, received_at, samples):
        """``(for the VAD, for the STT)``: the microphone's ``samples`` without the echo of what
        the client played while they were captured (``ctx.playback``), once this session's
        microphone was found to hear it (every ECHO_PROBE_S while it plays, and when speech
        starts: ``_echo_left``): the canceller then runs while the client plays, and for
        ECHO_TAIL_S after. Before, and for clients on headphones or with echo cancellation of
        their own, the input passes as it came: AEC3 attenuates a voice while its reference
        plays, echo or not (it cost every interruption of the corpus when it ran for all). The STT is given the mean
        of the canceller's output and the microphone: AEC3's suppression in double talk distorts
        the user's words ("How old I am?" for "Hold on."), the microphone holds the echo; the mean
        keeps the words and the echo 6 dB down (BENCHMARKS.md, 14). Each stretch of sound it
        removes is reported (``EchoRemoved``)."""
        state, seconds = self._in, len(samples) / SPEECH_RATE
        if state.clock is None or abs(received_at - (state.clock + seconds)) > CLOCK_SLACK_S:
            state.clock = received_at  # the samples end about when they arrived
        else:
            state.clock += seconds
        start = state.clock - seconds
        if start > ctx.playback.end + ECHO_TAIL_S:  # nothing plays: nothing to cancel, no cost
            self._echo_heard(ctx, None)
            state.raw = state.raw[:0]  # what the next reply's echo is compared with starts with it
            passed = self._echo.bypass(samples)
            return passed, passed
        state.raw = np.concatenate([state.raw, samples])[-max(ECHO_CHECK_MS, ECHO_CONFIRM_MS) * SPEECH_RATE // 1000:]
        if not state.echo_found:
            state.probe_in -= seconds
            if state.probe_in <= 0:  # listen for the echo before it is taken for speech
                state.probe_in = ECHO_PROBE_S
                self._hears_playback(ctx, state.clock)
            if not state.echo_found:
                passed = self._echo.bypass(samples)
                return passed, passed
        cleaned, captured = self._echo.process(samples, ctx.playback.reference(start, len(samples)))
        before = float(np.sqrt(np.mean(captured ** 2))) if len(captured) else 0.0
        after = float(np.sqrt(np.mean(cleaned ** 2))) if len(cleaned) else 0.0
        removed = before > SOUND_RMS and after < before * 10 ** (-ECHO_REMOVED_DB / 20)
        self._echo_heard(ctx, removed)
        return cleaned, (cleaned + captured) / 2

    def _echo_left(self, ctx):
        """Whether the speech about to start is the client's playback coming back: while the
        client plays, the microphone's last ECHO_CHECK_MS as captured is the playback, late
        (echo.similarity at least ECHO_SIMILARITY, over delays up to ECHO_DELAY_MS); a voice
        louder than the echo scores low. Once two matches agree on the delay, the session's
        echo canceller starts (``_hears_playback``; it takes AEC3 a second or two to learn the
        room, and this check holds meanwhile)."""
        state = self._in
        if self._echo is None or ctx.playback is None or not ctx.playback.keeps_audio or state.clock is None:
            return False
        end = state.clock - len(state.pending) / SPEECH_RATE  # when the last window was captured
        if end > ctx.playback.end + ECHO_TAIL_S or not self._hears_playback(ctx, end):
            return False
        self._echo_heard(ctx, True)
        return True

    def _hears_playback(self, ctx, end):
        """Whether the microphone's last ECHO_CHECK_MS, captured up to ``end`` (monotonic
        seconds), is the client's playback, up to ECHO_DELAY_MS late (about 1 ms of FFT): a
        match of ECHO_SIMILARITY, or of ECHO_AGREED_SIMILARITY at the delay of a match of the
        last ECHO_MATCHES_S (within ECHO_AGREED_DELAY_MS). A match of ECHO_SURE_SIMILARITY finds
        the echo; so does a weaker one at the delay of an earlier one (within
        ECHO_DELAY_AGREE_MS) on audio of its own (ECHO_CHECK_MS later: the checks overlap, and
        one stretch of voice must not confirm itself), if the microphone followed the playback at
        that delay before it (``_follows_playback``): the canceller runs from then on
        (``echo_found``). Until then, no match counts on a microphone that did not follow the
        playback before this check (``_no_echo_path``)."""
        state, heard = self._in, self._in.raw[-ECHO_CHECK_MS * SPEECH_RATE // 1000:]
        # Delays from -ECHO_LEAD_MS (the input's clock may run a little ahead of the capture) up
        # to ECHO_DELAY_MS, and none that leaves less than ECHO_MIN_PLAYED_MS of sound played.
        span = len(heard) + (ECHO_DELAY_MS + ECHO_LEAD_MS) * SPEECH_RATE // 1000
        reference = ctx.playback.reference(end + ECHO_LEAD_MS / 1000 - span / SPEECH_RATE, span)
        played = np.flatnonzero(np.abs(reference) >= SOUND_RMS)
        least = ECHO_MIN_PLAYED_MS * SPEECH_RATE // 1000
        reference = reference[max(0, played[0] + least - len(heard)):] if len(played) else reference[:0]
        if len(heard) < ECHO_MIN_HEARD_MS * SPEECH_RATE // 1000 or len(reference) < len(heard):
            return False  # too little of an echo could be there yet: a sound now is not one
        if float(np.sqrt(np.mean(heard ** 2))) < SOUND_RMS:
            # Near silence: nothing to compare; once the echo is known, what the VAD took for
            # speech in it is the echo's remains while the canceller learns the room.
            return state.echo_found
        score, offset = best_match(heard, reference)
        delay = (len(reference) - offset - len(heard)) / SPEECH_RATE - ECHO_LEAD_MS / 1000
        if score >= ECHO_SURE_SIMILARITY:
            if not state.echo_found and self._no_echo_path(ctx, end, delay):
                return False  # a voice like the playback by chance
            state.echo_found = state.echo_found or self._follows_playback(ctx, end, delay)
            return True
        # Every weak match of the last ECHO_MATCHES_S is kept: the delay a reverberant echo is
        # found at wanders by tens of ms, and a stray one must not displace those it agrees with.
        state.echo_matches = [(d, e) for d, e in state.echo_matches if end - e <= ECHO_MATCHES_S]
        if score < ECHO_SIMILARITY:
            # A faint echo through a room scores about ECHO_SIMILARITY, now above, now below; at
            # the delay of a weak match, a little less is still the echo.
            if score < ECHO_AGREED_SIMILARITY or not any(abs(delay - d) * 1000 <= ECHO_AGREED_DELAY_MS
                                                         for d, _ in state.echo_matches):
                return False
        if not state.echo_found and self._no_echo_path(ctx, end, delay):
            return False
        if any(abs(delay - d) * 1000 <= ECHO_DELAY_AGREE_MS and (end - e) * 1000 >= ECHO_CHECK_MS
               for d, e in state.echo_matches):
            state.echo_found = state.echo_found or self._follows_playback(ctx, end, delay)
        state.echo_matches.append((delay, end))
        return True

    def _follows_playback(self, ctx, end, delay):
        """Whether the microphone followed the playback ``delay`` seconds late (within
        ECHO_AGREED_DELAY_MS) over the last ECHO_CONFIRM_MS, captured up to ``end`` (monotonic
        seconds): the lower median match of its ECHO_CONFIRM_WINDOW_MS windows, of those in
        which the playback was audible, is ECHO_AGREED_SIMILARITY or more."""
        return self._playback_likeness(ctx, end, delay) >= ECHO_AGREED_SIMILARITY

    def _playback_likeness(self, ctx, end, delay):
        """``_follows_playback``'s lower median, 0.0 to 1.0 (0.0: the playback was not audible)."""
        scores = self._window_likenesses(ctx, self._in.raw, end, delay)  # raw: not empty (_hears_playback)
        return _lower_median(scores) if scores else 0.0

    def _no_echo_path(self, ctx, end, delay):
        """Whether the microphone before its last ECHO_CHECK_MS (captured up to ``end`` minus
        that) did not follow the playback ``delay`` seconds late through ECHO_ABSENT_MS of it
        audible: the lower median of those windows is under ECHO_AGREED_SIMILARITY."""
        check = ECHO_CHECK_MS * SPEECH_RATE // 1000
        before = self._in.raw[:-check]
        window = ECHO_CONFIRM_WINDOW_MS * SPEECH_RATE // 1000
        if len(before) < window:
            return False
        scores = self._window_likenesses(ctx, before, end - check / SPEECH_RATE, delay)
        return len(scores) * ECHO_CONFIRM_WINDOW_MS >= ECHO_ABSENT_MS and _lower_median(scores) < ECHO_AGREED_SIMILARITY

    @staticmethod
    def _window_likenesses(ctx, heard, end, delay):
        """The match of each ECHO_CONFIRM_WINDOW_MS window of ``heard`` (captured up to ``end``,
        monotonic seconds) against the playback ``delay`` seconds earlier (within
        ECHO_AGREED_DELAY_MS), of the windows in which the playback was audible and had been in the
        window before (a window the reply began in is a match on part of it, and scores like a
        short one: ECHO_MIN_HEARD_MS), newest first."""
        window = min(len(heard), ECHO_CONFIRM_WINDOW_MS * SPEECH_RATE // 1000)
        tolerance = ECHO_AGREED_DELAY_MS * SPEECH_RATE // 1000
        scores = []
        for stop in range(len(heard), window - 1, -window):
            start = end - (len(heard) - stop + window) / SPEECH_RATE - delay - tolerance / SPEECH_RATE
            played = ctx.playback.reference(start - window / SPEECH_RATE, 2 * window + 2 * tolerance)
            before, reference = played[:window], played[window:]
            if min(float(np.sqrt(np.mean(before ** 2))), float(np.sqrt(np.mean(reference ** 2)))) >= SOUND_RMS:
                scores.append(best_match(heard[stop - window:stop], reference)[0])
        return scores

    def _echo_heard(self, ctx, removed):
        """Follow the stretches of echo removed: ``removed`` says whether the last append was
        one (None: the client is not playing)."""
        state = self._in
        now_ms = _ms(state.samples_seen + len(state.pending))
        if removed:
            if state.echo is None:
                state.echo = [now_ms, now_ms]
            state.echo[1] = now_ms
        elif state.echo is not None and (removed is None or now_ms - state.echo[1] > ECHO_GAP_MS):
            first, last = state.echo
            state.echo = None
            if last - first >= MIN_SPEECH_MS:
                ctx.emit(m.EchoRemoved(first, last))

    def _window(self, ctx, window, kept):
        """One VAD window: ``window`` is what the VAD hears, ``kept`` what the buffer keeps for
        the STT (the same, but for a microphone whose echo is cancelled)."""
        state = self._in
        probability = self._stream.probability(window)
        state.samples_seen += VAD_WINDOW_SAMPLES
        window = kept  # from here on, what is buffered
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
            if self._echo_left(ctx):
                self._drop_candidate()
                return
            speech.announced = True
            ctx.emit(m.SpeechStarted(speech.item_id, _ms(max(speech.start, 0))))
        if probability < max(td.threshold - NEG_THRESHOLD_GAP, 0.01):
            speech.silence += VAD_WINDOW_SAMPLES
        else:
            if speech.speculated is not None:  # what was speculated on at the pause is not the turn
                ctx.emit(m.SpeechResumed(speech.item_id, speech.speculated))
            speech.silence, speech.asked, speech.speculated, speech.pause_peeked = 0, False, None, False
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
        silence came between. Not for speech that peeks judge (over the assistant): its peeks,
        which decide whether the reply stops, would share the cores with it. (Added when the STT
        thread still waited for a speculation, and a peek behind one waited 2.2 s in an e2e run;
        the STT no longer waits, and a speculation here is not measured since.)"""
        speech = self._in.speech
        at_ms = min(SPECULATE_MS, td.check_ms // 2) if td.check_ms else SPECULATE_MS
        if (speech.speculated is not None or speech.peeked or td.silence_ms <= at_ms
                or speech.silence * 1000 < at_ms * SPEECH_RATE):
            return
        audio = self._in.audio()
        speech.speculated = len(audio)
        commit_in_ms = (td.check_ms or td.silence_ms) - at_ms  # semantic_vad may commit at its check
        self._stt_inbox.put((ctx, m.Speculate(speech.item_id, audio, self._in.language, self._in.prompt, commit_in_ms)))

    def _finished_early(self, td):
        """semantic_vad: at the first ``check_ms`` of a pause, the end-of-turn model decides."""
        speech = self._in.speech
        if (td.check_ms is None or self._turn is None or speech.asked
                or speech.silence * 1000 < td.check_ms * SPEECH_RATE):
            return False
        speech.asked = True
        return self._turn.is_complete(self._in.audio())

    def _peek_request(self, ctx, msg):
        """Peek at the current speech once it is voiced enough (or at its first pause, or when it
        ends); at the last item, which ended before the request came (the input was ahead of the
        protocol), as a whole."""
        state = self._in
        if state.speech is not None and msg.item_id == state.speech.item_id:
            state.speech.peek = (msg.after_ms * SPEECH_RATE // 1000, msg.prompt, msg.phrases)
            state.speech.peeked = True
            self._maybe_peek(ctx)
        elif state.last is not None and msg.item_id == state.last[0]:
            item_id, audio, voiced = state.last
            self._stt_inbox.put((ctx, m.Peek(item_id, audio, state.language, msg.prompt, _ms(voiced), msg.phrases,
                                             final=True)))
        else:  # long gone: no words to hear
            ctx.emit(m.SpeechPeeked(msg.item_id, "", 0, final=True))

    def _maybe_peek(self, ctx):
        """Make the peek asked for once the speech holds its voiced audio, or at its first pause
        of PEEK_PAUSE_MS: a short "Wait." is judged there, not after the turn's silence."""
        speech = self._in.speech
        if speech.peek is None:
            return
        voiced = speech.voiced * VAD_WINDOW_SAMPLES
        pause = not speech.pause_peeked and speech.silence * 1000 >= PEEK_PAUSE_MS * SPEECH_RATE
        if voiced >= speech.peek[0] or pause:
            _after, prompt, phrases = speech.peek
            received_at = self._in.received_at
            lag_ms = None if received_at is None else round((time.monotonic() - received_at) * 1000)
            self._stt_inbox.put((ctx, m.Peek(speech.item_id, self._in.audio(), self._in.language, prompt, _ms(voiced),
                                             phrases, input_lag_ms=lag_ms)))
            speech.peek, speech.pause_peeked = None, speech.pause_peeked or pause

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
        if speech is not None and speech.peek is not None:  # it ended before the peek was made: all of it
            _after, prompt, phrases = speech.peek
            self._stt_inbox.put((ctx, m.Peek(item_id, audio, state.language, prompt, _ms(voiced), phrases, final=True)))
        # Kept for a peek asked for after the speech ended (server VAD turns only: a manual
        # buffer may hold minutes of audio).
        state.last = (item_id, audio, voiced) if state.turn_detection else None
        state.buffer, state.pending, state.vad_pending, state.speech = [], state.pending[:0], state.pending[:0], None
        state.prefix.clear()
        ctx.emit(m.InputCommitted(item_id, _ms(len(audio)), event_id))
        self._stt_inbox.put((ctx, m.Transcribe(item_id, audio, state.language, speech.speculated if speech else None,
                                               state.prompt)))


def _lower_median(scores):
    return sorted(scores)[(len(scores) - 1) // 2]

"""The TTS stage: speech for each phrase, sent in deltas; function calls and response ends in order."""

import time
from concurrent.futures import TimeoutError as FutureTimeout

import numpy as np

from pool.backends.base import TTS_RATE, RunStop
from pool.pipeline import messages as m
from pool.pipeline.compute import queue_of
from pool.pipeline.pacing import pace_of
from pool.pipeline.stages.base import Stage


class TTSStage(Stage):
    """Speaks phrases and sends their audio as the encoder cuts it into deltas; passes function calls on and
    closes each response, in the order the LLM produced them.

    A phrase longer than the client's unplayed audio lasts is spoken in pieces
    (``pool.pipeline.pacing``), so the listener hears no gap while the next piece is synthesized;
    so is a long phrase while other units' work waits in the compute queue, so that it does not
    hold the cores while their clients run out of audio. While user speech over the reply is
    undecided, no synthesis starts that the client's audio can wait for (``_yield_to_peeks``).

    Every unit's synthesis goes through the process's one deadline-first compute queue
    (``pool.pipeline.compute``), due at ``job.due()``: a reply's first phrase when the user
    stopped speaking, a later one when the audio the client holds runs out. The stage waits for its phrase, watching
    for cancellation: a cancelled or closed session takes its phrase out of the queue and frees
    the stage (and so the drain) within CANCEL_POLL_SECONDS; a synthesis already running is
    stopped at the model's next node (a TTS that ``stops``: Kokoro, through onnxruntime's
    ``RunOptions.terminate``), else finishes unheard.
    """

    name = "tts"
    CANCEL_POLL_SECONDS = 0.02

    def __init__(self, backends):
        self._tts = backends.tts
        self._tts_background = backends.tts_background  # the background lane's (pool.pipeline.compute)
        self._tts_pair = backends.tts_pair  # on one thread, beside another synthesis (the same)
        self._pace = pace_of(backends.tts)
        self._queue = queue_of(backends)

    def _synthesize(self, ctx, job, text):
        """``(float32 @ 24 kHz, compute seconds, whether that time measures the model alone)``,
        or None when the response was cancelled or the session closed: then the synthesis leaves
        the queue, or, already running, is stopped (a TTS that ``stops``) or runs on unheard.
        Not alone: it ran in the background lane or side by side with another synthesis."""
        background = self._tts_background.synthesize if self._tts_background is not None else None
        # A later phrase may run beside another reply's on one core; a first phrase, which a user
        # waits for in silence, has both cores.
        later = job.held_seconds() is not None
        pair = self._tts_pair.synthesize if self._tts_pair is not None and later else None
        stop = {"stop": RunStop()} if getattr(self._tts, "stops", False) else {}
        future = self._queue.submit(job.due, self._tts.synthesize, text, job.voice, job.speed, background=background,
                                    pair=pair, expected_seconds=self._pace.compute_seconds(text), **stop)
        while True:
            try:
                samples = future.result(timeout=self.CANCEL_POLL_SECONDS)
            except FutureTimeout:
                if job.cancelled.is_set() or ctx.closed:
                    if not future.cancel() and stop:
                        stop["stop"].request()  # the cores go to the next call at once
                    return None
                self._queue.nudge()
            else:
                return samples, future.compute_seconds, not (future.background or future.paired)

    def handle(self, ctx, msg):
        job = msg.job
        if isinstance(msg, m.FunctionCall):
            ctx.emit(m.ResponseFunctionCall(job.response_id, msg.call_id, msg.name, msg.arguments))
            return
        if isinstance(msg, m.JobEnd):
            if not job.cancelled.is_set():
                self._send(ctx, job, "", job.encoder.deltas(np.zeros(0, np.float32), last=True), 0.0, 0.0)
            ctx.emit(m.ResponseFinished(job.response_id, msg.usage, msg.error))
            return
        if job.cancelled.is_set():
            return
        rest = msg.text
        if not rest.strip():
            self._send(ctx, job, rest, [], 0.0, 0.0)
        while rest.strip() and not job.cancelled.is_set():
            self._yield_to_peeks(ctx, job)
            piece, rest = self._pace.next_piece(rest, job.held_seconds(), contended=self._queue.due_waiting() > 0)
            if not self._speak(ctx, job, piece):
                return
        job.phrase_spoken()

    def _yield_to_peeks(self, ctx, job):
        """While user speech over this reply is undecided (``job.overlap_undecided``), start no
        synthesis the client's audio can wait for (``SpeechPace.can_wait``): the peeks that
        decide whether the reply stops then have the cores (beside a Kokoro run a peek's Whisper
        took 1.5-2x its time alone: BENCHMARKS.md 14n, 14o), and a reply the speech stops wastes
        no synthesis. A run already under way goes on."""
        while (job.overlap_undecided.is_set() and not job.cancelled.is_set() and not ctx.closed
               and self._pace.can_wait(job.held_seconds())):
            time.sleep(self.CANCEL_POLL_SECONDS)

    def _speak(self, ctx, job, text):
        """Synthesize ``text`` and send it; False when the response or session ended meanwhile."""
        synthesized = self._synthesize(ctx, job, text.strip())
        if synthesized is None:
            return False
        samples, seconds, alone = synthesized
        if alone:  # else another run's share of the cores counts too: the pace would learn it
            self._pace.observe(len(text.split()), len(samples) / TTS_RATE, seconds)
        if job.marks.reach("tts_first_audio"):
            job.marks.tts_first_compute_s = seconds
            job.marks.tts_first_phrase_audio_s = len(samples) / TTS_RATE
        job.audio_sent(len(samples) / TTS_RATE)
        if ctx.recording is not None:
            ctx.recording.write_sent()  # what the session forwarded of the earlier phrases
        keep = ctx.recording is not None or (ctx.playback is not None and ctx.playback.keeps_audio)
        self._send(ctx, job, text, job.encoder.deltas(samples), len(samples) * 1000 / TTS_RATE, seconds,
                   samples if keep else None)
        return True

    @staticmethod
    def _send(ctx, job, transcript, chunks, audio_ms, tts_seconds, samples=None):
        if chunks or transcript:
            ctx.emit(m.ResponseAudio(job.response_id, transcript, chunks, audio_ms, tts_seconds, samples))

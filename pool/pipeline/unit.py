"""A PipelineUnit: private queues and one thread per stage, VAD -> STT -> LLM -> TTS.

A unit serves one session at a time. The protocol talks to it through ``begin`` (a new session's
``SessionContext``), ``submit`` (input and response work) and ``end_session`` (SESSION_END into the
chain, answered by ``on_drained`` when it reaches the end). ``restart`` abandons stuck threads and
starts fresh ones on new queues; the shared models stay loaded.

Unit states: ``idle`` -> ``active`` -> ``draining`` -> ``idle``, or ``draining`` -> ``quarantined``
when the drain misses its deadline (decided by the registry, ``pool.pipeline.registry``).
"""

import logging
import queue
import threading

from pool.pipeline import messages as m
from pool.pipeline.stages.llm import LLMStage
from pool.pipeline.stages.stt import STTStage
from pool.pipeline.stages.tts import TTSStage
from pool.pipeline.stages.vad import VADStage
from pool.states import UnitState

log = logging.getLogger(__name__)


# Queue bounds (messages). The VAD inbox takes one message per client append; a full inbox makes
# the consumer wait (back-pressure to the socket) rather than drop audio.
VAD_INBOX = 2048
STT_INBOX = 64
LLM_INBOX = 16
TTS_INBOX = 256
_STOP = object()  # ends a stage thread (shutdown or restart)


class Inbox(queue.Queue):
    """A stage's bounded queue (``maxsize`` messages) that tells waiters when, full, it has
    room again."""

    def __init__(self, maxsize):
        super().__init__(maxsize)
        self._room_waiters = []

    def when_room(self, callback):
        """See ``PipelineUnit.when_input_room``."""
        with self.mutex:
            if self._qsize() < self.maxsize:
                return False
            self._room_waiters.append(callback)
            return True

    def _get(self):  # under self.mutex (queue.Queue): one message out is room for one in
        item = super()._get()
        waiters, self._room_waiters = self._room_waiters, []
        for callback in waiters:
            callback()
        return item


class _Chain:
    """One generation of stage threads and their queues. ``restart`` replaces the whole chain."""

    def __init__(self, unit, backends):
        self.inboxes = {name: Inbox(size) for name, size in
                        (("vad", VAD_INBOX), ("stt", STT_INBOX), ("llm", LLM_INBOX), ("tts", TTS_INBOX))}
        self.stages = [
            VADStage(backends, self.inboxes["stt"]),
            STTStage(backends),
            LLMStage(backends, self.inboxes["tts"]),
            TTSStage(backends),
        ]
        self.unit = unit
        self.abandoned = False
        self.threads = [
            threading.Thread(target=self._run, args=(i,), daemon=True,
                             name=f"unit{unit.index}-{stage.name}")
            for i, stage in enumerate(self.stages)
        ]
        for thread in self.threads:
            thread.start()

    def _run(self, position):
        stage = self.stages[position]
        inbox = self.inboxes[stage.name]
        following = self.stages[position + 1].name if position + 1 < len(self.stages) else None
        while True:
            item = inbox.get()
            if item is _STOP or self.abandoned:
                return
            ctx, msg = item
            if msg is m.SESSION_END:
                stage.end_session()
                if following:
                    self.inboxes[following].put(item)
                else:
                    self.unit.on_drained(ctx)
                continue
            if ctx.closed:
                continue  # flushing a finished session's queued work
            try:
                stage.handle(ctx, msg)
            except Exception as exc:  # noqa: BLE001 - a handler error must not kill its thread
                log.exception("unit %s: %s stage failed", self.unit.index, stage.name)
                ctx.emit(m.StageFailed(stage.name, f"{type(exc).__name__}: {exc}"))

    def stop(self):
        self.abandoned = True
        for stage in self.stages:
            stage.stop()
        for inbox in self.inboxes.values():
            try:
                inbox.put_nowait(_STOP)
            except queue.Full:
                pass  # the thread is stuck; ``abandoned`` ends it when it next looks


class PipelineUnit:
    """One slot of the pool. ``index``: position in the pool; ``backends``: the shared models.

    ``on_drained_callback(unit, ctx)`` is called from the last stage's thread when a session's
    SESSION_END has passed every stage.
    """

    def __init__(self, index, backends, on_drained_callback):
        self.index = index
        self.state = UnitState.IDLE
        self.session_id = None
        self.state_since = None
        self._backends = backends
        self._on_drained_callback = on_drained_callback
        self._ctx = None
        self._chain = _Chain(self, backends)

    def begin(self, sink, recording=None, playback=None):
        """Start a session: returns its SessionContext; ``sink(event)`` receives its events,
        ``recording`` (a ``pool.history.recordings.SessionRecording``, or None) its audio,
        ``playback`` (a ``pool.pipeline.playback.Playback``, or None) what its client plays."""
        self._ctx = m.SessionContext(sink, recording, playback)
        return self._ctx

    def submit(self, msg):
        """Queue protocol work without blocking. Returns False when the inbox is full."""
        try:
            self._chain.inboxes[msg.inbox].put_nowait((self._ctx, msg))
        except queue.Full:
            return False
        return True

    def when_input_room(self, callback):
        """Back-pressure without polling: when the VAD inbox is full, ``callback()`` is called
        once (from the VAD thread; it must not block) when it has room, and True returned;
        False, and no call, when it has room now."""
        return self._chain.inboxes["vad"].when_room(callback)

    def end_session(self):
        """Close the session's context and send SESSION_END down the chain (never blocks).

        Returns the closed context: ``on_drained`` reports the same object when the drain ends.
        """
        ctx, self._ctx = self._ctx, None
        if ctx is None:
            return None
        ctx.close()
        threading.Thread(target=self._chain.inboxes["vad"].put, args=((ctx, m.SESSION_END),),
                         daemon=True, name=f"unit{self.index}-drain").start()
        return ctx

    def on_drained(self, ctx):
        self._on_drained_callback(self, ctx)

    def restart(self):
        """Abandon the current threads (stuck or not) and start a fresh chain."""
        self._chain.stop()
        self._chain = _Chain(self, self._backends)

    def stop(self):
        self._chain.stop()

    @property
    def input_lag_max(self):
        """Longest wait (seconds) of an append between arrival and VAD in the current session."""
        return self._chain.stages[0].input_lag_max

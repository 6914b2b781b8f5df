"""The in-process pool: a fixed set of PipelineUnits, claimed by sessions and drained after.

One ``PoolRegistry`` per server process (``pool.process.get_registry()``, which builds it from the
settings). Claims and state changes happen under one lock, so two sessions never share a unit.
"""

import functools
import logging
import threading
import time

from pool import metrics
from pool.backends.voices import OPENAI_VOICES
from pool.pipeline.unit import PipelineUnit
from pool.states import UnitState

log = logging.getLogger(__name__)


def realtime_replies(tts_speed):
    """At most how many replies playing at the same moment the TTS keeps ahead of their
    listeners: ``tts_speed`` (seconds of speech per second of compute, one stream alone,
    ``Backends.tts_speed``) shared evenly. Their LLM and STT take from the same cores, so fewer
    may in practice (BENCHMARKS.md, 5). None when the speed is unknown."""
    return None if tts_speed is None else int(tts_speed)


class PoolRegistry:
    """``backends``: the shared models; ``size``: number of units; ``release_after``: seconds a
    released unit may take to drain before it is quarantined.

    ``records`` (``pool.history.recorder``) is told of every unit state change as
    ``records.unit_changed(unit, old_state, new_state, session_id)`` - from whichever thread made
    it, so it must not block; ``session_id`` is the session the change concerns.
    """

    def __init__(self, backends, size, release_after, records):
        self._lock = threading.Lock()
        self.release_after = release_after
        self.records = records
        self.accepting = True  # False once the process shuts down: no claim succeeds
        self.process_draining = False  # no new sessions but those of client secrets (start_draining)
        self.drain_listeners = []
        self.backends = backends
        self.units = [PipelineUnit(i, backends, self._on_drained) for i in range(size)]
        now = time.time()
        for unit in self.units:
            unit.state_since, unit.state_seq = now, 0
        metrics.unit_changed(self, None, UnitState.IDLE)
        self._drains = {}  # unit index -> (ctx of the draining session, deadline timer)
        self._changed = threading.Condition(self._lock)
        replies = realtime_replies(getattr(backends, "tts_speed", None))
        if replies is not None and size > replies:
            log.warning("A pool of %d units on this CPU: more than %d replies at the same moment make their "
                        "listeners wait mid-reply (the TTS speaks %.1f s of audio per second of compute). "
                        "Fewer units per process, more processes or more cores (README, Several processes).",
                        size, replies, backends.tts_speed)

    @functools.cached_property
    def speaks(self):
        """What the loaded models can do: ``{"transcription_languages", "voice_languages",
        "voices", "transcription_model", "sees_images"}``: ISO 639-1 codes, the voice names a
        session may ask for (OpenAI's, then the TTS's own), the STT model's name
        (``session.created``) and whether the LLM reads images."""
        return {"transcription_languages": sorted(self.backends.stt.languages),
                "transcription_model": getattr(self.backends.stt, "name", type(self.backends.stt).__name__),
                "sees_images": bool(getattr(self.backends.llm, "images", False)),
                "voice_languages": sorted(self.backends.tts.languages),
                "voices": sorted(OPENAI_VOICES) + sorted(self.backends.tts.voices)}

    def _set_state(self, unit, state, session_id=None):
        old, concerned = unit.state, session_id or unit.session_id
        unit.state, unit.session_id, unit.state_since = state, session_id, time.time()
        unit.state_seq += 1
        self.records.unit_changed(unit, old, state, concerned)
        metrics.unit_changed(self, old, state)
        self._changed.notify_all()

    def claim(self, session_id, wait=0.0, only=None, skip=()):
        """Mark the first idle unit active for ``session_id`` and return it; None when full
        (or when the pool has stopped accepting, at shutdown).

        ``only``: the one unit index that may be taken (a client secret's reserved unit);
        ``skip``: indices that may not (units reserved for others). With ``wait`` > 0 (seconds),
        a pool whose eligible units are busy but partly draining waits for one to become idle:
        a client that reconnects right after a disconnect gets its unit back. Blocks the calling
        thread for up to ``wait``; a pool with nothing draining answers at once.
        """
        deadline = time.monotonic() + wait
        eligible = [u for u in self.units if u.index not in skip and (only is None or u.index == only)]
        with self._lock:
            while self.accepting:
                for unit in eligible:
                    if unit.state == UnitState.IDLE:
                        self._set_state(unit, UnitState.ACTIVE, session_id)
                        return unit
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not any(u.state == UnitState.DRAINING for u in eligible):
                    break
                self._changed.wait(remaining)
        return None

    def unclaim(self, unit):
        """Give back a unit claimed for a session that never started (its reservation check
        failed): idle again at once, nothing to drain."""
        with self._lock:
            if unit.state == UnitState.ACTIVE:
                self._set_state(unit, UnitState.IDLE)

    def start_draining(self):
        """The process's drain (``manage.py drain_process``, the admin, SIGTERM): no new sessions
        but those of client secrets already issued; each of ``drain_listeners`` (callables, e.g.
        runpool's stop-when-done) is called once, from the calling thread."""
        with self._lock:
            if self.process_draining:
                return
            self.process_draining = True
        log.info("draining: no new sessions")
        for listener in self.drain_listeners:
            listener()

    def draining(self):
        """True when some unit is draining (and may soon be idle)."""
        return any(unit.state == UnitState.DRAINING for unit in self.units)

    def release(self, unit):
        """End the unit's session: it drains in the background; idle when drained, quarantined
        if the drain has not finished ``release_after`` seconds from now. Never blocks."""
        with self._lock:
            if unit.state != UnitState.ACTIVE:
                return
            ctx = unit.end_session()
            timer = threading.Timer(self.release_after, self._on_deadline, (unit, ctx))
            timer.daemon = True
            self._drains[unit.index] = (ctx, timer)
            self._set_state(unit, UnitState.DRAINING, unit.session_id)
        timer.start()

    def _end_drain(self, unit, ctx):
        """Under the lock: the drain of ``ctx`` on ``unit`` if it is still the one running (the
        drain and its deadline race; only the first to come ends it), else None."""
        drain = self._drains.get(unit.index)
        if unit.state != UnitState.DRAINING or drain is None or drain[0] is not ctx:
            return None
        return self._drains.pop(unit.index)

    def _on_drained(self, unit, ctx):
        with self._lock:
            drain = self._end_drain(unit, ctx)
            if drain:
                drain[1].cancel()
                self._set_state(unit, UnitState.IDLE)
        if ctx.recording is not None:  # complete: every stage is done with this session
            session_id = ctx.recording.session_id
            ctx.recording.save(lambda names: self.records.recording_saved(session_id, names))

    def _on_deadline(self, unit, ctx):
        with self._lock:
            if self._end_drain(unit, ctx):
                log.warning("unit %s did not drain in %.0f s: quarantined", unit.index, self.release_after)
                self._set_state(unit, UnitState.QUARANTINED, unit.session_id)

    def release_quarantined(self, index):
        """Operator release: fresh threads for the unit, then idle. Returns False if not quarantined."""
        unit = self.units[index]
        with self._lock:
            if unit.state != UnitState.QUARANTINED:
                return False
            unit.restart()
            self._set_state(unit, UnitState.IDLE)
        return True

    def close_if_settled(self):
        """Stop accepting sessions if no unit is active or draining, in one step (a drained
        process that stops): True when it did, False when a session is (still, or newly) live."""
        with self._lock:
            if any(u.state in (UnitState.ACTIVE, UnitState.DRAINING) for u in self.units):
                return False
            self.accepting = False
            return True

    def wait_settled(self, timeout):
        """Block until no unit is active or draining, or ``timeout`` seconds. Returns True if settled."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while any(u.state in (UnitState.ACTIVE, UnitState.DRAINING) for u in self.units):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._changed.wait(remaining)
        return True

    def snapshot(self):
        """Every unit as a dict: index, state, session_id, state_since (Unix seconds) and
        input_lag_max_ms (longest append -> VAD wait of the current session)."""
        with self._lock:
            return [{"index": u.index, "state": u.state, "session_id": u.session_id,
                     "state_since": u.state_since, "input_lag_max_ms": round(u.input_lag_max * 1000, 1)}
                    for u in self.units]

    def shutdown(self):
        """Stop every unit's threads and the recorder (after it wrote what is queued). Drains
        still under way end here: their deadlines are cancelled, so a stopped pool quarantines
        nothing later (and records nothing for a process that has stopped)."""
        self.accepting = False
        with self._lock:
            for _ctx, timer in self._drains.values():
                timer.cancel()
            self._drains.clear()
        for unit in self.units:
            unit.stop()
        self.records.stop()

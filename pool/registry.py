"""The in-process pool: a fixed set of PipelineUnits, claimed by sessions and drained after.

One ``PoolRegistry`` per server process (``get_registry()``), built from the settings on first
use or explicitly by ``manage.py runpool`` before it serves. Claims and state changes happen under
one lock, so two sessions never share a unit.
"""

import logging
import threading
import time

from .conf import get_config
from .unit import ACTIVE, DRAINING, IDLE, QUARANTINED, PipelineUnit

log = logging.getLogger(__name__)


class PoolRegistry:
    """``backends``: the shared models; ``size``: number of units; ``release_after``: seconds a
    released unit may take to drain before it is quarantined.

    ``listeners`` are called as ``listener(unit, old_state, new_state)`` after every change, from
    whichever thread made it; they must not block.
    """

    def __init__(self, backends, size, release_after):
        self._lock = threading.Lock()
        self.release_after = release_after
        self.units = [PipelineUnit(i, backends, self._on_drained) for i in range(size)]
        self._drains = {}  # unit index -> (ctx of the draining session, deadline timer)
        self.listeners = []

    def _set_state(self, unit, state, session_id=None):
        old, unit.state, unit.session_id = unit.state, state, session_id
        unit.state_since = time.time()
        for listener in self.listeners:
            listener(unit, old, state)

    def claim(self, session_id):
        """Mark the first idle unit active for ``session_id`` and return it; None when full."""
        with self._lock:
            for unit in self.units:
                if unit.state == IDLE:
                    self._set_state(unit, ACTIVE, session_id)
                    return unit
        return None

    def release(self, unit):
        """End the unit's session: it drains in the background; idle when drained, quarantined
        if the drain has not finished ``release_after`` seconds from now. Never blocks."""
        with self._lock:
            if unit.state != ACTIVE:
                return
            ctx = unit.end_session()
            timer = threading.Timer(self.release_after, self._on_deadline, (unit, ctx))
            timer.daemon = True
            self._drains[unit.index] = (ctx, timer)
            self._set_state(unit, DRAINING, unit.session_id)
        timer.start()

    def _on_drained(self, unit, ctx):
        with self._lock:
            drain = self._drains.get(unit.index)
            if unit.state != DRAINING or drain is None or drain[0] is not ctx:
                return
            del self._drains[unit.index]
            drain[1].cancel()
            self._set_state(unit, IDLE)

    def _on_deadline(self, unit, ctx):
        with self._lock:
            drain = self._drains.get(unit.index)
            if unit.state != DRAINING or drain is None or drain[0] is not ctx:
                return
            del self._drains[unit.index]
            log.warning("unit %s did not drain in %.0f s: quarantined", unit.index, self.release_after)
            self._set_state(unit, QUARANTINED, unit.session_id)

    def release_quarantined(self, index):
        """Operator release: fresh threads for the unit, then idle. Returns False if not quarantined."""
        unit = self.units[index]
        with self._lock:
            if unit.state != QUARANTINED:
                return False
            unit.restart()
            self._set_state(unit, IDLE)
        return True

    def snapshot(self):
        """Every unit as a dict: index, state, session_id, state_since (Unix seconds)."""
        with self._lock:
            return [{"index": u.index, "state": u.state, "session_id": u.session_id,
                     "state_since": u.state_since} for u in self.units]

    def shutdown(self):
        for unit in self.units:
            unit.stop()


_registry = None
_registry_lock = threading.Lock()


def get_registry():
    """The process's pool, built from ``S2S`` settings on first call (loads the models)."""
    global _registry
    with _registry_lock:
        if _registry is None:
            from .backends import load_backends

            config = get_config()
            _registry = PoolRegistry(load_backends(config), config["POOL_SIZE"],
                                     config["RELEASE_AFTER_SECONDS"])
        return _registry


def set_registry(registry):
    """Install ``registry`` as the process's pool (runpool and tests); returns the previous one."""
    global _registry
    with _registry_lock:
        previous, _registry = _registry, registry
    return previous

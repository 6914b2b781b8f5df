"""This process's pool: built once from the settings (the models loaded, the recorder started)
by ``manage.py runpool`` before it serves, or on first use in a host site.
"""

import threading

from pool.conf import get_config
from pool.history.recorder import NoRecords, Records
from pool.pipeline.registry import PoolRegistry


def build_registry(config, size=None, record=True, register=True):
    """Load the backends and build a pool of ``size`` units (default ``POOL_SIZE``).

    With ``record``, every session is recorded (``pool.history.recorder``) and, with
    ``register``, the process and its units are registered in the database at once (a
    synchronous touch, once). A caller that listens only later (``runpool``) passes
    ``register=False`` and calls ``register_process`` once it listens.
    """
    from pool.backends import load_backends  # the model runtimes: only when a pool is built

    size = size or config["POOL_SIZE"]
    records = Records(config["RELEASE_AFTER_SECONDS"], config["HEARTBEAT_SECONDS"],
                      config["LOST_AFTER_SECONDS"]) if record else None
    registry = PoolRegistry(load_backends(config), size, config["RELEASE_AFTER_SECONDS"], records or NoRecords())
    if record:
        records.on_draining = registry.start_draining
        if register:
            register_process(registry, config)
    return registry


def register_process(registry, config):
    """Register this process and ``registry``'s units in the database (sync, once), reached by
    clients at ``PUBLIC_URL``. From that moment other processes hand out its units (client
    secrets, ``pool.access.admission.issue``): call it once the process answers, or a client
    goes to a port nobody listens on and its unused secret holds the unit until it expires."""
    registry.records.start(registry.units, config["PUBLIC_URL"] or "")


_registry = None
_registry_lock = threading.Lock()


def get_registry():
    """The process's pool, built from ``S2S`` settings on first call (loads the models)."""
    global _registry
    with _registry_lock:
        if _registry is None:
            _registry = build_registry(get_config())
        return _registry


def local_registry():
    """The process's pool if one is built, else None (never builds one)."""
    return _registry


def set_registry(registry):
    """Install ``registry`` as the process's pool (runpool and tests); returns the previous one."""
    global _registry
    with _registry_lock:
        previous, _registry = _registry, registry
    return previous

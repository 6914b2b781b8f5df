"""This process's pool: built once from the settings (the models loaded, the recorder started)
by ``manage.py runpool`` before it serves, or on first use in a host site.
"""

import threading

from pool.conf import get_config
from pool.history.recorder import NoRecords, Records
from pool.pipeline.registry import PoolRegistry


def build_registry(config, size=None, record=True):
    """Load the backends and build a pool of ``size`` units (default ``POOL_SIZE``).

    With ``record``, the process and its units are registered in the database and every session
    is recorded (``pool.history.recorder``); this touches the database synchronously, once.
    """
    from pool.backends import load_backends  # the model runtimes: only when a pool is built

    size = size or config["POOL_SIZE"]
    records = Records(config["RELEASE_AFTER_SECONDS"], config["HEARTBEAT_SECONDS"],
                      config["LOST_AFTER_SECONDS"]) if record else None
    registry = PoolRegistry(load_backends(config), size, config["RELEASE_AFTER_SECONDS"], records or NoRecords())
    if record:
        records.on_draining = registry.start_draining
        records.start(registry.units, config["PUBLIC_URL"] or "")
    return registry


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

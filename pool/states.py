"""Every state of a unit, a session and a server process, and why a session ended: one
spelling each.

Django ``TextChoices``: the models' fields take their ``choices``, and the in-process pool
(``pool.pipeline.unit``, ``pool.pipeline.registry``), the admin and the Prometheus gauges use the same members.
A member is a ``str`` equal to its value, so it is stored, compared and sent as that string.
"""

import enum

from django.db import models


class UnitState(models.TextChoices):
    """A ``PipelineUnit``: idle -> active -> draining -> idle, or draining -> quarantined."""

    IDLE = "idle", "idle"
    ACTIVE = "active", "active"
    DRAINING = "draining", "draining"
    QUARANTINED = "quarantined", "quarantined"


class SessionState(models.TextChoices):
    """A session's row: as its unit went, or lost with its process."""

    ACTIVE = "active", "active"
    DRAINING = "draining", "draining"
    ENDED = "ended", "ended"
    QUARANTINED = "quarantined", "quarantined"
    RELEASED = "released", "released"
    LOST = "lost", "lost"


class ProcessState(models.TextChoices):
    """A ``runpool`` process: running -> draining (no new sessions; ends when its sessions have)
    -> stopped, or lost when its heartbeat stops."""

    RUNNING = "running", "running"
    DRAINING = "draining", "draining"
    STOPPED = "stopped", "stopped"
    LOST = "lost", "lost"


class CloseCode(enum.IntEnum):
    """The WebSocket close codes a session ends with (RFC 6455 section 7.4.1), one spelling
    each; a transport that is not a WebSocket maps them."""

    NORMAL = 1000  # the server ended the session (idle, expired)
    GOING_AWAY = 1001  # the process is shutting down or draining
    POLICY_VIOLATION = 1008  # a refused connect, a client that reads nothing
    INTERNAL_ERROR = 1011  # the server failed
    TRY_AGAIN_LATER = 1013  # a temporary condition (the database is busy or down)


# Processes that still serve: the pool console lists them, and lost is decided among them.
LIVE_PROCESS_STATES = (ProcessState.RUNNING, ProcessState.DRAINING)


class EndReason(models.TextChoices):
    """Why a session ended (``realtime.session.lifecycle`` and its transport decide, the recorder writes it)."""

    CLIENT_CLOSE = "client_close", "client close"
    IDLE_TIMEOUT = "idle_timeout", "idle timeout"
    SESSION_EXPIRED = "session_expired", "session expired"
    CLIENT_TOO_SLOW = "client_too_slow", "client too slow"
    CONNECTION_LOST = "connection_lost", "connection lost"  # a WebRTC peer's ICE failed (it vanished)
    SHUTDOWN = "shutdown", "shutdown"
    ERROR = "error", "error"
    LOST = "lost", "lost"

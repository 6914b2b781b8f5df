"""Records of the pool: server processes, their units, and every session served.

Rows are written at connect, release, drain, quarantine and end - never per audio frame - by the
recorder thread (``pool.records``), so database work never blocks the event loop or a stage.
"""

from django.conf import settings
from django.db import models


class ServerProcess(models.Model):
    """One ``runpool`` (or embedding) process that owns a pool of units."""

    RUNNING, STOPPED, LOST = "running", "stopped", "lost"

    host = models.CharField(max_length=255)
    pid = models.PositiveIntegerField()
    pool_size = models.PositiveSmallIntegerField()
    state = models.CharField(max_length=16, default=RUNNING,
                             choices=[(RUNNING, "running"), (STOPPED, "stopped"), (LOST, "lost")])
    started_at = models.DateTimeField(auto_now_add=True)
    heartbeat_at = models.DateTimeField()
    stopped_at = models.DateTimeField(null=True, blank=True)
    longest_heartbeat_gap = models.FloatField(
        null=True, blank=True, verbose_name="longest heartbeat gap (s)",
        help_text="The longest time between two recorded heartbeats: a database outage or a "
                  "stalled process shows here.")
    control_channel = models.CharField(max_length=100, blank=True,
                                       help_text="Channel-layer channel on which this process takes operator commands.")

    class Meta:
        verbose_name = "server process"
        verbose_name_plural = "server processes"
        ordering = ["-started_at"]

    def __str__(self):
        return f"{self.host}:{self.pid}"


class Unit(models.Model):
    """The live state of one PipelineUnit, as its process last reported it."""

    IDLE, ACTIVE, DRAINING, QUARANTINED = "idle", "active", "draining", "quarantined"
    STATES = [(IDLE, "idle"), (ACTIVE, "active"), (DRAINING, "draining"), (QUARANTINED, "quarantined")]

    process = models.ForeignKey(ServerProcess, on_delete=models.CASCADE, related_name="units")
    index = models.PositiveSmallIntegerField()
    state = models.CharField(max_length=16, choices=STATES, default=IDLE)
    session_id = models.CharField(max_length=64, blank=True)
    state_since = models.DateTimeField()

    class Meta:
        ordering = ["process", "index"]
        constraints = [models.UniqueConstraint(fields=["process", "index"], name="unit_per_process_index")]
        permissions = [("release_unit", "Can release a quarantined unit")]

    def __str__(self):
        return f"unit {self.index} of {self.process}"


class QuarantinedUnitManager(models.Manager):
    def get_queryset(self):
        return super().get_queryset().filter(state=Unit.QUARANTINED)


class QuarantinedUnit(Unit):
    """Units that did not drain in time: the admin's list with the Release action."""

    objects = QuarantinedUnitManager()

    class Meta:
        proxy = True
        verbose_name = "quarantined unit"


class APIKey(models.Model):
    """A key that may open sessions. Only its sha256 is stored (see ``pool.auth``)."""

    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=12, db_index=True, help_text="The key's first characters, to recognise it.")
    key_hash = models.CharField(max_length=64, unique=True)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE,
                             related_name="s2s_api_keys")
    max_sessions = models.PositiveIntegerField(null=True, blank=True,
                                               help_text="Concurrent sessions allowed; empty for no limit.")
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = "API key"

    def __str__(self):
        return f"{self.name} ({self.prefix}...)"

    @classmethod
    def issue(cls, name, user=None, max_sessions=None):
        """Create a key; returns ``(APIKey, key)``. The clear key exists only in this return value."""
        from .auth import new_key

        key, key_hash = new_key()
        return cls.objects.create(name=name, prefix=key[:12], key_hash=key_hash, user=user,
                                  max_sessions=max_sessions), key


class Session(models.Model):
    """One WebSocket session, from connect to the end of its unit's drain."""

    ACTIVE, DRAINING, ENDED, QUARANTINED, RELEASED, LOST = (
        "active", "draining", "ended", "quarantined", "released", "lost")
    STATES = [(s, s) for s in (ACTIVE, DRAINING, ENDED, QUARANTINED, RELEASED, LOST)]
    CLIENT_CLOSE, IDLE_TIMEOUT, SHUTDOWN, ERROR = "client_close", "idle_timeout", "shutdown", "error"
    SESSION_EXPIRED, CLIENT_TOO_SLOW = "session_expired", "client_too_slow"  # realtime.consumers
    END_REASONS = [(r, r.replace("_", " ")) for r in (
        CLIENT_CLOSE, IDLE_TIMEOUT, SESSION_EXPIRED, CLIENT_TOO_SLOW, SHUTDOWN, ERROR, LOST)]

    session_id = models.CharField(max_length=64, unique=True)
    process = models.ForeignKey(ServerProcess, null=True, on_delete=models.SET_NULL, related_name="sessions")
    unit_index = models.PositiveSmallIntegerField()
    state = models.CharField(max_length=16, choices=STATES, default=ACTIVE)
    created_at = models.DateTimeField(db_index=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    release_after = models.DateTimeField(null=True, blank=True,
                                         help_text="The drain deadline: quarantined if not drained by then.")
    drained_at = models.DateTimeField(null=True, blank=True)
    quarantined_at = models.DateTimeField(null=True, blank=True)
    released_at = models.DateTimeField(null=True, blank=True)
    released_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                    on_delete=models.SET_NULL, related_name="+")
    end_reason = models.CharField(max_length=16, choices=END_REASONS, blank=True)
    close_code = models.PositiveIntegerField(null=True, blank=True)
    turns = models.PositiveIntegerField(default=0)
    responses = models.PositiveIntegerField(default=0)
    cancelled_responses = models.PositiveIntegerField(default=0)
    audio_in_seconds = models.FloatField(default=0)
    audio_out_seconds = models.FloatField(default=0)
    errors = models.PositiveIntegerField(default=0)
    stage_failures = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True)
    api_key = models.ForeignKey(APIKey, null=True, blank=True, on_delete=models.SET_NULL, related_name="sessions")
    client_address = models.GenericIPAddressField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self):
        return self.session_id

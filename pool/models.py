"""Records of the pool: server processes, their units, and every session served.

Rows are written at connect, release, drain, quarantine and end - never per audio frame - by the
recorder thread (``pool.history.recorder``), so database work never blocks the event loop or a stage.
"""

from django.conf import settings
from django.db import models

from pool.access.keys import new_key
from pool.states import EndReason, ProcessState, SessionState, UnitState


class ServerProcess(models.Model):
    """One ``runpool`` (or embedding) process that owns a pool of units."""

    host = models.CharField(max_length=255)
    pid = models.PositiveIntegerField()
    pool_size = models.PositiveSmallIntegerField()
    state = models.CharField(max_length=16, choices=ProcessState.choices, default=ProcessState.RUNNING)
    started_at = models.DateTimeField(auto_now_add=True)
    heartbeat_at = models.DateTimeField()
    stopped_at = models.DateTimeField(null=True, blank=True)
    longest_heartbeat_gap = models.FloatField(
        null=True, blank=True, verbose_name="longest heartbeat gap (s)",
        help_text="The longest time between two recorded heartbeats: a database outage or a "
                  "stalled process shows here.")
    control_channel = models.CharField(max_length=100, blank=True,
                                       help_text="Channel-layer channel on which this process takes operator commands.")
    public_url = models.CharField(
        max_length=255, blank=True, verbose_name="public URL",
        help_text="Where clients reach this process (PUBLIC_URL, e.g. wss://voice.example.com/a): "
                  "a client secret reserving one of its units sends clients there.")

    class Meta:
        verbose_name = "server process"
        verbose_name_plural = "server processes"
        ordering = ["-started_at"]
        permissions = [("drain_process", "Can drain a server process")]

    def __str__(self):
        return f"{self.host}:{self.pid}"


class Unit(models.Model):
    """The live state of one PipelineUnit, as its process last reported it."""

    process = models.ForeignKey(ServerProcess, on_delete=models.CASCADE, related_name="units")
    index = models.PositiveSmallIntegerField()
    state = models.CharField(max_length=16, choices=UnitState.choices, default=UnitState.IDLE)
    session_id = models.CharField(max_length=64, blank=True)
    state_since = models.DateTimeField()
    input_lag_max_ms = models.FloatField(
        null=True, blank=True, verbose_name="input lag (ms)",
        help_text="The longest an audio append of the current session waited for the VAD, as of "
                  "the last heartbeat: a unit that cannot keep up with real time shows here.")
    state_seq = models.PositiveBigIntegerField(
        default=0, help_text="Counts the unit's state changes in its process: a write of an older "
                             "change never overwrites a newer one.")
    reserved_until = models.DateTimeField(
        null=True, blank=True, help_text="Held for a client secret until then, unless used first.")

    class Meta:
        ordering = ["process", "index"]
        constraints = [models.UniqueConstraint(fields=["process", "index"], name="unit_per_process_index")]
        permissions = [("release_unit", "Can release a quarantined unit")]

    def __str__(self):
        return f"unit {self.index} of {self.process}"


class QuarantinedUnitManager(models.Manager):
    def get_queryset(self):
        return super().get_queryset().filter(state=UnitState.QUARANTINED)


class QuarantinedUnit(Unit):
    """Units that did not drain in time: the admin's list with the Release action."""

    objects = QuarantinedUnitManager()

    class Meta:
        proxy = True
        verbose_name = "quarantined unit"


class APIKey(models.Model):
    """A key that may open sessions. Only its sha256 is stored (see ``pool.access.auth``)."""

    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=12, db_index=True, help_text="The key's first characters, to recognise it.")
    key_hash = models.CharField(max_length=64, unique=True)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE,
                             related_name="s2s_api_keys")
    max_sessions = models.PositiveIntegerField(null=True, blank=True,
                                               help_text="Concurrent sessions allowed; empty for no limit.")
    record_audio = models.BooleanField(null=True, blank=True, help_text="Record the audio of this key's "
                                       "sessions: yes, no, or unknown to follow the RECORD_AUDIO setting.")
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = "API key"

    def __str__(self):
        return f"{self.name} ({self.prefix}...)"

    @classmethod
    def issue(cls, name, user=None, max_sessions=None, record_audio=None):
        """Create a key; returns ``(APIKey, key)``. The clear key exists only in this return value."""
        api_key = cls(name=name, user=user, max_sessions=max_sessions, record_audio=record_audio)
        key = api_key.set_new_key()
        api_key.save()
        return api_key, key

    def set_new_key(self):
        """Give this (unsaved) key a new value: its hash and prefix are set, the clear key is
        returned and kept nowhere (``pool.access.keys``)."""
        key, self.key_hash, self.prefix = new_key()
        return key


class ClientSecret(models.Model):
    """A short-lived ``ek_`` secret (``POST /v1/realtime/client_secrets``) and the unit it reserves.

    Only its sha256 is stored, as for API keys. Single use: ``used_at`` is set by the connect that
    redeems it, on the process that owns the unit (``pool.access.admission``)."""

    prefix = models.CharField(max_length=12, help_text="The secret's first characters, to recognise it.")
    value_hash = models.CharField(max_length=64, unique=True)
    process = models.ForeignKey(ServerProcess, on_delete=models.CASCADE, related_name="client_secrets")
    unit_index = models.PositiveSmallIntegerField()
    session = models.JSONField(help_text="The starting configuration of the session it opens.")
    api_key = models.ForeignKey(APIKey, null=True, blank=True, on_delete=models.CASCADE,
                                related_name="client_secrets", verbose_name="API key")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE,
                             related_name="s2s_client_secrets", help_text="Issued to a logged-in user.")
    client_address = models.GenericIPAddressField(null=True, blank=True,
                                                  help_text="Who asked for it: the client's address, behind trusted proxies.")
    created_at = models.DateTimeField()
    expires_at = models.DateTimeField(db_index=True)
    used_at = models.DateTimeField(null=True, blank=True)
    session_id = models.CharField(max_length=64, blank=True, help_text="The session it opened.")

    class Meta:
        ordering = ["-created_at"]

    def __str__(self):
        return f"{self.prefix}..."


class Session(models.Model):
    """One WebSocket session, from connect to the end of its unit's drain."""

    session_id = models.CharField(max_length=64, unique=True)
    process = models.ForeignKey(ServerProcess, null=True, on_delete=models.SET_NULL, related_name="sessions")
    unit_index = models.PositiveSmallIntegerField()
    state = models.CharField(max_length=16, choices=SessionState.choices, default=SessionState.ACTIVE)
    created_at = models.DateTimeField(db_index=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    release_after = models.DateTimeField(null=True, blank=True,
                                         help_text="The drain deadline: quarantined if not drained by then.")
    drained_at = models.DateTimeField(null=True, blank=True)
    quarantined_at = models.DateTimeField(null=True, blank=True)
    released_at = models.DateTimeField(null=True, blank=True)
    released_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                    on_delete=models.SET_NULL, related_name="+")
    end_reason = models.CharField(max_length=16, choices=EndReason.choices, blank=True)
    close_code = models.PositiveIntegerField(null=True, blank=True)
    turns = models.PositiveIntegerField(default=0)
    responses = models.PositiveIntegerField(default=0)
    cancelled_responses = models.PositiveIntegerField(default=0)
    audio_in_seconds = models.FloatField(default=0)
    audio_out_seconds = models.FloatField(default=0)
    errors = models.PositiveIntegerField(default=0)
    stage_failures = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True)
    api_key = models.ForeignKey(APIKey, null=True, blank=True, on_delete=models.SET_NULL, related_name="sessions",
                                verbose_name="API key")
    client_address = models.GenericIPAddressField(null=True, blank=True)
    TRANSPORTS = [("websocket", "WebSocket"), ("webrtc", "WebRTC")]
    transport = models.CharField(max_length=16, choices=TRANSPORTS, default="websocket",
                                 help_text="What carried the session: a WebSocket, or a WebRTC call.")
    completed_responses = models.PositiveIntegerField(default=0)
    first_audio_p50_ms = models.FloatField(
        null=True, blank=True, verbose_name="first audio p50 (ms)",
        help_text="The median, over the session's voice turns, of the time from the end of the "
                  "user's speech to the reply's first audio sent.")
    history_dropped = models.PositiveIntegerField(
        default=0, help_text="History records past HISTORY_MAX_ITEMS: counted, not stored.")
    user_audio = models.FileField(blank=True, help_text="The user's audio (FLAC, 16 kHz), when recorded.")
    assistant_audio = models.FileField(blank=True, help_text="The assistant's replies as sent "
                                                             "(FLAC, 24 kHz), when recorded.")

    class Meta:
        ordering = ["-created_at"]
        permissions = [("listen_recording", "Can listen to and download session recordings")]

    def __str__(self):
        return self.session_id

    @property
    def duration(self):
        """Seconds from connect to the end (None while it goes on)."""
        return None if self.ended_at is None else (self.ended_at - self.created_at).total_seconds()


class ConversationItem(models.Model):
    """One item of a session's conversation as it ended (or an ``error`` event sent), for the
    admin's timeline and the JSON export. Written by the recorder when the item is final: a user
    turn once transcribed, an assistant message once spoken (cut where it was interrupted)."""

    MESSAGE, FUNCTION_CALL, FUNCTION_CALL_OUTPUT, ERROR, NOTICE = (
        "message", "function_call", "function_call_output", "error", "notice")
    # Sound heard over the assistant and what it was taken for (its status: interruption, turn,
    # backchannel, noise or echo; realtime.session.turns): not an item of the conversation.
    OVERLAP = "overlap"
    # The items of MCP tools, which the server runs (realtime.session.mcp).
    MCP_KINDS = ("mcp_list_tools", "mcp_call", "mcp_approval_request", "mcp_approval_response")
    KINDS = [(k, k.replace("_", " ").replace("mcp", "MCP"))
             for k in (MESSAGE, FUNCTION_CALL, FUNCTION_CALL_OUTPUT, *MCP_KINDS, ERROR, NOTICE, OVERLAP)]

    session = models.ForeignKey(Session, to_field="session_id", on_delete=models.CASCADE, related_name="items")
    item_id = models.CharField(max_length=64, help_text="The item's id (an error's event id).")
    kind = models.CharField(max_length=24, choices=KINDS)
    role = models.CharField(max_length=16, blank=True)
    status = models.CharField(max_length=16, blank=True)
    text = models.TextField(blank=True, help_text="What was said or written (a spoken reply: as far as "
                                                  "it was heard); a call's name and arguments; an error.")
    at_ms = models.PositiveIntegerField(verbose_name="at (ms)", help_text="Since the session started.")
    audio_start_ms = models.PositiveIntegerField(null=True, blank=True,
                                                 help_text="Of a user turn, in the input audio buffer.")
    audio_end_ms = models.PositiveIntegerField(null=True, blank=True)
    audio_ms = models.PositiveIntegerField(null=True, blank=True, help_text="Of a reply: audio sent, "
                                                                           "or heard when truncated.")
    interrupted = models.BooleanField(default=False)
    voice = models.CharField(max_length=64, blank=True)
    language = models.CharField(max_length=16, blank=True, help_text="Of a user turn: the language it "
                                "was transcribed in (the session's, or detected).")
    response_id = models.CharField(max_length=64, blank=True)
    data = models.JSONField(help_text="The item in the Realtime API's shape (an error: the error object).")

    class Meta:
        ordering = ["session", "at_ms", "id"]
        constraints = [models.UniqueConstraint(fields=["session", "item_id"], name="item_per_session")]

    def __str__(self):
        return self.item_id


class SessionResponse(models.Model):
    """One response of a session: how it ended and, for a voice turn, its timings (the fields of
    ``pool.pipeline.timings.TurnTimings``, milliseconds from the end of the user's speech)."""

    session = models.ForeignKey(Session, to_field="session_id", on_delete=models.CASCADE,
                                related_name="response_records")
    response_id = models.CharField(max_length=64)
    status = models.CharField(max_length=16)
    reason = models.CharField(max_length=64, blank=True, help_text="status_details: why it was "
                                                                    "cancelled, or its error code.")
    at_ms = models.PositiveIntegerField(verbose_name="at (ms)", help_text="Created, since the session started.")
    input_tokens = models.PositiveIntegerField(null=True, blank=True)
    output_tokens = models.PositiveIntegerField(null=True, blank=True)
    committed_ms = models.FloatField(null=True, blank=True)
    transcribed_ms = models.FloatField(null=True, blank=True)
    response_created_ms = models.FloatField(null=True, blank=True)
    llm_start_ms = models.FloatField(null=True, blank=True)
    llm_first_text_ms = models.FloatField(null=True, blank=True)
    llm_first_phrase_ms = models.FloatField(null=True, blank=True)
    tts_first_audio_ms = models.FloatField(null=True, blank=True)
    first_audio_sent_ms = models.FloatField(null=True, blank=True)
    stt_compute_ms = models.FloatField(null=True, blank=True)
    llm_compute_ms = models.FloatField(null=True, blank=True)
    tts_first_compute_ms = models.FloatField(null=True, blank=True)
    tts_first_phrase_audio_ms = models.FloatField(null=True, blank=True)
    stt_speculative = models.BooleanField(null=True, blank=True)

    class Meta:
        verbose_name = "response"
        ordering = ["session", "at_ms", "id"]
        constraints = [models.UniqueConstraint(fields=["session", "response_id"], name="response_per_session")]

    def __str__(self):
        return self.response_id

"""The pool console in the Django admin: the pool overview (every process's units, refreshing),
live and quarantined units, server processes, and the session history (each session's
conversation, responses and turn latency, with a JSON export)."""

from datetime import timedelta

from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.db.models import FileField
from django.http import FileResponse, Http404, JsonResponse
from django.shortcuts import get_object_or_404, redirect
from django.template.response import TemplateResponse
from django.urls import path
from django.utils import timezone
from django.utils.html import format_html

from pool import control
from pool.history.timeline import first_audio_chart, session_timeline
from pool.models import APIKey, ConversationItem, QuarantinedUnit, ServerProcess, Session, SessionResponse, Unit
from pool.pipeline import timings
from pool.states import LIVE_PROCESS_STATES, SessionState, UnitState

STATE_COLOURS = {UnitState.IDLE: "#2e7d32", UnitState.ACTIVE: "#1565c0", UnitState.DRAINING: "#ef6c00",
                 UnitState.QUARANTINED: "#c62828", SessionState.LOST: "#6d4c41"}


def state_badge(state):
    colour = STATE_COLOURS.get(state, "#555")
    weight = "bold" if state == UnitState.QUARANTINED else "normal"
    return format_html('<span style="color:#fff;background:{};padding:2px 8px;border-radius:8px;'
                       'font-weight:{}">{}</span>', colour, weight, state)


class ReadOnlyAdmin(admin.ModelAdmin):
    """Rows are written by the pool; the admin only reads them."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


def may_release(request):
    """Who may release a quarantined unit (the Release action and the pool overview's button)."""
    return request.user.has_perm("pool.release_unit")


@admin.action(permissions=["release"], description="Release the selected quarantined units")
def release_units(modeladmin, request, queryset):
    for unit in queryset.select_related("process"):
        ok, message = control.release_unit(unit, request.user)
        modeladmin.message_user(request, message, messages.SUCCESS if ok else messages.ERROR)


class UnitAdmin(ReadOnlyAdmin):
    """The pool page: every unit of every running process."""

    list_display = ["__str__", "state_display", "session_id", "state_since", "input_lag_max_ms", "process_heartbeat"]
    list_filter = ["state", "process"]
    actions = [release_units]

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("process").filter(
            process__state__in=LIVE_PROCESS_STATES)

    @admin.display(description="state", ordering="state")
    def state_display(self, unit):
        return state_badge(unit.state)

    @admin.display(description="process heartbeat")
    def process_heartbeat(self, unit):
        return unit.process.heartbeat_at

    def has_release_permission(self, request):
        return may_release(request)


admin.site.register(Unit, UnitAdmin)
admin.site.register(QuarantinedUnit, UnitAdmin)


def seconds(value, digits=1):
    """A number of seconds as the admin shows it: ``12.3 s`` (empty for None)."""
    return "" if value is None else f"{value:.{digits}f} s"


def ms_as_seconds(value):
    return "" if value is None else seconds(value / 1000, 2)


@admin.action(permissions=["drain"], description="Drain the selected processes (no new sessions; "
                                                "each stops when its sessions have ended)")
def drain_processes(modeladmin, request, queryset):
    for process in queryset:
        ok, message = control.drain_process(process)
        modeladmin.message_user(request, message, messages.SUCCESS if ok else messages.ERROR)


@admin.register(ServerProcess)
class ServerProcessAdmin(ReadOnlyAdmin):
    list_display = ["__str__", "state", "pool_size", "public_url", "started_at", "heartbeat_at",
                    "longest_heartbeat_gap", "stopped_at"]
    list_filter = ["state", "host"]
    actions = [drain_processes]

    def has_drain_permission(self, request):
        return request.user.has_perm("pool.drain_process")

    def get_urls(self):
        return [path("overview/", self.admin_site.admin_view(self.overview_view), name="pool_overview"),
                *super().get_urls()]

    def overview_view(self, request):
        """The pool overview: every running process with its units as a grid, refreshing
        itself. A quarantined unit is released from here with the Release action's permission."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        releaser = may_release(request)
        if request.method == "POST":
            if not releaser:
                raise PermissionDenied
            unit_pk = request.POST.get("unit", "")
            if not unit_pk.isdigit():
                raise Http404("No such unit.")
            unit = get_object_or_404(Unit.objects.select_related("process"), pk=int(unit_pk))
            ok, message = control.release_unit(unit, request.user)
            self.message_user(request, message, messages.SUCCESS if ok else messages.ERROR)
            return redirect("admin:pool_overview")
        now = timezone.now()
        processes = []
        for process in ServerProcess.objects.filter(state__in=LIVE_PROCESS_STATES).prefetch_related("units"):
            units = [{"unit": unit, "badge": state_badge(unit.state),
                      "reserved": unit.reserved_until is not None and unit.reserved_until > now,
                      "for": seconds((now - unit.state_since).total_seconds(), 0)} for unit in process.units.all()]
            processes.append({"process": process, "units": units,
                              "heartbeat_age": seconds((now - process.heartbeat_at).total_seconds(), 0)})
        answered = SessionResponse.objects.filter(
            status="completed", first_audio_sent_ms__isnull=False,
            session__created_at__gte=now - timedelta(hours=2)).select_related("session").order_by("-id")[:5000]
        chart = first_audio_chart([(r.session.created_at + timedelta(milliseconds=r.at_ms), r.first_audio_sent_ms)
                                   for r in answered], now)
        context = {**self.admin_site.each_context(request), "title": "Pool overview", "processes": processes,
                   "may_release": releaser, "refresh_seconds": OVERVIEW_REFRESH_SECONDS,
                   "opts": self.model._meta, "first_audio": chart}
        return TemplateResponse(request, "admin/pool/overview.html", context)


OVERVIEW_REFRESH_SECONDS = 5


class HistoryInline(admin.TabularInline):
    """Rows of a session's history, read-only, in order (``at``: since the session started)."""

    extra = max_num = 0
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    @admin.display(description="at")
    def at(self, row):
        return seconds(row.at_ms / 1000)


class ConversationItemInline(HistoryInline):
    """The conversation as a timeline: who said what, when; interrupted replies marked."""

    model = ConversationItem
    verbose_name_plural = "conversation"
    fields = ["at", "who", "said", "user_audio", "reply_audio", "status"]
    readonly_fields = fields

    @admin.display(description="who")
    def who(self, item):
        if item.kind == ConversationItem.ERROR:
            return "error (sent)"
        if item.kind == ConversationItem.OVERLAP:
            return f"over the assistant: {item.status}"
        if item.kind != ConversationItem.MESSAGE:
            return item.get_kind_display()
        if item.voice or item.language:
            return f"{item.role} ({item.voice or item.language})"
        return item.role

    @admin.display(description="said")
    def said(self, item):
        if item.interrupted:
            return format_html("{} <strong>[interrupted]</strong>", item.text)
        return item.text

    @admin.display(description="speech in the input buffer")
    def user_audio(self, item):
        if item.audio_start_ms is None:
            return ""
        end = "" if item.audio_end_ms is None else seconds(item.audio_end_ms / 1000)
        return f"{seconds(item.audio_start_ms / 1000)} - {end}"

    @admin.display(description="reply audio")
    def reply_audio(self, item):
        return "" if item.audio_ms is None else seconds(item.audio_ms / 1000)


# The TurnTimings fields (pool.pipeline.timings) shown per response, with their column labels.
TIMING_COLUMNS = (
    ("transcribed", "transcript"), ("response_created", "response created"),
    ("llm_first_text", "LLM first text"), ("llm_first_phrase", "LLM first phrase"),
    ("tts_first_audio", "TTS first audio"), ("first_audio_sent", "first audio sent"),
    ("stt_compute", "STT compute"), ("llm_compute", "LLM compute (first phrase)"),
    ("tts_first_compute", "TTS compute (first phrase)"))


def _timing_column(name, label):
    @admin.display(description=label)
    def column(self, row):
        return ms_as_seconds(getattr(row, f"{name}_ms"))
    column.__name__ = f"{name}_display"
    return column


class SessionResponseInline(HistoryInline):
    """Each response: how it ended and its turn's latency, in seconds from the end of speech."""

    model = SessionResponse
    verbose_name_plural = "responses and turn latency (seconds after the end of the user's speech)"
    fields = ["at", "status", "reason", *(f"{name}_display" for name, _label in TIMING_COLUMNS)]
    readonly_fields = fields


for _name, _label in TIMING_COLUMNS:
    setattr(SessionResponseInline, f"{_name}_display", _timing_column(_name, _label))


@admin.register(Session)
class SessionAdmin(ReadOnlyAdmin):
    """Session history: the list, searchable by session id, API key and words said; each
    session's page with its conversation, responses and timings, and a JSON export."""

    list_display = ["session_id", "state_display", "end_reason", "created_at", "duration_display", "turns",
                    "completed_responses", "cancelled_responses", "first_audio_display", "errors", "api_key",
                    "process", "unit_index", "transport", "client_address"]
    list_filter = ["state", "end_reason", "transport", ("quarantined_at", admin.EmptyFieldListFilter), "process", "api_key"]
    search_fields = ["session_id", "api_key__name", "api_key__prefix", "items__text"]
    search_help_text = "A session id, an API key's name or prefix, or words said in the session."
    date_hierarchy = "created_at"
    list_select_related = ["process", "released_by", "api_key"]
    fieldsets = [
        (None, {"fields": ["session_id", "state_display", "end_reason", "close_code", "process", "unit_index",
                           "api_key", "transport", "client_address"]}),
        ("Life", {"fields": ["created_at", "ended_at", "duration_display", "release_after", "drained_at",
                             "quarantined_at", "released_at", "released_by"]}),
        ("Counts", {"fields": ["turns", "responses", "completed_responses", "cancelled_responses",
                               "first_audio_display", "audio_in_display", "audio_out_display", "errors",
                               "stage_failures", "last_error", "history_dropped"]}),
    ]
    inlines = [ConversationItemInline, SessionResponseInline]

    def change_view(self, request, object_id, form_url="", extra_context=None):
        """The session's page, with its timeline drawn (``pool.history.timeline``)."""
        session = self.get_object(request, unquote(object_id))
        if session is not None:
            extra_context = {**(extra_context or {}), "timeline": session_timeline(
                session.items.all(), session.response_records.all())}
        return super().change_view(request, object_id, form_url, extra_context)

    def get_urls(self):
        view = self.admin_site.admin_view
        return [path("<path:object_id>/export/", view(self.export_view), name="pool_session_export"),
                path("<path:object_id>/recording/<str:side>/", view(self.recording_view),
                     name="pool_session_recording"),
                *super().get_urls()]

    def recording_view(self, request, object_id, side):
        """One side ("user" or "assistant") of a session's recording, as FLAC, for users with
        the ``pool.listen_recording`` permission (``?download=1``: as an attachment)."""
        if side not in ("user", "assistant") or not request.user.has_perm("pool.listen_recording"):
            raise PermissionDenied
        session = self._session_or_404(request, object_id)
        recording = getattr(session, f"{side}_audio")
        if not recording:
            raise Http404("No recording.")
        return FileResponse(recording.open("rb"), content_type="audio/flac",
                            as_attachment=bool(request.GET.get("download")),
                            filename=f"{session.session_id}-{side}.flac")

    def export_view(self, request, object_id):
        """The session as JSON: its record, its items in the Realtime API's item shape, the
        errors it was sent, what was heard over the assistant and how it was taken, and its
        responses with their timings."""
        session = self._session_or_404(request, object_id)
        if not self.has_view_permission(request, session):
            raise PermissionDenied
        items = list(session.items.all())
        body = {
            "session": {f.name: f.value_to_string(session) if isinstance(f, FileField) else f.value_from_object(session)
                        for f in Session._meta.concrete_fields if f.name not in ("process", "released_by", "api_key")},
            "items": [item.data for item in items if item.kind not in (ConversationItem.ERROR, ConversationItem.OVERLAP)],
            "errors": [{"event_id": item.item_id, "at_ms": item.at_ms, "error": item.data}
                       for item in items if item.kind == ConversationItem.ERROR],
            "overlaps": [{"at_ms": item.at_ms, "audio_start_ms": item.audio_start_ms, "audio_end_ms": item.audio_end_ms,
                          **item.data} for item in items if item.kind == ConversationItem.OVERLAP],
            "responses": list(session.response_records.values(
                "response_id", "status", "reason", "at_ms", "input_tokens", "output_tokens", *timings.FIELDS)),
        }
        response = JsonResponse(body, json_dumps_params={"indent": 2})
        response["Content-Disposition"] = f'attachment; filename="{session.session_id}.json"'
        return response

    def _session_or_404(self, request, object_id):
        """The session of a URL's ``object_id`` (quoted as the admin quotes it), or a 404 for one
        that is not there or not a session's id at all (``abc``, ``../..``)."""
        session = self.get_object(request, unquote(object_id))
        if session is None:
            raise Http404("No such session.")
        return session

    @admin.display(description="state", ordering="state")
    def state_display(self, session):
        return state_badge(session.state)

    @admin.display(description="duration")
    def duration_display(self, session):
        return seconds(session.duration)

    @admin.display(description="first audio p50", ordering="first_audio_p50_ms")
    def first_audio_display(self, session):
        return ms_as_seconds(session.first_audio_p50_ms)

    @admin.display(description="audio in")
    def audio_in_display(self, session):
        return seconds(session.audio_in_seconds)

    @admin.display(description="audio out")
    def audio_out_display(self, session):
        return seconds(session.audio_out_seconds)


@admin.action(permissions=["change"], description="Revoke the selected API keys")
def revoke_keys(modeladmin, request, queryset):
    count = queryset.filter(revoked_at__isnull=True).update(revoked_at=timezone.now())
    modeladmin.message_user(request, f"Revoked {count} keys; sessions already open go on until they end.")


@admin.register(APIKey)
class APIKeyAdmin(admin.ModelAdmin):
    """Issue keys (shown once, in the message after saving) and revoke them."""

    list_display = ["name", "prefix", "user", "max_sessions", "record_audio", "created_at", "revoked_at"]
    list_filter = [("revoked_at", admin.EmptyFieldListFilter)]
    search_fields = ["name", "prefix", "user__username"]
    fields = ["name", "user", "max_sessions", "record_audio"]
    actions = [revoke_keys]

    def save_model(self, request, obj, form, change):
        if not change:
            key = obj.set_new_key()
            self.message_user(request, f"The new key is {key} - copy it now: it is stored hashed and "
                                       "cannot be shown again.", messages.WARNING)
        super().save_model(request, obj, form, change)

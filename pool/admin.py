"""The pool console in the Django admin: live units, quarantined units, session history."""

from django.contrib import admin, messages
from django.utils import timezone
from django.utils.html import format_html

from . import control
from .auth import new_key
from .models import APIKey, QuarantinedUnit, ServerProcess, Session, Unit

STATE_COLOURS = {"idle": "#2e7d32", "active": "#1565c0", "draining": "#ef6c00",
                 "quarantined": "#c62828", "lost": "#6d4c41"}


def state_badge(state):
    colour = STATE_COLOURS.get(state, "#555")
    weight = "bold" if state == "quarantined" else "normal"
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


@admin.action(permissions=["release"], description="Release the selected quarantined units")
def release_units(modeladmin, request, queryset):
    for unit in queryset.select_related("process"):
        ok, message = control.release_unit(unit, request.user)
        modeladmin.message_user(request, message, messages.SUCCESS if ok else messages.ERROR)


class UnitAdmin(ReadOnlyAdmin):
    """The pool page: every unit of every running process."""

    list_display = ["__str__", "state_display", "session_id", "state_since", "process_heartbeat"]
    list_filter = ["state", "process"]
    actions = [release_units]

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("process").filter(
            process__state=ServerProcess.RUNNING)

    @admin.display(description="state", ordering="state")
    def state_display(self, unit):
        return state_badge(unit.state)

    @admin.display(description="process heartbeat")
    def process_heartbeat(self, unit):
        return unit.process.heartbeat_at

    def has_release_permission(self, request):
        return request.user.has_perm("pool.release_unit")


admin.site.register(Unit, UnitAdmin)
admin.site.register(QuarantinedUnit, UnitAdmin)


@admin.register(ServerProcess)
class ServerProcessAdmin(ReadOnlyAdmin):
    list_display = ["__str__", "state", "pool_size", "started_at", "heartbeat_at", "longest_heartbeat_gap",
                    "stopped_at"]
    list_filter = ["state", "host"]


@admin.register(Session)
class SessionAdmin(ReadOnlyAdmin):
    """Session history: read-only, filterable, searchable by session id."""

    list_display = ["session_id", "state_display", "end_reason", "process", "unit_index", "created_at",
                    "ended_at", "turns", "responses", "errors", "quarantined_at", "released_by", "api_key",
                    "client_address"]
    list_filter = ["state", "end_reason", ("quarantined_at", admin.EmptyFieldListFilter), "process", "api_key"]
    search_fields = ["session_id"]
    date_hierarchy = "created_at"
    list_select_related = ["process", "released_by", "api_key"]

    @admin.display(description="state", ordering="state")
    def state_display(self, session):
        return state_badge(session.state)


@admin.action(description="Revoke the selected API keys")
def revoke_keys(modeladmin, request, queryset):
    count = queryset.filter(revoked_at__isnull=True).update(revoked_at=timezone.now())
    modeladmin.message_user(request, f"Revoked {count} keys; sessions already open go on until they end.")


@admin.register(APIKey)
class APIKeyAdmin(admin.ModelAdmin):
    """Issue keys (shown once, in the message after saving) and revoke them."""

    list_display = ["name", "prefix", "user", "max_sessions", "created_at", "revoked_at"]
    list_filter = [("revoked_at", admin.EmptyFieldListFilter)]
    search_fields = ["name", "prefix", "user__username"]
    fields = ["name", "user", "max_sessions"]
    actions = [revoke_keys]

    def save_model(self, request, obj, form, change):
        if not change:
            key, obj.key_hash = new_key()
            obj.prefix = key[:12]
            self.message_user(request, f"The new key is {key} - copy it now: it is stored hashed and "
                                       "cannot be shown again.", messages.WARNING)
        super().save_model(request, obj, form, change)

"""System checks: what a host project misconfigured, said before the first client connects."""

import difflib
import importlib.util
import ipaddress

from django.conf import settings
from django.core.checks import Error, Tags, Warning, register

from pool.backends import InvalidBackendError, backend_loader
from pool.backends.cache import PRESETS, TTS_VARIANTS
from pool.states import LIVE_PROCESS_STATES

IN_MEMORY_LAYER = "channels.layers.InMemoryChannelLayer"


@register()
def check_settings(app_configs, **kwargs):
    """``settings.S2S``: an unknown key is a warning with the nearest known one, a value of the
    wrong type an error (as ``debug_toolbar.apps.check_settings`` holds DEBUG_TOOLBAR_CONFIG)."""
    from pool.backends.stt import MIN_WINDOW_SECONDS
    from pool.conf import DEFAULTS, OPTIONAL, expected_type

    user = getattr(settings, "S2S", {})
    if not isinstance(user, dict):
        return [Error("settings.S2S must be a dict.", id="pool.E004")]
    problems = []
    for key, value in user.items():
        if key not in DEFAULTS:
            near = difflib.get_close_matches(key, DEFAULTS, n=1)
            problems.append(Warning(f"S2S has an unknown key {key!r}.", id="pool.W003",
                                    hint=f"Did you mean {near[0]!r}?" if near else "The keys are in pool/conf.py."))
            continue
        kinds = expected_type(key)
        wrong_bool = isinstance(value, bool) and kinds is not bool
        if (value is None and key in OPTIONAL) or (isinstance(value, kinds) and not wrong_bool):
            continue
        names = " or ".join(k.__name__ for k in (kinds if isinstance(kinds, tuple) else (kinds,)))
        hint = None
        if key == "ALLOW_ANONYMOUS" and value == "loopback":
            hint = ("'loopback' is gone: behind a reverse proxy on the same host every client is on "
                    "loopback. Use True only for a machine of your own (runpool --allow-anonymous).")
        problems.append(Error(f"S2S[{key!r}] must be {names}{' or None' if key in OPTIONAL else ''}; "
                              f"got {value!r}.", hint=hint, id="pool.E005"))
    threads = user.get("THREADS")
    for stage, count in (threads.items() if isinstance(threads, dict) else ()):
        if stage == "blas" and count in (None, "auto"):  # the BLAS's own count; timed on this CPU
            continue
        if stage not in DEFAULTS["THREADS"] or isinstance(count, bool) or not isinstance(count, int) or count < 1:
            problems.append(Error(f"S2S['THREADS'][{stage!r}] = {count!r}: the keys are "
                                  f"{', '.join(DEFAULTS['THREADS'])}, each a thread count of 1 or more "
                                  "(\"blas\" may be None or \"auto\").",
                                  id="pool.E005"))
    for key in POSITIVE:
        value = user.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value <= 0:
            problems.append(Error(f"S2S[{key!r}] must be more than 0; got {value!r}.",
                                  hint="None turns the limit off." if key in OPTIONAL else None, id="pool.E005"))
    for key in ("ALLOWED_ORIGINS", "TRUSTED_PROXIES", "BACKCHANNEL_WORDS"):
        entries = user.get(key)
        if isinstance(entries, (list, tuple)) and not all(isinstance(e, str) for e in entries):
            problems.append(Error(f"S2S[{key!r}] must hold strings; got {entries!r}.", id="pool.E005"))
    problems += _check_proxies(user)
    if user.get("PRESET", "english") not in PRESETS:
        problems.append(Error(f"S2S['PRESET'] must be one of {', '.join(PRESETS)}; got {user['PRESET']!r}.",
                              id="pool.E008"))
    if user.get("TTS_VARIANT", "auto") not in ("auto", *TTS_VARIANTS):
        choices = ", ".join(repr(v) for v in ("auto", *TTS_VARIANTS))
        problems.append(Error(f"S2S['TTS_VARIANT'] must be one of {choices}; got {user['TTS_VARIANT']!r}.",
                              id="pool.E005"))
    if user.get("PEEK_WINDOW_FLOOR_S") not in (None, 0, MIN_WINDOW_SECONDS):
        problems.append(Error(f"S2S['PEEK_WINDOW_FLOOR_S'] must be None, 0 or {MIN_WINDOW_SECONDS}; got "
                              f"{user['PEEK_WINDOW_FLOOR_S']!r}.",
                              hint="None: the one prepare_models chose for this CPU.", id="pool.E005"))
    if user.get("LLM_TOOL_CALLS", "auto") not in ("auto", "native", "prompt"):
        problems.append(Error("S2S['LLM_TOOL_CALLS'] must be 'auto', 'native' or 'prompt'; got "
                              f"{user['LLM_TOOL_CALLS']!r}.", id="pool.E005"))
    if user.get("HISTORY_ON_USER_DELETE", "anonymise") not in ("anonymise", "delete"):
        problems.append(Error("S2S['HISTORY_ON_USER_DELETE'] must be 'anonymise' or 'delete'; got "
                              f"{user['HISTORY_ON_USER_DELETE']!r}.", id="pool.E005"))
    if isinstance(user.get("BACKEND"), str):
        try:
            backend_loader(user["BACKEND"])
        except InvalidBackendError as exc:
            problems.append(Error(str(exc), id="pool.E007"))
    return problems


# Numbers that must be more than 0 when set (0 would refuse every client or end every session).
POSITIVE = ("POOL_SIZE", "COMPUTE_RUNS_AT_ONCE", "LLM_TIMEOUT_SECONDS", "RELEASE_AFTER_SECONDS", "CLAIM_WAIT_SECONDS", "IDLE_TIMEOUT_SECONDS",
            "HEARTBEAT_SECONDS", "LOST_AFTER_SECONDS", "CONNECTS_PER_MINUTE", "MAX_SESSION_SECONDS",
            "SLOW_CLIENT_SECONDS", "MAX_MESSAGE_BYTES", "LLM_MAX_OUTPUT_TOKENS", "LLM_CONTEXT_CHARS",
            "HISTORY_RETENTION_DAYS", "RECORDING_RETENTION_DAYS")


def _check_proxies(user):
    problems = []
    header = user.get("PROXY_ADDRESS_HEADER", "X-Forwarded-For")
    if str(header).lower() not in ("x-forwarded-for", "forwarded"):
        problems.append(Error(f"S2S['PROXY_ADDRESS_HEADER'] must be 'X-Forwarded-For' or 'Forwarded'; "
                              f"got {header!r}.", id="pool.E006"))
    proxies = user.get("TRUSTED_PROXIES") or []
    if not isinstance(proxies, (list, tuple)):
        return problems  # the type error above says it
    for entry in proxies:
        try:
            network = ipaddress.ip_network(entry, strict=False)
        except (TypeError, ValueError):
            problems.append(Error(f"S2S['TRUSTED_PROXIES'] has {entry!r}, not an address or network.",
                                  hint='e.g. "127.0.0.1", "10.0.0.0/8", "::1"', id="pool.E006"))
            continue
        if network.prefixlen == 0:
            problems.append(Warning(f"S2S['TRUSTED_PROXIES'] has {entry!r}: every client is trusted to "
                                    "name its own address.", hint="List your proxies' addresses.",
                                    id="pool.W004"))
    return problems


@register()
def check_serving(app_configs, **kwargs):
    problems = []
    if importlib.util.find_spec("daphne") is None:
        problems.append(Error("Daphne is not installed.", hint="pip install daphne; runpool serves with it.",
                              id="pool.E001"))
    if not getattr(settings, "ASGI_APPLICATION", None):
        problems.append(Error("ASGI_APPLICATION is not set.",
                              hint="Point it at an application whose 'websocket' protocol routes "
                                   "realtime.routing.websocket_urlpatterns.", id="pool.E002"))
    if "channels" not in settings.INSTALLED_APPS:
        problems.append(Error("'channels' is not in INSTALLED_APPS.", id="pool.E003"))
    layers = getattr(settings, "CHANNEL_LAYERS", None) or {}
    if "default" not in layers:
        problems.append(Warning("No default channel layer (CHANNEL_LAYERS).",
                                hint="Without one, the admin can release units only of the process that "
                                     "serves it. Use channels_redis with several processes.", id="pool.W002"))
    return problems


@register(Tags.database)
def check_layer_shared(app_configs, **kwargs):
    """Several live processes on an in-memory channel layer cannot reach each other."""
    layer = (getattr(settings, "CHANNEL_LAYERS", None) or {}).get("default", {})
    if layer.get("BACKEND") != IN_MEMORY_LAYER:
        return []
    from django.db import DatabaseError

    from pool.models import ServerProcess

    try:
        running = ServerProcess.objects.filter(state__in=LIVE_PROCESS_STATES).count()
    except DatabaseError:  # not migrated yet (this check also runs during migrate)
        return []
    if running > 1:
        return [Warning(f"{running} server processes are running on the in-memory channel layer.",
                        hint="Operator commands cannot cross processes: set CHANNEL_LAYERS to "
                             "channels_redis (REDIS_URL) for more than one process.", id="pool.W001")]
    return []

"""System checks: what a host project misconfigured, said before the first client connects."""

import importlib.util

from django.conf import settings
from django.core.checks import Error, Tags, Warning, register

IN_MEMORY_LAYER = "channels.layers.InMemoryChannelLayer"


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

    from .models import ServerProcess

    try:
        running = ServerProcess.objects.filter(state=ServerProcess.RUNNING).count()
    except DatabaseError:  # not migrated yet (this check also runs during migrate)
        return []
    if running > 1:
        return [Warning(f"{running} server processes are running on the in-memory channel layer.",
                        hint="Operator commands cannot cross processes: set CHANNEL_LAYERS to "
                             "channels_redis (REDIS_URL) for more than one process.", id="pool.W001")]
    return []

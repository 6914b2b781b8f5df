"""ASGI entry point: HTTP through Django, WebSocket through the Realtime protocol's routes."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "s2s_project.settings")
django_asgi_app = get_asgi_application()  # before importing consumers: it sets Django up

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from pool.asgi import HealthCheckMiddleware  # noqa: E402
from realtime.routing import refuse_unknown, websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter({
    "http": HealthCheckMiddleware(django_asgi_app),
    "websocket": URLRouter([*websocket_urlpatterns, refuse_unknown]),
})

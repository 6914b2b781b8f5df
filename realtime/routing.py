"""WebSocket URL patterns of the Realtime protocol; a host project mounts them where it likes."""

from django.urls import path

from .consumers import RealtimeConsumer

websocket_urlpatterns = [
    path("v1/realtime", RealtimeConsumer.as_asgi()),
]

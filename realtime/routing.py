"""WebSocket URL patterns of the Realtime protocol; a host project mounts them where it likes.

``refuse`` answers any other WebSocket path: a host puts it last in its router, so a socket to a
path nobody serves is refused at the handshake (Daphne answers HTTP 403) instead of raising
"No route found" (HTTP 500 and a traceback).
"""

from django.urls import path, re_path

from realtime.consumers import RealtimeConsumer

websocket_urlpatterns = [
    path("v1/realtime", RealtimeConsumer.as_asgi()),
]


async def refuse(scope, receive, send):
    """An ASGI app that refuses a WebSocket before accepting it (close 1008: no such path)."""
    if scope["type"] == "websocket" and (await receive())["type"] == "websocket.connect":
        await send({"type": "websocket.close", "code": 1008})


refuse_unknown = re_path(r"", refuse)  # the last pattern of a WebSocket router

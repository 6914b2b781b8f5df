"""An ASGI fast path for ``GET /healthz``: answered on the event loop, without Django.

A health probe should measure the server, not queue behind Django's thread pool and sync
middleware; under load (dozens of sessions) the Django view took hundreds of milliseconds while
the event loop itself was answering appends in time (BENCHMARKS.md, listening capacity).
"""

import json

from pool.views import health_payload


class HealthCheckMiddleware:
    """Wraps an HTTP ASGI app; ``path`` (default ``/healthz``) is answered here."""

    def __init__(self, app, path="/healthz"):
        self.app = app
        self.path = path

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] != self.path or scope["method"] not in ("GET", "HEAD"):
            return await self.app(scope, receive, send)
        status, payload = health_payload()
        body = json.dumps(payload).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body if scope["method"] == "GET" else b""})

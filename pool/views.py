"""HTTP views of the pool: a health check and the pool status for monitoring."""

import hmac
import time

from django.http import JsonResponse

from .conf import get_config
from .registry import get_registry


def health(request):
    """``GET /healthz``: 200 with the number of units and free units once the pool is built."""
    units = get_registry().snapshot()
    return JsonResponse({"status": "ok", "pool_size": len(units),
                         "idle": sum(u["state"] == "idle" for u in units)})


def _may_read_status(request):
    if request.user.is_authenticated and request.user.is_staff:
        return True
    token = get_config()["STATUS_TOKEN"]
    header = request.headers.get("Authorization", "")
    return bool(token) and header.startswith("Bearer ") and hmac.compare_digest(header[7:], token)


def pool_status(request):
    """``GET /v1/pool``: this process's pool, for staff users or the ``STATUS_TOKEN`` bearer.

    ``{"pool_size", "process_id", "accepting", "units": [{"index", "state", "session_id",
    "state_since" (Unix seconds), "seconds_in_state"}]}``; 403 JSON for anyone else.
    """
    if not _may_read_status(request):
        return JsonResponse({"error": {"code": "forbidden", "message": "Staff or STATUS_TOKEN only."}},
                            status=403)
    registry = get_registry()
    now = time.time()
    units = [{**u, "seconds_in_state": round(now - u["state_since"], 3)} for u in registry.snapshot()]
    return JsonResponse({"pool_size": len(units), "process_id": registry.records.process_id,
                         "accepting": registry.accepting, "units": units})

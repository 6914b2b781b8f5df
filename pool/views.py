"""HTTP views of the pool: a health check, the pool status and the Prometheus metrics."""

import hmac
import time

from django.http import HttpResponse, JsonResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from pool.conf import get_config
from pool.process import get_registry
from pool.states import UnitState


def health_payload():
    """``(HTTP status, {"status", "pool_size", "idle"})`` of this process's pool (built if need
    be): 200 and "ok" while it takes sessions; 503 and "draining" (``drain_process``, SIGTERM)
    or "stopping" once it does not, so that a load balancer's health check takes it out."""
    registry = get_registry()
    units = registry.snapshot()
    status = "stopping" if not registry.accepting else "draining" if registry.process_draining else "ok"
    return (200 if status == "ok" else 503,
            {"status": status, "pool_size": len(units), "idle": sum(u["state"] == UnitState.IDLE for u in units)})


def health(request):
    """``GET /healthz``: the number of units and free units once the pool is built; 503 while
    the process drains or stops (``health_payload``).

    The stand-alone project answers this path on the event loop (``pool.asgi``); a host site gets
    the same answer from this view wherever it mounts ``pool.urls``.
    """
    status, body = health_payload()
    return JsonResponse(body, status=status)


def _may_read_status(request):
    if request.user.is_authenticated and request.user.is_staff:
        return True
    token = get_config()["STATUS_TOKEN"]
    header = request.headers.get("Authorization", "")
    return bool(token) and header.startswith("Bearer ") and hmac.compare_digest(header[7:], token)


def _forbidden():
    return JsonResponse({"error": {"code": "forbidden", "message": "Staff or STATUS_TOKEN only."}}, status=403)


def pool_status(request):
    """``GET /v1/pool``: this process's pool, for staff users or the ``STATUS_TOKEN`` bearer.

    ``{"pool_size", "process_id", "accepting", "draining" (``manage.py drain_process``), "units": [{"index", "state", "session_id",
    "state_since" (Unix seconds), "seconds_in_state", "input_lag_max_ms"}], "transcription_languages",
    "voice_languages", "voices"}`` (what the loaded models hear and speak); 403 for others.
    """
    if not _may_read_status(request):
        return _forbidden()
    registry = get_registry()
    now = time.time()
    units = [{**u, "seconds_in_state": round(now - u["state_since"], 3)} for u in registry.snapshot()]
    return JsonResponse({"pool_size": len(units), "process_id": registry.records.process_id,
                         "accepting": registry.accepting, "draining": registry.process_draining,
                         "units": units, **registry.speaks})


def metrics(request):
    """``GET /metrics``: Prometheus text format, for staff users or the ``STATUS_TOKEN`` bearer."""
    if not _may_read_status(request):
        return _forbidden()
    get_registry()  # the unit gauges exist once the pool does
    return HttpResponse(generate_latest(), content_type=CONTENT_TYPE_LATEST)

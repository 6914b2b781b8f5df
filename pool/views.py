"""HTTP views of the pool."""

from django.http import JsonResponse

from .registry import get_registry


def health(request):
    """``GET /healthz``: 200 with the number of units and free units once the pool is built."""
    units = get_registry().snapshot()
    return JsonResponse({"status": "ok", "pool_size": len(units),
                         "idle": sum(u["state"] == "idle" for u in units)})

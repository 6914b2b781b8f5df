"""Client secrets: a short-lived ``ek_`` value that opens one session on a unit reserved for it.

``POST /v1/realtime/client_secrets`` is OpenAI's endpoint, for an app's backend holding an API key
(``Authorization: Bearer <key>``); ``POST /client_secret`` is the same for a logged-in user of the
site (the browser page, a host site's own pages), protected by the site's login and CSRF.

Request (OpenAI's shape, both optional)::

    {"expires_after": {"anchor": "created_at", "seconds": 600},
     "session": {<the fields of session.update>}}

Answer 200::

    {"value": "ek_...", "expires_at": <Unix seconds>, "session": {<the session it starts with>},
     "connect_url": "wss://.../v1/realtime"}

``connect_url`` is ours (``docs/PROTOCOL.md``): the process that holds the reserved unit. Errors
have OpenAI's body ``{"error": {"message", "type", "param", "code"}}``: 400 for a bad request,
401 for a missing or bad key, 403 for a user not logged in, 429 with ``Retry-After`` when no unit
is free anywhere or the key holds its ``max_sessions``.
"""

import json
from datetime import timedelta

from django.db import DatabaseError
from django.http import JsonResponse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from pool import admission, auth
from pool.conf import get_config
from pool.registry import get_registry

from . import session_config as sc
from .errors import ProtocolError

RETRY_AFTER_SECONDS = 2  # a full cluster: units free up as sessions end and secrets expire


def _error(status, code, message, param=None, kind="invalid_request_error", headers=None):
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return JsonResponse(body, status=status, headers=headers)


@csrf_exempt  # authenticated by the API key in a header, which a browser does not send by itself
@require_POST
def create(request):
    """``POST /v1/realtime/client_secrets`` with an API key (see the module docstring)."""
    key = auth.bearer_token(request.headers.get("Authorization"))
    api_key = None
    if key is not None and auth.is_server_key(key):
        try:
            api_key, refusal = auth.check_key(key, None)
        except DatabaseError:
            return _error(503, "database_unavailable", "The server cannot check API keys right now.",
                          kind="server_error")
        if refusal is not None:
            return _error(401, refusal.code, refusal.message)
    elif not auth.anonymous_allowed():
        return _error(401, "invalid_api_key" if key else "missing_api_key",
                      "An API key is required: send 'Authorization: Bearer <key>'.")
    return issue(request, api_key=api_key)


@require_POST
def create_for_user(request):
    """``POST /client_secret``: a secret for the logged-in user of the site (403 otherwise).

    Django's session login and CSRF protect it; a host site that wants other rules mounts
    ``issue`` behind its own view."""
    if not (request.user.is_authenticated and request.user.is_active):
        return _error(403, "login_required", "Log in to this site to talk to its voice agent.")
    return issue(request, user=request.user)


def issue(request, api_key=None, user=None):
    """Validate the request body, reserve a unit (``pool.admission.issue``) and answer."""
    config = get_config()
    try:
        body = json.loads(request.body or b"{}")
        if not isinstance(body, dict):
            raise ProtocolError("invalid_type", "The request body must be a JSON object.")
        seconds = _expires_after(body.get("expires_after"), config)
        update = body.get("session") or {}
        registry = get_registry()
        defaults = sc.session_defaults(config, registry.speaks)
        session = sc.apply_update(sc.default_session("", defaults["model"], defaults["instructions"],
                                                     defaults["voice"], defaults["turn_detection"]), update)
        if session["type"] != "realtime":
            raise ProtocolError("invalid_value", "Only realtime sessions are served here.", param="session.type")
        sc.check_languages(session, registry.speaks)
    except ValueError:
        return _error(400, "invalid_json", "The request body is not valid JSON.")
    except ProtocolError as error:
        return _error(400, error.code, error.message, error.param)
    expires_at = timezone.now() + timedelta(seconds=seconds)
    local = registry.records.process_id
    try:
        granted = admission.issue(update, expires_at, config["HEARTBEAT_SECONDS"], api_key, user, local)
    except admission.KeyLimitError:
        return _error(429, "session_limit_reached", f"This API key may hold {api_key.max_sessions} sessions "
                      "(and unused client secrets) at once.", kind="rate_limit_error",
                      headers={"Retry-After": str(RETRY_AFTER_SECONDS)})
    except DatabaseError:
        return _error(503, "database_unavailable", "The server cannot reserve a unit right now.",
                      kind="server_error", headers={"Retry-After": str(RETRY_AFTER_SECONDS)})
    if granted is None:
        return _error(429, "session_limit_reached", "Every unit of every server process is busy or "
                      "reserved; try again shortly.", kind="rate_limit_error",
                      headers={"Retry-After": str(RETRY_AFTER_SECONDS)})
    secret, value = granted
    session.pop("id", None)  # a session's id is given when it starts
    return JsonResponse({"value": value, "expires_at": int(expires_at.timestamp()), "session": session,
                         "connect_url": _connect_url(request, secret.process, config)})


def _expires_after(value, config):
    """Seconds a new secret lives. Raises ProtocolError."""
    if value is None:
        return config["CLIENT_SECRET_SECONDS"]
    param = "expires_after"
    if not isinstance(value, dict):
        raise ProtocolError("invalid_type", "'expires_after' must be an object.", param=param)
    if value.get("anchor", "created_at") != "created_at":
        raise ProtocolError("invalid_value", "expires_after.anchor must be 'created_at'.", param=f"{param}.anchor")
    seconds, longest = value.get("seconds", config["CLIENT_SECRET_SECONDS"]), config["CLIENT_SECRET_MAX_SECONDS"]
    if isinstance(seconds, bool) or not isinstance(seconds, int) or not 1 <= seconds <= longest:
        raise ProtocolError("invalid_value", f"expires_after.seconds must be a whole number from 1 to {longest}.",
                            param=f"{param}.seconds")
    return seconds


def _connect_url(request, process, config):
    """The WebSocket URL of ``process``'s endpoint: its PUBLIC_URL, or for a process that
    advertises none (only ever the answering one), the address this request came to."""
    base = process.public_url.rstrip("/")
    if not base:
        base = f"{'wss' if request.is_secure() else 'ws'}://{request.get_host()}"
    return base + config["REALTIME_PATH"]

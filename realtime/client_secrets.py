"""Client secrets: a short-lived ``ek_`` value that opens one session on a unit reserved for it.

``POST /v1/realtime/client_secrets`` is OpenAI's endpoint, for an app's backend holding an API key
(``Authorization: Bearer <key>``); ``POST /client_secret`` is the same for a logged-in user of the
site (the browser page, a host site's own pages), protected by the site's login and CSRF.

Request (OpenAI's shape, both optional)::

    {"expires_after": {"anchor": "created_at", "seconds": 600},
     "session": {<the fields of session.update>}}

Answer 200::

    {"value": "ek_...", "expires_at": <Unix seconds>, "session": {<the session it starts with>},
     "connect_url": "wss://.../v1/realtime", "calls_url": "https://.../v1/realtime/calls"}

``connect_url`` is ours (``docs/PROTOCOL.md``): the process that holds the reserved unit. Errors
have OpenAI's body ``{"error": {"message", "type", "param", "code"}}``: 400 for a bad request,
401 for a missing or bad key, 403 for a user not logged in, 405 for another method, 413 for a
body over Django's DATA_UPLOAD_MAX_MEMORY_SIZE, 429 with ``Retry-After`` when no unit is free
anywhere or the key holds its ``max_sessions`` (a user or an anonymous address: its
CLIENT_SECRETS_PER_USER unused secrets), 500 for a bug (logged). Secrets issued without a key
live at most USER_CLIENT_SECRET_SECONDS.
"""

import logging
from datetime import timedelta

from django.core.exceptions import RequestDataTooBig
from django.db import DatabaseError
from django.http import JsonResponse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt

from pool.access import admission, auth, keys
from pool.conf import get_config
from pool.process import get_registry
from realtime import session_config as sc
from realtime.errors import ProtocolError
from realtime.events import loads

log = logging.getLogger(__name__)

RETRY_AFTER_SECONDS = 2  # a full cluster: units free up as sessions end and secrets expire


def error_response(status, code, message, param=None, kind="invalid_request_error", headers=None):
    """An answer with OpenAI's HTTP error body (``{"error": {"message", "type", "param", "code"}}``)."""
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return JsonResponse(body, status=status, headers=headers)


def _post_only(view):
    """405 with OpenAI's error body for any method but POST."""
    def wrapper(request):
        if request.method != "POST":
            return error_response(405, "method_not_allowed", "Use POST.", headers={"Allow": "POST"})
        return view(request)

    wrapper.__doc__, wrapper.__name__ = view.__doc__, view.__name__
    return wrapper


@csrf_exempt  # authenticated by the API key in a header, which a browser does not send by itself
@_post_only
def create(request):
    """``POST /v1/realtime/client_secrets`` with an API key (see the module docstring)."""
    key = auth.bearer_token(request.headers.get("Authorization"))
    api_key = None
    if key is not None and keys.is_server_key(key):
        try:
            api_key, refusal = auth.check_key(key, None)
        except DatabaseError:
            return error_response(503, "database_unavailable", "The server cannot check API keys right now.",
                          kind="server_error")
        if refusal is not None:
            return error_response(401, refusal.code, refusal.message)
    elif not auth.anonymous_allowed():
        return error_response(401, "invalid_api_key" if key else "missing_api_key",
                      "An API key is required: send 'Authorization: Bearer <key>'.")
    return issue(request, api_key=api_key)


@_post_only
def create_for_user(request):
    """``POST /client_secret``: a secret for the logged-in user of the site (403 otherwise).

    Django's session login and CSRF protect it; a host site that wants other rules mounts
    ``issue`` behind its own view."""
    if not (request.user.is_authenticated and request.user.is_active):
        return error_response(403, "login_required", "Log in to this site to talk to its voice agent.")
    return issue(request, user=request.user)


def issue(request, api_key=None, user=None):
    """Validate the request body, reserve a unit (``pool.access.admission.issue``) and answer. Any
    failure is an answer with OpenAI's error body, never Django's error page."""
    try:
        return _issue(request, api_key, user)
    except Exception:  # noqa: BLE001 - a bug answers as OpenAI's API would, and is logged
        log.exception("client secret request failed")
        return error_response(500, "server_error", "The server failed to issue a client secret.", kind="server_error")


def _issue(request, api_key, user):
    config = get_config()
    try:
        body = loads(request.body or b"{}")
        if not isinstance(body, dict):
            raise ProtocolError("invalid_type", "The request body must be a JSON object.")
        keyless = api_key is None
        seconds = _expires_after(body.get("expires_after"), config, keyless)
        update = body.get("session", {})
        if not isinstance(update, dict):
            raise ProtocolError("invalid_type", "'session' must be an object.", param="session")
        registry = get_registry()
        session = sc.apply_update(sc.session_defaults(config, registry.speaks).session(""), update)
        if session["type"] != "realtime":
            raise ProtocolError("invalid_value", "Only realtime sessions are served here.", param="session.type")
        sc.check_languages(session, registry.speaks)
        sc.check_mcp_hosts(session, config["MCP_SERVER_HOSTS"])
    except RequestDataTooBig:
        return error_response(413, "request_too_large", "The request body is too large.")
    except ProtocolError as error:
        return error_response(400, error.code, error.message, error.param)
    expires_at = timezone.now() + timedelta(seconds=seconds)
    local = registry.records.process_id
    try:
        granted = admission.issue(update, expires_at, config["HEARTBEAT_SECONDS"], api_key, user, local,
                                  _client_address(request), None if api_key else config["CLIENT_SECRETS_PER_USER"])
    except admission.KeyLimitError:
        held = (f"This API key may hold {api_key.max_sessions} sessions (and unused client secrets)" if api_key
                else f"You may hold {config['CLIENT_SECRETS_PER_USER']} unused client secrets")
        return error_response(429, "session_limit_reached", f"{held} at once.", kind="rate_limit_error",
                      headers={"Retry-After": str(RETRY_AFTER_SECONDS)})
    except DatabaseError:
        return error_response(503, "database_unavailable", "The server cannot reserve a unit right now.",
                      kind="server_error", headers={"Retry-After": str(RETRY_AFTER_SECONDS)})
    if granted is None:
        return error_response(429, "session_limit_reached", "Every unit of every server process is busy or "
                      "reserved; try again shortly.", kind="rate_limit_error",
                      headers={"Retry-After": str(RETRY_AFTER_SECONDS)})
    secret, value = granted
    session.pop("id", None)  # a session's id is given when it starts
    connect_url = _connect_url(request, secret.process, config)
    return JsonResponse({"value": value, "expires_at": int(expires_at.timestamp()), "session": session,
                         "connect_url": connect_url, "calls_url": calls_url(connect_url)})


def _expires_after(value, config, keyless):
    """Seconds a new secret lives (``keyless``: issued without an API key, at most
    USER_CLIENT_SECRET_SECONDS). Raises ProtocolError."""
    default, longest = config["CLIENT_SECRET_SECONDS"], config["CLIENT_SECRET_MAX_SECONDS"]
    if keyless:
        default = longest = min(longest, config["USER_CLIENT_SECRET_SECONDS"])
    if value is None:
        return default
    param = "expires_after"
    if not isinstance(value, dict):
        raise ProtocolError("invalid_type", "'expires_after' must be an object.", param=param)
    if value.get("anchor", "created_at") != "created_at":
        raise ProtocolError("invalid_value", "expires_after.anchor must be 'created_at'.", param=f"{param}.anchor")
    seconds = value.get("seconds", default)
    if isinstance(seconds, bool) or not isinstance(seconds, int) or not 1 <= seconds <= longest:
        raise ProtocolError("invalid_value", f"expires_after.seconds must be a whole number from 1 to {longest}.",
                            param=f"{param}.seconds")
    return seconds


def _client_address(request):
    """The requester's address as ``pool.access.auth.client_address`` reads it (trusted proxies)."""
    scope = getattr(request, "scope", None)  # under ASGI
    if scope is not None:
        return auth.client_address(scope)
    return auth.client_address({"client": (request.META.get("REMOTE_ADDR"), 0), "headers": []})


def calls_url(connect_url):
    """The WebRTC endpoint (``POST .../calls``) of the process whose WebSocket is ``connect_url``."""
    scheme, rest = connect_url.split("://", 1)
    return f"{'https' if scheme == 'wss' else 'http'}://{rest}/calls"


def _connect_url(request, process, config):
    """The WebSocket URL of ``process``'s endpoint: its PUBLIC_URL, or for a process that
    advertises none (only ever the answering one), the address this request came to."""
    base = process.public_url.rstrip("/")
    if not base:
        base = f"{'wss' if request.is_secure() else 'ws'}://{request.get_host()}"
    return base + config["REALTIME_PATH"]

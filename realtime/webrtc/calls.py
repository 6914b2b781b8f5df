"""``POST /v1/realtime/calls``: OpenAI's WebRTC endpoint. The body is the client's SDP offer
(``Content-Type: application/sdp``), or a multipart form with ``sdp`` and ``session`` (the JSON of
a ``session.update`` body, checked as a client secret's is). Authorization as for the WebSocket:
``Authorization: Bearer`` with an API key or a client secret (``ek_...``), the same admission
(``pool.access.connect.admit``: keys, revocation, ``max_sessions``, reservations, the browser's
origin, the connect rate).

Answer ``201 Created``: the SDP answer (``application/sdp``) and ``Location:
/v1/realtime/calls/{call_id}`` (absolute, from the process's ``PUBLIC_URL``, when it has one). Refusals have OpenAI's error body before any media, with nothing
left claimed: 400 (a bad offer or session), 401 (no key, a bad key), 403 (an origin not
allowed), 429 (``session_limit_reached``, ``rate_limit_exceeded``; ``Retry-After``), 503 (the
process is stopping, the database is busy). ``POST /v1/realtime/calls/{call_id}/hangup`` ends
a call, with the credentials that opened it.
"""

import asyncio
import hmac
import logging

from aiortc import RTCPeerConnection, RTCSessionDescription
from aiortc.sdp import SessionDescription
from django.http import HttpResponse
from django.views.decorators.csrf import csrf_exempt

from pool.access.auth import Refusal
from pool.access.connect import Credentials
from pool.conf import get_config
from pool.ids import new_id
from pool.process import get_registry, local_registry
from pool.states import CloseCode, EndReason
from realtime import session_config as sc
from realtime.client_secrets import RETRY_AFTER_SECONDS, calls_url, error_response
from realtime.errors import ProtocolError
from realtime.events import loads
from realtime.session.lifecycle import open_session
from realtime.webrtc import network
from realtime.webrtc.call import CALLS, EVENTS_CHANNEL, WebRTCCall

log = logging.getLogger(__name__)

MAX_SDP_CHARS = 64 * 1024  # a browser's offer is 2-6 KB

# A refusal's HTTP status (its code as the WebSocket error event names it).
REFUSAL_STATUS = {"missing_api_key": 401, "invalid_api_key": 401, "origin_not_allowed": 403,
                  "session_limit_reached": 429, "rate_limit_exceeded": 429, "server_shutting_down": 503,
                  "database_unavailable": 503, "server_busy": 503}


@csrf_exempt  # authenticated by the key in a header, which a browser does not send by itself
async def create(request):
    """``POST /v1/realtime/calls`` (see the module docstring)."""
    if request.method != "POST":
        return error_response(405, "method_not_allowed", "Use POST.", headers={"Allow": "POST"})
    config = get_config()
    try:
        offer, update = _read_offer(request)
        registry = local_registry() or await asyncio.to_thread(get_registry)
        if update is not None:
            session = sc.apply_update(sc.session_defaults(config, registry.speaks).session(""), update)
            sc.check_languages(session, registry.speaks)
            sc.check_mcp_hosts(session, config["MCP_SERVER_HOSTS"])
    except ProtocolError as error:
        return error_response(400, error.code, error.message, error.param)

    network.use_host_addresses(config["WEBRTC_HOST_ADDRESSES"])
    pc = RTCPeerConnection(network.configuration(config["WEBRTC_ICE_SERVERS"]))
    call = WebRTCCall(new_id("rtc"), pc)
    try:
        await pc.setRemoteDescription(RTCSessionDescription(offer, "offer"))
    except Exception as exc:  # noqa: BLE001 - aiortc raises ValueError, KeyError, ... for offers it cannot take
        await pc.close()
        return error_response(400, "invalid_sdp", f"The SDP offer cannot be used: {exc}"[:300])

    credentials = Credentials.from_scope(request.scope)
    opened = await open_session(registry, credentials, call, request.GET.get("model", ""), update)
    if isinstance(opened, Refusal):
        await pc.close()
        status = REFUSAL_STATUS.get(opened.code, 400)
        retry = {"Retry-After": str(RETRY_AFTER_SECONDS)} if status in (429, 503) else None
        return error_response(status, opened.code, opened.message,
                              kind="rate_limit_error" if status == 429 else "invalid_request_error", headers=retry)
    call.key = credentials.key
    call.attach(opened)
    try:
        await pc.setLocalDescription(await pc.createAnswer())
    except Exception:  # noqa: BLE001 - the call cannot start: the session ends, its unit goes back
        log.exception("call %s: no SDP answer", call.id)
        await call.hangup(CloseCode.INTERNAL_ERROR, EndReason.ERROR)
        return error_response(500, "server_error", "The server could not answer the SDP offer.", kind="server_error")
    log.info("call %s: session %s over WebRTC", call.id, opened.id)
    # Behind a proxy that routes by prefix (deploy/Caddyfile), the process's PUBLIC_URL names
    # the way back to this process, for the call's hangup.
    public = (config["PUBLIC_URL"] or "").rstrip("/")
    calls = calls_url(public + config["REALTIME_PATH"]) if public else request.path.rstrip("/")
    return HttpResponse(pc.localDescription.sdp, status=201, content_type="application/sdp",
                        headers={"Location": f"{calls}/{call.id}"})


def _read_offer(request):
    """``(sdp, session update or None)`` of the request. Raises ProtocolError."""
    content_type = request.content_type or ""
    update = None
    if not request.body.strip():
        raise ProtocolError("invalid_sdp", "The SDP offer is empty.", param="sdp")
    if content_type == "multipart/form-data":
        sdp = request.POST.get("sdp", "")
        if "session" in request.POST:
            update = loads(request.POST["session"])
            if not isinstance(update, dict):
                raise ProtocolError("invalid_type", "'session' must be a JSON object.", param="session")
    elif content_type == "application/sdp":
        sdp = request.body.decode("utf-8", "replace")
    else:
        raise ProtocolError("invalid_request", "Send the SDP offer as application/sdp, or as the 'sdp' field "
                            "of a multipart form.")
    if not sdp.strip():
        raise ProtocolError("invalid_sdp", "The SDP offer is empty.", param="sdp")
    if len(sdp) > MAX_SDP_CHARS:
        raise ProtocolError("invalid_sdp", f"The SDP offer is over {MAX_SDP_CHARS} characters.", param="sdp")
    try:
        media = SessionDescription.parse(sdp).media
    except Exception as exc:  # noqa: BLE001 - the parser raises what it meets
        raise ProtocolError("invalid_sdp", f"The SDP offer does not parse: {exc}"[:300], param="sdp") from None
    if not any(m.kind == "audio" for m in media) or not any(m.kind == "application" for m in media):
        raise ProtocolError("invalid_sdp", f"The SDP offer needs an audio track and the '{EVENTS_CHANNEL}' "
                            "data channel.", param="sdp")
    return sdp, update


@csrf_exempt
async def hangup(request, call_id):
    """``POST /v1/realtime/calls/{call_id}/hangup``: end the call (404 for a call this process
    does not hold, or other credentials than the call's)."""
    if request.method != "POST":
        return error_response(405, "method_not_allowed", "Use POST.", headers={"Allow": "POST"})
    call = CALLS.get(call_id)
    key = Credentials.from_scope(request.scope).key or ""
    if call is None or not hmac.compare_digest(key.encode(), (call.key or "").encode()):
        return error_response(404, "call_not_found", f"No call '{call_id[:64]}' here.")
    await call.hangup(CloseCode.NORMAL)
    return HttpResponse(status=200)

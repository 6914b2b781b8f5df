"""Who may open a session: API keys, explicit anonymous access, browser origins and the client's
address behind trusted proxies.

Keys travel as ``Authorization: Bearer <key>`` (SDKs) or as the WebSocket subprotocol
``openai-insecure-api-key.<key>`` (browsers cannot set headers). A string that is not shaped like
our keys (SDKs need *some* api_key) counts as no key. What a key looks like and how it is stored:
``pool.access.keys``.
"""

import functools
import ipaddress
from dataclasses import dataclass
from datetime import timedelta
from urllib.parse import urlsplit

from django.conf import settings
from django.db.models import Exists, OuterRef
from django.http.request import validate_host

from pool.access.keys import hash_key
from pool.conf import get_config
from pool.states import CloseCode

SUBPROTOCOL_KEY = "openai-insecure-api-key."


def bearer_token(authorization):
    """The token of an ``Authorization: Bearer <token>`` header value, or None."""
    scheme, _, token = (authorization or "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def key_from_scope(scope):
    """The API key (or client secret) a WebSocket handshake carries (header first, then
    subprotocol), or None."""
    for name, value in scope.get("headers", []):
        if name == b"authorization" and (token := bearer_token(value.decode("latin-1"))):
            return token
    for protocol in scope.get("subprotocols") or []:
        if protocol.startswith(SUBPROTOCOL_KEY) and len(protocol) > len(SUBPROTOCOL_KEY):
            return protocol[len(SUBPROTOCOL_KEY):]
    return None


def client_address(scope):
    """The client's IP address, normalised (``str(ipaddress.ip_address(...))``; an IPv4-mapped
    IPv6 peer as IPv4): the socket's peer, or, when that peer is one of ``TRUSTED_PROXIES``, the
    address the proxies name in ``PROXY_ADDRESS_HEADER`` (only that header: a proxy passes the
    other one on from the client untouched). The header is read right to left, skipping trusted
    proxies; the first other hop is what our proxy saw, so a client cannot pass a made-up address
    through a proxy that appends to it. A hop that is not an IP address (``unknown``, an
    obfuscated RFC 7239 name) leaves the peer's address. None when the peer is unknown."""
    peer = _ip((scope.get("client") or (None, None))[0])
    trusted = _trusted_networks()
    if peer is None or not any(peer in network for network in trusted):
        return None if peer is None else str(peer)
    header = get_config()["PROXY_ADDRESS_HEADER"]
    value = _header(scope, header.lower().encode())
    hops = _forwarded_for(value) if header.lower() == "forwarded" else [h.strip() for h in value.split(",")]
    for hop in reversed(hops):
        ip = _ip(hop)
        if ip is None:
            break
        if not any(ip in network for network in trusted):
            return str(ip)
    return str(peer)


def _ip(text):
    """An ``ipaddress`` address (IPv4-mapped IPv6 unmapped), or None for anything else."""
    try:
        ip = ipaddress.ip_address(text)
    except (TypeError, ValueError):
        return None
    return getattr(ip, "ipv4_mapped", None) or ip


def _header(scope, name):
    """Every value of header ``name`` (lower-case bytes), joined by commas as HTTP allows."""
    return ",".join(value.decode("latin-1") for key, value in scope.get("headers", []) if key == name)


def _forwarded_for(value):
    """The ``for=`` nodes of a ``Forwarded`` header (RFC 7239), in order: ``for=192.0.2.7;
    proto=https, for="[2001:db8::1]:4711"`` -> ["192.0.2.7", "2001:db8::1"]. A node that is not
    an address (``unknown``, ``_hidden``, a bracket never closed) is kept as written."""
    hops = []
    for element in value.split(","):
        for pair in element.split(";"):
            name, _, node = pair.strip().partition("=")
            if name.strip().lower() != "for":
                continue
            node = node.strip().strip('"')
            if node.startswith("[") and "]" in node:
                node = node[1:node.index("]")]
            elif node.count(":") == 1:  # IPv4 with a port
                node = node.partition(":")[0]
            hops.append(node)
    return hops


@functools.lru_cache(maxsize=8)
def _parse_networks(entries):
    return tuple(ipaddress.ip_network(entry, strict=False) for entry in entries)


def _trusted_networks():
    return _parse_networks(tuple(get_config()["TRUSTED_PROXIES"]))


def anonymous_allowed():
    """Clients without a key are served only when ``ALLOW_ANONYMOUS`` is True (set in ``S2S``, or
    by ``runpool --allow-anonymous``, the local quick start). Never inferred from an address."""
    return get_config()["ALLOW_ANONYMOUS"] is True


def origin_allowed(scope):
    """A browser's Origin must name an allowed host (``ALLOWED_ORIGINS``, default ALLOWED_HOSTS).
    Clients that send no Origin (SDKs, servers) pass."""
    origin = next((v.decode("latin-1") for k, v in scope.get("headers", []) if k == b"origin"), None)
    if origin is None:
        return True
    allowed = get_config()["ALLOWED_ORIGINS"]
    if allowed is None:
        allowed = list(settings.ALLOWED_HOSTS) or ["localhost", "127.0.0.1", "[::1]"]
    host = urlsplit(origin).hostname
    if host is None:
        return False
    if ":" in host:
        host = f"[{host}]"
    return validate_host(host, allowed)


@dataclass
class Refusal:
    """Why a connect gets no session: the ``error`` event's code and message, and the close code
    (1008, policy violation, unless the condition is temporary)."""

    code: str
    message: str
    close_code: int = CloseCode.POLICY_VIOLATION


def key_holds(api_key, now, elsewhere_than=None):
    """What ``api_key`` holds across the cluster (sync, database), the one count its
    ``max_sessions`` is held to: its open sessions, its unused client secrets (each holds a unit
    for a session to come), and its secrets used this last minute whose session row the recorder
    has not written yet. ``elsewhere_than``: a process id whose sessions are left out (that process
    counts its own, ``pool.access.accounting``)."""
    from pool.models import ClientSecret, Session

    sessions = Session.objects.filter(api_key=api_key, ended_at__isnull=True)
    secrets = ClientSecret.objects.filter(api_key=api_key)
    written = Exists(Session.objects.filter(session_id=OuterRef("session_id")))
    pending = secrets.filter(used_at__gt=now - timedelta(minutes=1)).exclude(written)
    if elsewhere_than is not None:
        sessions, pending = sessions.exclude(process_id=elsewhere_than), pending.exclude(process_id=elsewhere_than)
    return sessions.count() + secrets.filter(used_at__isnull=True, expires_at__gt=now).count() + pending.count()


def check_key(key, process_id):
    """Look ``key`` up (sync, database). Returns ``(APIKey, None)`` or ``(None, Refusal)``.

    The returned key carries ``open_elsewhere``: what it holds outside process ``process_id``
    (``key_holds``); the caller adds that process's own count.
    """
    from django.utils import timezone

    from pool.models import APIKey

    api_key = APIKey.objects.filter(key_hash=hash_key(key)).select_related("user").first()
    if api_key is None:
        return None, Refusal("invalid_api_key", "Incorrect API key provided.")
    if api_key.revoked_at is not None:
        return None, Refusal("invalid_api_key", "This API key has been revoked.")
    if api_key.user is not None and not api_key.user.is_active:
        return None, Refusal("invalid_api_key", "This API key belongs to an inactive user.")
    api_key.open_elsewhere = 0
    if api_key.max_sessions is not None:
        api_key.open_elsewhere = key_holds(api_key, timezone.now(), process_id)
    return api_key, None

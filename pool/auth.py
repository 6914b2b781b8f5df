"""Who may open a session: API keys, anonymous access on loopback, browser origins.

Keys travel as ``Authorization: Bearer <key>`` (SDKs) or as the WebSocket subprotocol
``openai-insecure-api-key.<key>`` (browsers cannot set headers). A string that is not shaped like
our keys (SDKs need *some* api_key) counts as no key. Keys are random 32-byte tokens,
so they are stored as their sha256: a fast hash is enough for high-entropy secrets (the way
GitHub stores tokens); only the first characters are kept in clear to recognise a key.
"""

import hashlib
import ipaddress
import secrets
from dataclasses import dataclass
from urllib.parse import urlsplit

from django.conf import settings
from django.http.request import validate_host

from .conf import get_config

KEY_PREFIX = "s2s_"
SUBPROTOCOL_KEY = "openai-insecure-api-key."


def new_key():
    """A new API key (``s2s_`` + 43 URL-safe characters, 256 random bits) and its sha256."""
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    return key, hash_key(key)


def is_server_key(key):
    """True for strings shaped like this server's keys. Anything else (``"local"``, an OpenAI key)
    is a placeholder: anonymous where anonymous access is allowed, refused elsewhere."""
    return key.startswith(KEY_PREFIX)


def hash_key(key):
    return hashlib.sha256(key.encode()).hexdigest()


def key_from_scope(scope):
    """The API key a WebSocket handshake carries (header first, then subprotocol), or None."""
    for name, value in scope.get("headers", []):
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
    for protocol in scope.get("subprotocols") or []:
        if protocol.startswith(SUBPROTOCOL_KEY) and len(protocol) > len(SUBPROTOCOL_KEY):
            return protocol[len(SUBPROTOCOL_KEY):]
    return None


def client_address(scope):
    client = scope.get("client") or (None, None)
    return client[0]


def _is_loopback(host):
    try:
        return ipaddress.ip_address(host).is_loopback
    except (TypeError, ValueError):
        return host == "localhost"


def anonymous_allowed(scope):
    """``ALLOW_ANONYMOUS``: True, False, or "loopback" (default): allowed when the server socket
    the client reached is a loopback address - the local quick start, never a public bind."""
    rule = get_config()["ALLOW_ANONYMOUS"]
    if rule == "loopback":
        server = scope.get("server") or (None, None)
        return _is_loopback(server[0])
    return bool(rule)


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
    code: str
    message: str


def check_key(key, process_id):
    """Look ``key`` up (sync, database). Returns ``(APIKey, None)`` or ``(None, Refusal)``.

    The returned key carries ``open_elsewhere``: its open sessions in other processes, from their
    session rows. The caller adds this process's own count (``realtime.consumers``).
    """
    from .models import APIKey, Session

    api_key = APIKey.objects.filter(key_hash=hash_key(key)).select_related("user").first()
    if api_key is None:
        return None, Refusal("invalid_api_key", "Incorrect API key provided.")
    if api_key.revoked_at is not None:
        return None, Refusal("invalid_api_key", "This API key has been revoked.")
    if api_key.user is not None and not api_key.user.is_active:
        return None, Refusal("invalid_api_key", "This API key belongs to an inactive user.")
    api_key.open_elsewhere = 0
    if api_key.max_sessions is not None:
        elsewhere = Session.objects.filter(api_key=api_key, ended_at__isnull=True)
        if process_id:
            elsewhere = elsewhere.exclude(process_id=process_id)
        api_key.open_elsewhere = elsewhere.count()
    return api_key, None

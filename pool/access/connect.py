"""One connect, whatever transport carries it: from what the client presented to a claimed unit
(a ``Grant``) or a ``Refusal``. ``admit`` is the one admission function every transport calls.

The order is the order of cost: the origin and the shape of the key (no I/O), the key or client
secret (the database, on a connect thread: ``pool.access.database``), the connect rate and the
process's state (memory), then the claim (``pool.access.admission``). A refusal undoes what the
steps before it counted or reserved.
"""

import asyncio
import logging
from dataclasses import dataclass

from django.db import DatabaseError

from pool import metrics
from pool.access import accounting, admission, auth, database, keys
from pool.access.auth import Refusal
from pool.conf import get_config
from pool.states import CloseCode

log = logging.getLogger(__name__)

CLAIM_SETTLE_SECONDS = 0.05  # a full pool is asked twice, this far apart, before refusing


@dataclass
class Credentials:
    """What a transport read of a connecting client: ``key`` (an API key, a client secret,
    another string, or None), whether its browser ``origin_allowed``, and its ``address``
    (``auth.client_address``; None when unknown)."""

    key: str | None
    origin_allowed: bool
    address: str | None

    @classmethod
    def from_scope(cls, scope):
        """From an ASGI scope (HTTP or WebSocket): headers, subprotocols, peer."""
        return cls(auth.key_from_scope(scope), auth.origin_allowed(scope), auth.client_address(scope))


@dataclass
class Grant:
    """An admitted connect: the ``unit`` claimed for ``session_id``, the API key it counts
    against (``api_key_id``; None for anonymous clients and secrets issued without a key), the
    key's ``record_audio`` choice (None: the setting decides) and the redeemed client
    ``secret`` (a ``pool.models.ClientSecret``, or None)."""

    session_id: str
    unit: object = None
    api_key_id: int | None = None
    record_audio: bool | None = None
    secret: object = None

    def records_audio(self):
        """Whether this session's audio is recorded: its API key's choice, else RECORD_AUDIO."""
        return get_config()["RECORD_AUDIO"] if self.record_audio is None else self.record_audio

    def release_key(self):
        """Give the key's session count back (once; the session ended or was refused)."""
        if self.api_key_id is not None:
            accounting.KEY_SESSIONS.release(self.api_key_id)
            self.api_key_id = None


async def admit(registry, credentials, session_id):
    """Admit a connect to ``registry``'s pool: a ``Grant`` holding a claimed unit, or a
    ``Refusal`` (its code, message and close code) with nothing left counted or reserved."""
    grant = Grant(session_id)
    refusal = await _authorize(registry, credentials, grant)
    if refusal is None and not accounting.CONNECT_RATE.allow(credentials.address):
        refusal = Refusal("rate_limit_exceeded", "Too many new sessions from this address; "
                          f"at most {get_config()['CONNECTS_PER_MINUTE']} a minute.")
    if refusal is None and (not registry.accepting or (registry.process_draining and grant.secret is None)):
        refusal = Refusal("server_shutting_down", "This server is shutting down; connect again.", CloseCode.GOING_AWAY)
    if refusal is None:
        grant.unit = await _claim(registry, grant)
        if grant.unit is None:
            refusal = Refusal("session_limit_reached", "Every unit of this server's pool is busy; try again later.")
    if refusal is None:
        return grant
    await _undo(grant)
    metrics.SESSIONS_REFUSED.labels(metrics.PROCESS, refusal.code).inc()
    return refusal


async def _authorize(registry, credentials, grant):
    """The origin and the key or client secret; on success with a key, the key's session is
    counted. Returns a Refusal or None."""
    if not credentials.origin_allowed:
        return Refusal("origin_not_allowed", "This origin may not connect to this server.")
    key = credentials.key
    if key is not None and keys.is_client_secret(key):
        return await _redeem(registry, key, grant)
    if key is None or not keys.is_server_key(key):
        # No key, or a placeholder that is not one of ours (SDKs insist on some api_key).
        if auth.anonymous_allowed():
            return None
        if key is not None:
            return Refusal("invalid_api_key", "Incorrect API key provided.")
        return Refusal("missing_api_key", "An API key is required: send 'Authorization: Bearer "
                       "<key>' or the subprotocol 'openai-insecure-api-key.<key>'.")
    try:
        api_key, refusal = await database.call(auth.check_key, key, registry.records.process_id)
    except DatabaseError as exc:
        return _database_refusal(exc, "API keys")
    if refusal is not None:
        return refusal
    if not accounting.KEY_SESSIONS.admit(api_key):  # on the event loop, with the check: no race here
        return Refusal("session_limit_reached", f"This API key may hold {api_key.max_sessions} sessions at once.")
    grant.api_key_id, grant.record_audio = api_key.pk, api_key.record_audio
    return None


async def _redeem(registry, value, grant):
    """A client secret: its reserved unit, starting session and API key (``admission.redeem``)."""
    try:
        secret, refusal = await database.call(admission.redeem, value, registry.records.process_id)
    except DatabaseError as exc:
        return _database_refusal(exc, "client secrets")
    if refusal is None:
        grant.secret = secret
        if secret.api_key is not None:
            accounting.KEY_SESSIONS.add(secret.api_key_id)  # its limit was applied when it was issued
            grant.api_key_id, grant.record_audio = secret.api_key_id, secret.api_key.record_audio
    return refusal


async def _claim(registry, grant):
    """A unit for the grant, or None when the pool stays full."""
    unit = await admission.claim(registry, grant.session_id, secret=grant.secret)
    if unit is None:
        # A client that closes and reconnects at once can get here before the server has
        # handled its close (the close handshake completes below the application): let
        # pending disconnects run, then try again, waiting for a unit that is draining.
        await asyncio.sleep(CLAIM_SETTLE_SECONDS)
        unit = await admission.claim(registry, grant.session_id, secret=grant.secret)
    if unit is None and registry.draining():
        unit = await admission.claim(registry, grant.session_id, get_config()["CLAIM_WAIT_SECONDS"], grant.secret)
    return unit


async def _undo(grant):
    """A refused connect: the key's count back; a client secret it redeemed stays spent, and the
    unit it reserved is free again."""
    grant.release_key()
    if grant.secret is not None:
        try:
            await database.call(admission.release, grant.secret)
        except DatabaseError:
            pass  # the reservation then ends when the secret expires


def _database_refusal(exc, what):
    """The refusal of a connect whose ``what`` (API keys, client secrets) could not be checked:
    the database is busy (a lock held elsewhere) or down. Both are temporary: close 1013."""
    if isinstance(exc, database.DatabaseBusyError):
        log.warning("%s could not be checked in time: the database is busy (%s)", what, exc)
        return Refusal("server_busy", f"The server cannot check {what} right now (the database is "
                       "busy); try again shortly.", CloseCode.TRY_AGAIN_LATER)
    log.warning("%s could not be checked: the database is unavailable (%s)", what, str(exc).strip())
    return Refusal("database_unavailable", f"The server cannot check {what} right now; try again "
                   "shortly.", CloseCode.TRY_AGAIN_LATER)

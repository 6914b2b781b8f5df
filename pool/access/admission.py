"""Cluster-wide admission: which unit, of which process, a new session gets.

Two ways in, one rule - the unit's database row says whether another process holds it:

- A client secret (``POST /v1/realtime/client_secrets``, ``realtime.client_secrets``) reserves a
  unit at issue time, on whichever process answers the request. Live processes (a fresh heartbeat,
  not draining) are tried by load, fewest active sessions and reservations first; one idle,
  unreserved unit row is locked with ``SELECT ... FOR UPDATE SKIP LOCKED`` and reserved until the
  secret expires. Concurrent issuers skip each other's locked rows instead of queueing behind them,
  and the reservation itself is a conditional UPDATE, so no unit is reserved twice on any database
  (SQLite, one process, has no row locks: the UPDATE alone decides there).
- A WebSocket connect claims a unit of its own process: the in-process registry picks among the
  units it may take, then the claim is written to the unit's row at once, by a conditional UPDATE
  that fails when another process reserved the unit in between; the unit is then given back and
  another tried. A secret's connect takes its own reserved unit and clears the reservation.

Unit rows are otherwise written later, by the recorder (``pool.history.recorder``); every write carries
the unit's ``state_seq``, so an older change that arrives late never overwrites a newer one.
"""

import asyncio
import logging
from datetime import timedelta

from asgiref.sync import sync_to_async
from django.db import DatabaseError, transaction
from django.db.models import Count, Q
from django.utils import timezone

from pool.access import database
from pool.access.auth import Refusal, key_holds
from pool.access.keys import hash_key, new_secret
from pool.states import ProcessState, UnitState

log = logging.getLogger(__name__)

RESERVED_ATTEMPTS, RESERVED_RETRY_SECONDS = 5, 0.02  # a secret's unit, held a moment by a key client
FRESH_HEARTBEATS = 3  # a process whose heartbeat is older than this many beats gets no reservation


def _unreserved(now):
    return Q(reserved_until__isnull=True) | Q(reserved_until__lte=now)


class KeyLimitError(Exception):
    """The API key already holds ``max_sessions`` sessions and unused secrets (or a user or an
    anonymous address holds its share of unused secrets)."""


def issue(session, expires_at, heartbeat_seconds, api_key=None, user=None, local_process_id=None,
          client_address=None, per_client=None):
    """Reserve a unit anywhere in the cluster for a new client secret (sync, database).

    ``session``: the ``session.update`` body the secret's session starts with; ``expires_at``: an
    aware datetime; ``heartbeat_seconds``: the processes' HEARTBEAT_SECONDS. Processes that
    advertise no ``public_url`` are skipped, except ``local_process_id`` (the caller's own, which
    the caller can address). ``per_client``: for a secret without an API key, how many unused
    ones its ``user`` (else its ``client_address``) may hold. Returns ``(ClientSecret, value)``,
    or None when no unit is free. Raises KeyLimitError.
    """
    from pool.models import APIKey, ClientSecret, ServerProcess, Unit

    now = timezone.now()
    live = ServerProcess.objects.filter(
        state=ProcessState.RUNNING, heartbeat_at__gte=now - timedelta(seconds=FRESH_HEARTBEATS * heartbeat_seconds))
    live = live.filter(~Q(public_url="") | Q(pk=local_process_id))
    load = Count("units", filter=Q(units__state=UnitState.ACTIVE) | Q(units__reserved_until__gt=now))
    with transaction.atomic():
        if api_key is not None and api_key.max_sessions is not None:
            # One issuer per key at a time (no_key: the recorder's session rows may still refer to it).
            APIKey.objects.select_for_update(no_key=True).filter(pk=api_key.pk).first()
            if key_holds(api_key, now) >= api_key.max_sessions:
                raise KeyLimitError
        elif api_key is None and per_client is not None:
            mine = ClientSecret.objects.filter(api_key=None, used_at__isnull=True, expires_at__gt=now)
            mine = mine.filter(user=user) if user is not None else mine.filter(user=None, client_address=client_address)
            if mine.count() >= per_client:
                raise KeyLimitError
        for process_id in live.annotate(load=load).order_by("load", "pk").values_list("pk", flat=True):
            candidates = Unit.objects.filter(_unreserved(now), process_id=process_id, state=UnitState.IDLE)
            while (unit := candidates.select_for_update(skip_locked=True).order_by("index").first()) is not None:
                if Unit.objects.filter(_unreserved(now), pk=unit.pk, state=UnitState.IDLE).update(
                        reserved_until=expires_at):
                    value, value_hash, prefix = new_secret()
                    secret = ClientSecret.objects.create(
                        prefix=prefix, value_hash=value_hash, process_id=process_id,
                        unit_index=unit.index, session=session, api_key=api_key, user=user,
                        client_address=client_address, created_at=now, expires_at=expires_at)
                    return secret, value
                candidates = candidates.exclude(pk=unit.pk)  # taken since it was read (SQLite)
    return None


def redeem(value, process_id):
    """Use a client secret to open a session on this process (sync, database). Single use: the
    first connect that presents it takes it. Returns ``(ClientSecret, None)`` or ``(None, Refusal)``."""
    from pool.models import ClientSecret

    secret = (ClientSecret.objects.filter(value_hash=hash_key(value))
              .select_related("api_key", "process", "user").first())
    if secret is None:
        return None, Refusal("invalid_api_key", "Incorrect client secret provided.")
    if (secret.api_key is not None and secret.api_key.revoked_at is not None) or (
            secret.user is not None and not secret.user.is_active):
        return None, Refusal("invalid_api_key", "This client secret's API key or user no longer may connect.")
    if secret.process_id != process_id:
        return None, Refusal("invalid_api_key", "This client secret is for another server process: connect "
                             f"at {secret.process.public_url or 'the URL it was issued with'}.")
    now = timezone.now()
    if not ClientSecret.objects.filter(pk=secret.pk, used_at__isnull=True, expires_at__gt=now).update(used_at=now):
        return None, Refusal("invalid_api_key", "This client secret has expired or has been used.")
    return secret, None


def release(secret):
    """Free the unit ``secret`` reserved, if it still does (sync, database): a redeemed secret
    whose session did not start on it (refused, or its unit was gone)."""
    from pool.models import Unit

    Unit.objects.filter(process_id=secret.process_id, index=secret.unit_index,
                        reserved_until=secret.expires_at).update(reserved_until=None)


def reserved_indices(process_id):
    """Indices of this process's units that are reserved now (sync, database)."""
    from pool.models import Unit

    return set(Unit.objects.filter(process_id=process_id, reserved_until__gt=timezone.now())
               .values_list("index", flat=True))


def mark_claimed(process_id, unit, secret=None):
    """Write ``unit``'s claim to its row now, unless another process reserved it (sync, database).
    With ``secret``, the unit is that secret's: its reservation is cleared. Returns True when the
    claim stands."""
    from pool.models import ClientSecret, Unit

    now = timezone.now()
    ours = _unreserved(now)
    if secret is not None:
        ours |= Q(reserved_until=secret.expires_at)  # its own reservation
    # state_seq__lte: the recorder may have written this same change already, never a newer one
    # (the session has not started).
    claimed = Unit.objects.filter(ours, process_id=process_id, index=unit.index, state_seq__lte=unit.state_seq).update(
        state=UnitState.ACTIVE, session_id=unit.session_id or "", state_since=now, state_seq=unit.state_seq,
        reserved_until=None)
    if claimed and secret is not None:
        ClientSecret.objects.filter(pk=secret.pk).update(session_id=unit.session_id or "")
    return bool(claimed)


async def claim(registry, session_id, wait=0.0, secret=None):
    """Claim a unit of ``registry`` for ``session_id``, honouring the cluster's reservations.

    ``secret``: a redeemed ClientSecret, whose reserved unit is taken (another free unit if that
    one cannot be, e.g. quarantined since). ``wait``: seconds to wait for a draining unit
    (``PoolRegistry.claim``). Returns the unit or None. A pool without database records has no
    reservations; a database outage is logged and the claim goes on without them.
    """
    process_id = registry.records.process_id
    if secret is not None:
        for _attempt in range(RESERVED_ATTEMPTS):  # a key client may hold it until it backs off
            unit = await _claim(registry, session_id, wait, secret.unit_index, ())
            if unit is not None:
                if process_id is None or await _database(mark_claimed, True, process_id, unit, secret):
                    return unit
                registry.unclaim(unit)  # expired and reserved again, at the last moment
                break
            await asyncio.sleep(RESERVED_RETRY_SECONDS)
        await _database(release, None, secret)  # its unit is gone (quarantined): any free one
    for _attempt in range(len(registry.units) + 1):
        skip = await _database(reserved_indices, (), process_id) if process_id is not None else ()
        unit = await _claim(registry, session_id, wait, None, skip)
        if unit is None or process_id is None:
            return unit
        if await _database(mark_claimed, True, process_id, unit):
            return unit
        registry.unclaim(unit)  # another process reserved it meanwhile
    return None


async def _claim(registry, session_id, wait, only, skip):
    """``registry.claim``, off the event loop when it may wait."""
    if wait:
        return await sync_to_async(registry.claim, thread_sensitive=False)(session_id, wait, only, skip)
    return registry.claim(session_id, 0.0, only, skip)


async def _database(fn, fallback, *args):
    """``fn(*args)`` on a connect thread (``pool.access.database``); ``fallback`` (logged) when the
    database fails or is busy."""
    try:
        return await database.call(fn, *args)
    except DatabaseError as exc:
        log.warning("admission without reservations: the database failed (%s)", str(exc).strip())
        return fallback

"""Operator commands on units, whichever process serves the admin request.

A unit of this process is reached directly. A unit of another process is reached through the
channel layer: every ``runpool`` process listens on its own control channel
(``ServerProcess.control_channel``, ``serve_control``), so the admin served by process A can
release a unit owned by process B. Requires a channel layer shared by the processes (Redis).
"""

import asyncio
import logging
import time

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.utils import timezone

from pool.models import ServerProcess, Session
from pool.process import local_registry
from pool.states import ProcessState, UnitState

log = logging.getLogger(__name__)

CONFIRM_SECONDS = 5.0  # how long the admin waits to see a remote release take effect
RETRY_SECONDS = 1.0  # after a channel-layer error (Redis gone), before listening again
SEND_ATTEMPTS = 3


def release_unit(unit_row, user):
    """Release a quarantined unit: fresh handler threads, then idle. Records who and when.

    Returns ``(ok, message)``; never raises for a unit that is not quarantined or unreachable.
    """
    if unit_row.state != UnitState.QUARANTINED:
        return False, f"{unit_row} is {unit_row.state}, not quarantined."
    session_id = unit_row.session_id
    registry = local_registry()
    if registry is not None and registry.records.process_id == unit_row.process_id:
        if not registry.release_quarantined(unit_row.index):
            return False, f"{unit_row} is no longer quarantined."
        _record_release(session_id, user)
        return True, f"{unit_row} released: fresh handler threads, back to idle."
    return _release_remote(unit_row, session_id, user)


def _record_release(session_id, user):
    Session.objects.filter(session_id=session_id).update(released_at=timezone.now(), released_by=user)


def drain_process(process):
    """Drain a server process: it takes no new sessions (the cluster gives it no new
    reservations at once; secrets already issued for it are honoured), its sessions go on until
    they end, and then ``runpool`` exits. Returns ``(ok, message)``.

    The process learns it from its row at its next heartbeat, or at once through the channel
    layer when one reaches it."""
    if not ServerProcess.objects.filter(pk=process.pk, state=ProcessState.RUNNING).update(
            state=ProcessState.DRAINING):
        process.refresh_from_db(fields=["state"])
        return False, f"{process} is {process.state}, not running."
    registry = local_registry()
    if registry is not None and registry.records.process_id == process.pk:
        registry.start_draining()
    else:
        _send(process, {"type": "pool.control", "command": "drain"})  # else its next heartbeat
    return True, f"{process} is draining: no new sessions; it stops when its sessions have ended."


def _send(process, message):
    """Send an operator command to ``process``; returns an error message, or None when sent."""
    layer = get_channel_layer()
    if layer is None or not process.control_channel:
        return f"{process} is another process and no channel layer reaches it."
    for attempt in range(SEND_ATTEMPTS):
        try:
            async_to_sync(layer.send)(process.control_channel, message)
            return None
        except Exception as exc:  # noqa: BLE001 - the layer may be down; say so in the admin
            if attempt == SEND_ATTEMPTS - 1:
                return f"Could not reach {process} through the channel layer: {exc}"
            time.sleep(0.2)  # a connection left over from before a Redis restart fails once
    return None


def _release_remote(unit_row, session_id, user):
    error = _send(unit_row.process, {"type": "pool.control", "command": "release", "index": unit_row.index})
    if error:
        return False, error
    deadline = time.monotonic() + CONFIRM_SECONDS
    while time.monotonic() < deadline:
        unit_row.refresh_from_db(fields=["state"])
        if unit_row.state != UnitState.QUARANTINED:
            _record_release(session_id, user)
            return True, f"{unit_row} released by its process: fresh handler threads, back to idle."
        time.sleep(0.1)
    _record_release(session_id, user)
    return True, (f"Release sent to {unit_row.process}; it has not confirmed yet - refresh to see "
                  "the unit's state.")


async def serve_control(registry, channel):
    """Take operator commands for ``registry``'s units from ``channel`` until cancelled.

    Channel-layer errors (Redis restarting) are logged and retried: sessions never depend on the
    layer, and commands resume when it returns.
    """
    layer = get_channel_layer()
    if layer is None or not channel:
        return
    while True:
        try:
            message = await layer.receive(channel)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - keep listening through layer outages
            log.warning("control channel %s: %s; retrying", channel, exc)
            await asyncio.sleep(RETRY_SECONDS)
            continue
        if message.get("command") == "drain":
            registry.start_draining()
        elif message.get("command") == "release":
            released = await asyncio.to_thread(registry.release_quarantined, int(message["index"]))
            log.info("control: release of unit %s: %s", message["index"], "done" if released else "not quarantined")

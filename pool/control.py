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

from .models import Session, Unit
from .states import UnitState
from .registry import local_registry

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


def _release_remote(unit_row, session_id, user):
    layer = get_channel_layer()
    channel = unit_row.process.control_channel
    if layer is None or not channel:
        return False, f"{unit_row} belongs to another process and no channel layer reaches it."
    message = {"type": "pool.control", "command": "release", "index": unit_row.index}
    for attempt in range(SEND_ATTEMPTS):
        try:
            async_to_sync(layer.send)(channel, message)
            break
        except Exception as exc:  # noqa: BLE001 - the layer may be down; say so in the admin
            if attempt == SEND_ATTEMPTS - 1:
                return False, f"Could not reach {unit_row.process} through the channel layer: {exc}"
            time.sleep(0.2)  # a connection left over from before a Redis restart fails once
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
        if message.get("command") == "release":
            released = await asyncio.to_thread(registry.release_quarantined, int(message["index"]))
            log.info("control: release of unit %s: %s", message["index"], "done" if released else "not quarantined")

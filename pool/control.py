"""Operator commands on units, whichever process serves the admin request.

Today a command reaches units of this process directly; units of another process are reached
through the channel layer (a per-process control channel) - see ``release_unit``.
"""

from django.utils import timezone

from .models import Session, Unit
from .registry import local_registry


def release_unit(unit_row, user):
    """Release a quarantined unit: fresh handler threads, then idle. Records who and when.

    Returns ``(ok, message)``. Raises nothing: a unit that is not quarantined, or that this
    process cannot reach, is a ``False`` with the reason.
    """
    if unit_row.state != Unit.QUARANTINED:
        return False, f"{unit_row} is {unit_row.state}, not quarantined."
    registry = local_registry()
    if registry is None or registry.records.process_id != unit_row.process_id:
        return False, f"{unit_row} belongs to another server process, which this one cannot reach."
    session_id = registry.units[unit_row.index].session_id
    if not registry.release_quarantined(unit_row.index):
        return False, f"{unit_row} is no longer quarantined."
    Session.objects.filter(session_id=session_id).update(released_at=timezone.now(), released_by=user)
    return True, f"{unit_row} released: fresh handler threads, back to idle."

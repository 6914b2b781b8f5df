"""The process's own row and the rows of processes that are gone (sync, database): registration,
the heartbeat (with each unit's input lag), draining, a clean stop, and lost processes.

A process that stops heart-beating for ``lost_after_seconds`` (a crash, a kill -9, a lost host) is
marked ``lost`` by whichever live process notices first, and its open sessions end at its last
heartbeat.
"""

import logging
import os
import socket
from datetime import timedelta

from django.db import transaction
from django.db.models import F, Value
from django.db.models.functions import Greatest
from django.utils import timezone

from pool.states import LIVE_PROCESS_STATES, EndReason, ProcessState, SessionState

log = logging.getLogger(__name__)


def register(units, public_url, lost_after_seconds):
    """Register this process (reached by clients at ``public_url``, "" if unknown) and its
    ``units``; lost processes are marked first. Returns the ``ServerProcess``."""
    from pool.models import ServerProcess, Unit

    now = timezone.now()
    mark_lost(lost_after_seconds)
    process = ServerProcess.objects.create(host=socket.gethostname(), pid=os.getpid(), public_url=public_url,
                                           pool_size=len(units), heartbeat_at=now)
    process.control_channel = f"pool-control.{process.pk}"
    process.save(update_fields=["control_channel"])
    Unit.objects.bulk_create([Unit(process=process, index=u.index, state=u.state, state_since=now)
                              for u in units])
    return process


class Heartbeat:
    """The heartbeat of process ``process_id`` and of its ``units``: every ``seconds``, the row's
    ``heartbeat_at`` (and ``longest_heartbeat_gap`` when a beat came late), each unit's input lag
    where it changed, and a look at the row's state (an operator's drain) and at lost processes.
    ``on_draining``: called once the beat's transaction commits, when the row says draining."""

    def __init__(self, process_id, units, seconds, lost_after_seconds):
        self.process_id, self.units = process_id, units
        self.seconds, self.lost_after_seconds = seconds, lost_after_seconds
        self.on_draining = None
        self._written, self._longest_gap = timezone.now(), 0.0
        self._lags = {}  # unit index -> input lag (ms) as last written

    def beat(self):
        """One heartbeat (inside the recorder's transaction)."""
        from pool.models import ServerProcess

        now = timezone.now()
        gap = (now - self._written).total_seconds()
        fields = {"heartbeat_at": now}
        if gap > max(self._longest_gap, 2 * self.seconds):  # late, and the latest yet
            fields["longest_heartbeat_gap"] = round(gap, 1)
        ServerProcess.objects.filter(pk=self.process_id).update(**fields)
        state = ServerProcess.objects.filter(pk=self.process_id).values_list("state", flat=True).first()
        if state == ProcessState.DRAINING and self.on_draining is not None:
            transaction.on_commit(self.on_draining)  # drained by an operator (pool.control)
        self._write_input_lags()
        transaction.on_commit(lambda: self._written_at(now, gap))
        mark_lost(self.lost_after_seconds, self.process_id)

    def _write_input_lags(self):
        """Each unit's input lag (for the pool overview), where it changed since last written."""
        from pool.models import Unit

        changed = {unit.index: round(unit.input_lag_max * 1000, 1) for unit in self.units}
        changed = {index: lag for index, lag in changed.items() if self._lags.get(index) != lag}
        for index, lag in changed.items():
            Unit.objects.filter(process_id=self.process_id, index=index).update(input_lag_max_ms=lag)
        transaction.on_commit(lambda: self._lags.update(changed))

    def _written_at(self, now, gap):
        self._written = now
        self._longest_gap = max(self._longest_gap, gap)


def set_draining(process_id):
    """The process drains: its row says so (the cluster gives it no new reservations)."""
    from pool.models import ServerProcess

    ServerProcess.objects.filter(pk=process_id, state=ProcessState.RUNNING).update(state=ProcessState.DRAINING)


def stopped(process_id):
    """A clean stop: the process's open sessions end (shutdown) and its row says stopped."""
    from pool.models import ServerProcess, Session

    now = timezone.now()
    with transaction.atomic():
        Session.objects.filter(process_id=process_id, ended_at__isnull=True).update(
            ended_at=now, end_reason=EndReason.SHUTDOWN, state=SessionState.ENDED)
        Session.objects.filter(process_id=process_id, state=SessionState.DRAINING).update(state=SessionState.ENDED)
        ServerProcess.objects.filter(pk=process_id).update(state=ProcessState.STOPPED, stopped_at=now, heartbeat_at=now)


def mark_lost(lost_after_seconds, except_id=None):
    """Processes silent for ``lost_after_seconds`` (but ``except_id``, this one): lost, and their
    open sessions too. A lost session ended at its process's last sign of life (its last
    heartbeat), not when that silence was noticed."""
    from pool.models import ServerProcess, Session

    now = timezone.now()
    silent = ServerProcess.objects.filter(
        state__in=LIVE_PROCESS_STATES, heartbeat_at__lt=now - timedelta(seconds=lost_after_seconds))
    if except_id:
        silent = silent.exclude(pk=except_id)
    lost = dict(silent.values_list("pk", "heartbeat_at"))
    if not lost:
        return
    with transaction.atomic():
        for process_id, last_beat in lost.items():
            Session.objects.filter(process_id=process_id, ended_at__isnull=True).update(
                ended_at=Greatest(F("created_at"), Value(last_beat)), end_reason=EndReason.LOST)
            ServerProcess.objects.filter(pk=process_id).update(state=ProcessState.LOST, stopped_at=last_beat)
        Session.objects.filter(process_id__in=lost, state__in=[SessionState.ACTIVE, SessionState.DRAINING]).update(
            state=SessionState.LOST)
    log.warning("pool records: processes %s stopped heart-beating; their sessions are lost", list(lost))

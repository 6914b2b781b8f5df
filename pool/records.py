"""The recorder: one thread per process that writes pool and session rows.

Callers (the consumer on the event loop, the registry from stage threads) only put a small
message on a queue and never wait for the database. The queue carries a handful of lifecycle
messages per session (start, end, each unit state change), so its growth is bounded by the rate
of sessions, not by audio. The thread also heart-beats the process row and closes, as ``lost``,
the open sessions of processes whose heartbeat stopped (a crash, a kill -9, a lost host).
"""

import logging
import os
import queue
import socket
import threading
import time
from datetime import timedelta

from django.db import OperationalError, close_old_connections, connection, transaction
from django.utils import timezone

log = logging.getLogger(__name__)

_STOP = object()
WRITE_ATTEMPTS = 4  # a write that meets a locked database is retried after 0.1, 0.2, 0.4 s


class NoRecords:
    """The recorder's interface, doing nothing: for pools built without a database (unit tests)."""

    process_id = None
    control_channel = None  # where this process takes operator commands (pool.control)

    def session_started(self, session_id, unit_index, api_key_id=None, client_address=None):
        pass

    def session_ended(self, session_id, reason, close_code, counts):
        pass

    def unit_changed(self, unit, old, new, session_id):
        pass

    def stop(self, timeout=5.0):
        pass


class Records(NoRecords):
    """Rows for one process's pool. ``start(units)`` registers the process and its units."""

    def __init__(self, release_after, heartbeat_seconds=5.0, lost_after_seconds=30.0):
        self.release_after = release_after
        self.heartbeat_seconds = heartbeat_seconds
        self.lost_after_seconds = lost_after_seconds
        self._queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, daemon=True, name="pool-records")

    # --- called from anywhere, never blocking -----------------------------------------------

    def session_started(self, session_id, unit_index, api_key_id=None, client_address=None):
        self._queue.put((self._session_started, (session_id, unit_index, api_key_id, client_address,
                                                 timezone.now())))

    def session_ended(self, session_id, reason, close_code, counts):
        self._queue.put((self._session_ended, (session_id, reason, close_code, counts, timezone.now())))

    def unit_changed(self, unit, old, new, session_id):
        self._queue.put((self._unit_changed, (unit.index, old, new, session_id, timezone.now())))

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self, units):
        """Register this process and its units (synchronously: called before serving)."""
        from .models import ServerProcess, Unit

        now = timezone.now()
        self._mark_lost()
        process = ServerProcess.objects.create(host=socket.gethostname(), pid=os.getpid(),
                                               pool_size=len(units), heartbeat_at=now)
        process.control_channel = self.control_channel = f"pool-control.{process.pk}"
        process.save(update_fields=["control_channel"])
        Unit.objects.bulk_create([Unit(process=process, index=u.index, state=u.state, state_since=now)
                                  for u in units])
        self.process_id = process.pk
        connection.close()  # the recorder thread keeps its own connection from here on
        self._thread.start()

    def stop(self, timeout=5.0):
        """Write what is queued, mark the process stopped, and end the thread."""
        if not self._thread.is_alive():
            return
        self._queue.put(_STOP)
        self._thread.join(timeout)

    def flush(self, timeout=5.0):
        """Wait until every message queued so far is written (tests, shutdown)."""
        done = threading.Event()
        self._queue.put((done.set, ()))
        return done.wait(timeout)

    def _run(self):
        last_beat = timezone.now()
        while True:
            try:
                item = self._queue.get(timeout=self.heartbeat_seconds)
            except queue.Empty:
                item = None
            if item is _STOP:
                self._write(self._stopped)
                connection.close()
                return
            if item is not None:
                self._write(item[0], *item[1])
            if (timezone.now() - last_beat).total_seconds() >= self.heartbeat_seconds:
                self._write(self._heartbeat)
                last_beat = timezone.now()

    @staticmethod
    def _write(fn, *args):
        close_old_connections()
        for attempt in range(WRITE_ATTEMPTS):
            try:
                fn(*args)
                return
            except OperationalError as exc:  # SQLite "database is locked" by another writer
                if attempt == WRITE_ATTEMPTS - 1:
                    log.error("pool records: %s failed: %s", getattr(fn, "__name__", fn), exc)
                    return
                time.sleep(0.1 * 2 ** attempt)
            except Exception:  # noqa: BLE001 - a failed write is logged; the pool goes on
                log.exception("pool records: %s failed", getattr(fn, "__name__", fn))
                return

    # --- on the recorder thread ----------------------------------------------------------------

    def _session_started(self, session_id, unit_index, api_key_id, client_address, now):
        from .models import Session

        Session.objects.create(session_id=session_id, process_id=self.process_id, unit_index=unit_index,
                               created_at=now, api_key_id=api_key_id, client_address=client_address)

    def _session_ended(self, session_id, reason, close_code, counts, now):
        from .models import Session

        Session.objects.filter(session_id=session_id).update(
            ended_at=now, end_reason=reason, close_code=close_code,
            release_after=now + timedelta(seconds=self.release_after), **counts)

    def _unit_changed(self, index, old, new, session_id, now):
        from .models import Session, Unit

        Unit.objects.filter(process_id=self.process_id, index=index).update(
            state=new, session_id=session_id if new != Unit.IDLE else "", state_since=now)
        sessions = Session.objects.filter(session_id=session_id)
        if new == Unit.DRAINING:
            sessions.update(state=Session.DRAINING)
        elif old == Unit.DRAINING and new == Unit.IDLE:
            sessions.update(state=Session.ENDED, drained_at=now)
        elif new == Unit.QUARANTINED:
            sessions.update(state=Session.QUARANTINED, quarantined_at=now)
        elif old == Unit.QUARANTINED and new == Unit.IDLE:
            sessions.update(state=Session.RELEASED)

    def _heartbeat(self):
        from .models import ServerProcess

        ServerProcess.objects.filter(pk=self.process_id).update(heartbeat_at=timezone.now())
        self._mark_lost()

    def _stopped(self):
        from .models import ServerProcess, Session

        now = timezone.now()
        with transaction.atomic():
            Session.objects.filter(process_id=self.process_id, ended_at__isnull=True).update(
                ended_at=now, end_reason=Session.SHUTDOWN, state=Session.ENDED)
            Session.objects.filter(process_id=self.process_id, state=Session.DRAINING).update(
                state=Session.ENDED)
            ServerProcess.objects.filter(pk=self.process_id).update(
                state=ServerProcess.STOPPED, stopped_at=now, heartbeat_at=now)

    def _mark_lost(self):
        """Processes silent for ``lost_after_seconds``: lost, and their open sessions too."""
        from .models import ServerProcess, Session

        now = timezone.now()
        silent = ServerProcess.objects.filter(
            state=ServerProcess.RUNNING, heartbeat_at__lt=now - timedelta(seconds=self.lost_after_seconds))
        if self.process_id:
            silent = silent.exclude(pk=self.process_id)
        lost = list(silent.values_list("pk", flat=True))
        if not lost:
            return
        with transaction.atomic():
            Session.objects.filter(process_id__in=lost, ended_at__isnull=True).update(
                ended_at=now, end_reason=Session.LOST)
            Session.objects.filter(process_id__in=lost, state__in=[Session.ACTIVE, Session.DRAINING]).update(
                state=Session.LOST)
            ServerProcess.objects.filter(pk__in=lost).update(state=ServerProcess.LOST, stopped_at=now)
        log.warning("pool records: processes %s stopped heart-beating; their sessions are lost", lost)

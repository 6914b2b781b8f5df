"""The recorder: one thread per process that writes pool and session rows.

Callers (the consumer on the event loop, the registry from stage threads) only put a small
message on a queue and never wait for the database. The thread writes what has queued up in one
transaction, and keeps it queued through a database outage until the database is back. The
queue carries a handful of lifecycle messages per session (start, end, each unit state change)
and its history (one record per item and per response, at most HISTORY_MAX_ITEMS), never audio,
and it is capped at MAX_PENDING. The thread also heart-beats the process row and closes, as ``lost``,
the open sessions of processes whose heartbeat stopped (a crash, a kill -9, a lost host).
"""

import logging
import os
import queue
import socket
import threading
import time
from dataclasses import asdict, dataclass
from datetime import timedelta

from django.db import InterfaceError, OperationalError, close_old_connections, connection, transaction
from django.db.models import F, Value
from django.db.models.functions import Greatest
from django.utils import timezone

from pool.history.storable import storable_row
from pool.states import LIVE_PROCESS_STATES, EndReason, ProcessState, SessionState, UnitState

log = logging.getLogger(__name__)

_STOP = object()
BATCH = 200  # messages written per transaction
RETRY_MAX_SECONDS = 5.0  # the longest pause between attempts while the database is unavailable
MAX_PENDING = 20_000  # messages kept while the database is down (a session makes about six)


@dataclass(frozen=True)
class ItemRecord:
    """A conversation item of a session, as it ended (``pool.models.ConversationItem``'s fields)."""

    item_id: str
    kind: str
    role: str
    status: str
    text: str
    at_ms: int
    data: dict
    audio_start_ms: int | None = None
    audio_end_ms: int | None = None
    audio_ms: int | None = None
    interrupted: bool = False
    voice: str = ""
    language: str = ""
    response_id: str = ""


@dataclass(frozen=True)
class ResponseRecord:
    """A response of a session, as it ended; ``timings``: a ``pool.pipeline.timings.TurnTimings`` for
    a voice turn, else None (``pool.models.SessionResponse``'s fields)."""

    response_id: str
    status: str
    reason: str
    at_ms: int
    input_tokens: int | None = None
    output_tokens: int | None = None
    timings: object = None


class _Flush:
    """A marker in the queue: ``done`` is set once every message before it is written."""

    def __init__(self, done):
        self.done = done


class NoRecords:
    """The recorder's interface, doing nothing: for pools built without a database (unit tests)."""

    process_id = None
    control_channel = None  # where this process takes operator commands (pool.control)
    on_draining = None  # called (on the recorder thread) when the process row says "draining"

    def session_started(self, session_id, unit_index, api_key_id=None, client_address=None):
        pass

    def session_ended(self, session_id, reason, close_code, counts):
        pass

    def unit_changed(self, unit, old, new, session_id):
        pass

    def history(self, session_id, record):
        pass

    def recording_saved(self, session_id, names):
        pass

    def process_draining(self):
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
        self.outage_since = None  # monotonic time of the first refused write of an outage
        self.dropped = 0  # messages dropped past MAX_PENDING
        self._units, self._lags = (), {}  # the pool's units; their input lag as last written
        self._thread = threading.Thread(target=self._run, daemon=True, name="pool-records")

    # --- called from anywhere, never blocking -----------------------------------------------

    def session_started(self, session_id, unit_index, api_key_id=None, client_address=None):
        self._put((self._session_started, (session_id, unit_index, api_key_id, client_address,
                                                 timezone.now())))

    def session_ended(self, session_id, reason, close_code, counts):
        """The session's end (``counts``: the row's counters and ``last_error``). The end is its
        own write of the server's own values, so it cannot fail on what the client sent."""
        from pool.models import Session

        counts = dict(counts)
        last_error = counts.pop("last_error", "")
        self._put((self._session_ended, (session_id, reason, close_code, counts, timezone.now())))
        if last_error:
            self._put((self._update_session, (session_id, storable_row(Session, {"last_error": last_error}))))

    def unit_changed(self, unit, old, new, session_id):
        self._put((self._unit_changed, (unit.index, old, new, session_id, timezone.now(), unit.state_seq)))

    def history(self, session_id, record):
        """Keep an ``ItemRecord`` or ``ResponseRecord`` of a session, made storable now."""
        from pool.models import ConversationItem, SessionResponse

        fields = {"session_id": session_id, **asdict(record)}
        if isinstance(record, ItemRecord):
            self._put((self._history, (ConversationItem, storable_row(ConversationItem, fields))))
        else:
            fields.update(fields.pop("timings") or {})
            self._put((self._history, (SessionResponse, storable_row(SessionResponse, fields))))

    def recording_saved(self, session_id, names):
        """A session's recording is stored: ``names`` maps "user"/"assistant" to storage names."""
        self._put((self._update_session, (session_id, {f"{side}_audio": name for side, name in names.items()})))

    def process_draining(self):
        """This process drains: its row says so (the cluster gives it no new reservations)."""
        self._put((self._set_draining, ()))

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self, units, public_url=""):
        """Register this process (reached by clients at ``public_url``, "" if unknown) and its
        units, synchronously: called before serving."""
        from pool.models import ServerProcess, Unit

        now = timezone.now()
        self._mark_lost()
        process = ServerProcess.objects.create(host=socket.gethostname(), pid=os.getpid(), public_url=public_url,
                                               pool_size=len(units), heartbeat_at=now)
        process.control_channel = self.control_channel = f"pool-control.{process.pk}"
        process.save(update_fields=["control_channel"])
        Unit.objects.bulk_create([Unit(process=process, index=u.index, state=u.state, state_since=now)
                                  for u in units])
        self.process_id = process.pk
        self._units = units
        self._beat_written, self._longest_gap = now, 0.0
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
        self._queue.put(_Flush(done))
        return done.wait(timeout)

    def _put(self, write):
        if self._queue.qsize() >= MAX_PENDING:  # the database has been down for long
            self.dropped += 1
            if self.dropped == 1:
                log.error("pool records: %d writes wait for the database; dropping new ones "
                          "until it is back (sessions go on)", MAX_PENDING)
            return
        self._queue.put(write)

    def _run(self):
        last_beat = time.monotonic()
        while True:
            batch = self._next_batch()
            stopping = _STOP in batch
            if time.monotonic() - last_beat >= self.heartbeat_seconds or stopping:
                batch.append((self._stopped if stopping else self._heartbeat, ()))
                last_beat = time.monotonic()
            self._commit([item for item in batch if isinstance(item, tuple)])
            for item in batch:
                if isinstance(item, _Flush):
                    item.done.set()
            if stopping:
                connection.close()
                return

    def _next_batch(self):
        """The messages waiting now (up to BATCH), after waiting up to a heartbeat for one."""
        try:
            batch = [self._queue.get(timeout=self.heartbeat_seconds)]
        except queue.Empty:
            return []
        while len(batch) < BATCH and batch[-1] is not _STOP:
            try:
                batch.append(self._queue.get_nowait())
            except queue.Empty:
                break
        return batch

    def _commit(self, writes):
        """Write ``writes`` (``(fn, args)`` pairs) in one transaction: one commit for a burst.

        A database that cannot be reached or written (PostgreSQL down, SQLite locked, a full
        disk, a read-only file) is retried with a growing pause (up to RETRY_MAX_SECONDS) until it
        takes the writes: nothing is lost in an outage, and the outage is logged once when it
        starts and once when it ends. Any other error (a bug, a bad row) writes the batch one by
        one, so only the bad write is lost, with its traceback."""
        pause = 0.1
        while writes:
            close_old_connections()
            try:
                with transaction.atomic():
                    for fn, args in writes:
                        fn(*args)
            except (OperationalError, InterfaceError) as exc:
                connection.close()  # a broken connection is not reused
                if self.outage_since is None:
                    self.outage_since = time.monotonic()
                    log.error("pool records: the database refused a write (%s); retrying until it "
                              "is back, sessions go on", str(exc).strip())
                time.sleep(pause)
                pause = min(2 * pause, RETRY_MAX_SECONDS)
                continue
            except Exception:  # noqa: BLE001 - one bad write must not take the batch with it
                for fn, args in writes:
                    try:
                        with transaction.atomic():
                            fn(*args)
                    except Exception:  # noqa: BLE001
                        log.exception("pool records: %s failed", getattr(fn, "__name__", fn))
            if self.outage_since is not None:
                log.warning("pool records: the database is back after %.1f s; %d writes caught up, "
                            "%d dropped", time.monotonic() - self.outage_since, len(writes), self.dropped)
                self.outage_since, self.dropped = None, 0
            return

    # --- on the recorder thread ----------------------------------------------------------------

    def _session_started(self, session_id, unit_index, api_key_id, client_address, now):
        from pool.models import Session

        # get_or_create: a batch whose commit was cut off by an outage may be written again.
        Session.objects.get_or_create(session_id=session_id, defaults=dict(
            process_id=self.process_id, unit_index=unit_index, created_at=now, api_key_id=api_key_id,
            client_address=client_address))

    def _session_ended(self, session_id, reason, close_code, counts, now):
        from pool.models import Session

        Session.objects.filter(session_id=session_id).update(
            ended_at=now, end_reason=reason, close_code=close_code,
            release_after=now + timedelta(seconds=self.release_after), **counts)

    def _history(self, model, fields):
        # ignore_conflicts: a batch whose commit was cut off by an outage may be written again.
        model.objects.bulk_create([model(**fields)], ignore_conflicts=True)

    def _update_session(self, session_id, fields):
        from pool.models import Session

        Session.objects.filter(session_id=session_id).update(**fields)

    def _unit_changed(self, index, old, new, session_id, now, seq):
        from pool.models import Session, Unit

        # Only a newer change: a claim writes its row at once (pool.access.admission), ahead of this queue.
        Unit.objects.filter(process_id=self.process_id, index=index, state_seq__lt=seq).update(
            state=new, session_id=session_id if new != UnitState.IDLE else "", state_since=now, state_seq=seq)
        sessions = Session.objects.filter(session_id=session_id)
        if new == UnitState.DRAINING:
            sessions.update(state=SessionState.DRAINING)
        elif old == UnitState.DRAINING and new == UnitState.IDLE:
            sessions.update(state=SessionState.ENDED, drained_at=now)
        elif new == UnitState.QUARANTINED:
            sessions.update(state=SessionState.QUARANTINED, quarantined_at=now)
        elif old == UnitState.QUARANTINED and new == UnitState.IDLE:
            sessions.update(state=SessionState.RELEASED)

    def _heartbeat(self):
        from pool.models import ServerProcess

        now = timezone.now()
        gap = (now - self._beat_written).total_seconds()
        fields = {"heartbeat_at": now}
        if gap > max(self._longest_gap, 2 * self.heartbeat_seconds):  # late, and the latest yet
            fields["longest_heartbeat_gap"] = round(gap, 1)
        ServerProcess.objects.filter(pk=self.process_id).update(**fields)
        state = ServerProcess.objects.filter(pk=self.process_id).values_list("state", flat=True).first()
        if state == ProcessState.DRAINING and self.on_draining is not None:
            transaction.on_commit(self.on_draining)  # drained by an operator (pool.control)
        self._write_input_lags()
        transaction.on_commit(lambda: self._beat_written_at(now, gap))
        self._mark_lost()

    def _write_input_lags(self):
        """Each unit's input lag (for the pool overview), where it changed since last written."""
        from pool.models import Unit

        changed = {unit.index: round(unit.input_lag_max * 1000, 1) for unit in self._units}
        changed = {index: lag for index, lag in changed.items() if self._lags.get(index) != lag}
        for index, lag in changed.items():
            Unit.objects.filter(process_id=self.process_id, index=index).update(input_lag_max_ms=lag)
        transaction.on_commit(lambda: self._lags.update(changed))

    def _beat_written_at(self, now, gap):
        self._beat_written = now
        self._longest_gap = max(self._longest_gap, gap)

    def _set_draining(self):
        from pool.models import ServerProcess

        ServerProcess.objects.filter(pk=self.process_id, state=ProcessState.RUNNING).update(
            state=ProcessState.DRAINING)

    def _stopped(self):
        from pool.models import ServerProcess, Session

        now = timezone.now()
        with transaction.atomic():
            Session.objects.filter(process_id=self.process_id, ended_at__isnull=True).update(
                ended_at=now, end_reason=EndReason.SHUTDOWN, state=SessionState.ENDED)
            Session.objects.filter(process_id=self.process_id, state=SessionState.DRAINING).update(
                state=SessionState.ENDED)
            ServerProcess.objects.filter(pk=self.process_id).update(
                state=ProcessState.STOPPED, stopped_at=now, heartbeat_at=now)

    def _mark_lost(self):
        """Processes silent for ``lost_after_seconds``: lost, and their open sessions too. A lost
        session ended at its process's last sign of life (its last heartbeat), not when that
        silence was noticed."""
        from pool.models import ServerProcess, Session

        now = timezone.now()
        silent = ServerProcess.objects.filter(
            state__in=LIVE_PROCESS_STATES, heartbeat_at__lt=now - timedelta(seconds=self.lost_after_seconds))
        if self.process_id:
            silent = silent.exclude(pk=self.process_id)
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

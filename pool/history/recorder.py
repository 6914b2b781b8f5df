"""The recorder: one thread per process that writes pool and session rows.

Callers (the session lifecycle on the event loop, the registry from stage threads) only put a
small message on a queue and never wait for the database. The thread writes what has queued up
in one transaction, and keeps it queued through a database outage until the database is back.
The queue carries a handful of lifecycle messages per session (start, end, each unit state
change) and its history (one record per item and per response, at most HISTORY_MAX_ITEMS), never
audio, and it is capped at MAX_PENDING. Between batches the thread beats the process's heartbeat.

What is written is elsewhere: the rows of sessions, units and history in ``rows``, the process's
own row and lost processes in ``processes``.
"""

import logging
import queue
import threading
import time
from dataclasses import asdict

from django.db import InterfaceError, OperationalError, close_old_connections, connection, transaction
from django.utils import timezone

from pool.history import processes, rows
from pool.history.rows import ItemRecord
from pool.history.storable import storable_row

log = logging.getLogger(__name__)

_STOP = object()
BATCH = 200  # messages written per transaction
RETRY_MAX_SECONDS = 5.0  # the longest pause between attempts while the database is unavailable
MAX_PENDING = 20_000  # messages kept while the database is down (a session makes about six)


class _Flush:
    """A marker in the queue: ``done`` is set once every message before it is written."""

    def __init__(self, done):
        self.done = done


class NoRecords:
    """The recorder's interface, doing nothing: for pools built without a database (unit tests)."""

    process_id = None
    control_channel = None  # where this process takes operator commands (pool.control)
    on_draining = None  # called (on the recorder thread) when the process row says "draining"

    def session_started(self, session_id, unit_index, api_key_id=None, client_address=None, transport="websocket"):
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
        self._heartbeat = None  # a processes.Heartbeat, once started
        self.on_draining = None  # called (on the recorder thread) when the process row says "draining"
        self._thread = threading.Thread(target=self._run, daemon=True, name="pool-records")

    # --- called from anywhere, never blocking -----------------------------------------------

    def session_started(self, session_id, unit_index, api_key_id=None, client_address=None, transport="websocket"):
        self._put((rows.session_started, (self.process_id, session_id, unit_index, api_key_id, client_address,
                                          transport, timezone.now())))

    def session_ended(self, session_id, reason, close_code, counts):
        """The session's end (``counts``: the row's counters and ``last_error``). The end is its
        own write of the server's own values, so it cannot fail on what the client sent."""
        from pool.models import Session

        counts = dict(counts)
        last_error = counts.pop("last_error", "")
        self._put((rows.session_ended, (session_id, reason, close_code, counts, timezone.now(), self.release_after)))
        if last_error:
            self._put((rows.update_session, (session_id, storable_row(Session, {"last_error": last_error}))))

    def unit_changed(self, unit, old, new, session_id):
        self._put((rows.unit_changed, (self.process_id, unit.index, old, new, session_id, timezone.now(),
                                       unit.state_seq)))

    def history(self, session_id, record):
        """Keep an ``ItemRecord`` or ``ResponseRecord`` of a session, made storable now."""
        from pool.models import ConversationItem, SessionResponse

        fields = {"session_id": session_id, **asdict(record)}
        if isinstance(record, ItemRecord):
            self._put((rows.history, (ConversationItem, storable_row(ConversationItem, fields))))
        else:
            fields.update(fields.pop("timings") or {})
            self._put((rows.history, (SessionResponse, storable_row(SessionResponse, fields))))

    def recording_saved(self, session_id, names):
        """A session's recording is stored: ``names`` maps "user"/"assistant" to storage names."""
        self._put((rows.update_session, (session_id, {f"{side}_audio": name for side, name in names.items()})))

    def process_draining(self):
        """This process drains: its row says so (the cluster gives it no new reservations)."""
        self._put((processes.set_draining, (self.process_id,)))

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self, units, public_url=""):
        """Register this process (reached by clients at ``public_url``, "" if unknown) and its
        units, synchronously: called before serving."""
        process = processes.register(units, public_url, self.lost_after_seconds)
        self.process_id, self.control_channel = process.pk, process.control_channel
        self._heartbeat = processes.Heartbeat(process.pk, units, self.heartbeat_seconds, self.lost_after_seconds)
        self._heartbeat.on_draining = lambda: self.on_draining and self.on_draining()
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
                batch.append((processes.stopped, (self.process_id,)) if stopping else (self._heartbeat.beat, ()))
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

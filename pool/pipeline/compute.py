"""The deadline-first work queue of the cores the units of a process share.

Units keep their own threads and private queues; what they share is compute. When every unit's
thread called the shared models at the same moment, the OS shared the two cores evenly between
Whisper, llama.cpp and Kokoro runs of every unit (each with threads of its own, 6 and more on 2
cores): the first phrase a waiting user needed competed with the fourth sentence of another reply
that still had seconds of audio queued (BENCHMARKS.md, section 5). A ``ComputeQueue`` runs the
model calls of all units ``workers`` at a time, earliest deadline first (EDF): a turn's
transcript and its reply's first phrase are due when the user stopped speaking, a later phrase
when the audio its client holds runs out, speculative work never (``WHENEVER``: it runs when
nothing else waits).

``workers=1`` by default (``COMPUTE_RUNS_AT_ONCE``): one Kokoro run on both cores finishes a
phrase in about 60 % of the time of two runs on one core each (BENCHMARKS.md, section 5), and
what a waiting user hears first is one phrase.
"""

import itertools
import math
import threading
import time
import weakref
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout

WHENEVER = math.inf  # the deadline of speculative work: due never, run when nothing else is due
IDLE_SECONDS = 5.0  # how often an idle worker looks whether its queue still exists (or is surplus)


class ComputeQueue:
    """Calls to the shared models, run ``workers`` at a time on daemon threads named
    ``{name}-N``, the earliest deadline first (ties: the earliest submitted). Workers
    start with the first call and end once the queue is gone (its model unloaded).

    ``submit`` returns a ``concurrent.futures.Future``; cancelling it removes the call from the
    queue at once (a call already running runs to its end: one ONNX run cannot be interrupted).
    The future's ``compute_seconds`` is the call's own run time, without its wait in the queue.
    Wait for it with ``result(future)``: a call that has run STUCK_SECONDS (a wedged model) no
    longer counts against ``workers``, so the other units' calls get a worker of their own and
    the stuck unit alone waits (to be quarantined by its drain); surplus workers end when idle.
    """

    STUCK_SECONDS = 5.0  # far beyond any one call: Kokoro's longest phrase takes ~1.5 s here

    def __init__(self, name, workers=1):
        self.name = name
        self._workers = workers
        self._threads = []
        self._busy = {}  # worker thread -> perf_counter when its current call started
        self._waiting = {}  # future -> (deadline, order, call)
        self._order = itertools.count()
        self._ready = threading.Condition()

    def submit(self, deadline, fn, *args, **kwargs):
        """Queue ``fn(*args, **kwargs)``, due at ``deadline``: ``time.perf_counter()`` seconds,
        ``WHENEVER`` for speculative work, or a callable returning either, asked each time a
        worker picks its next call (a speculative reply the session adopts moves up at once).
        Returns its Future."""
        future = Future()
        with self._ready:
            self._waiting[future] = (deadline, next(self._order), (fn, args, kwargs))
            self._start_workers()
            self._ready.notify()
        future.add_done_callback(self._forget)
        return future

    def result(self, future, poll=0.5):
        """``future.result()``, starting a worker of its own when every worker is stuck."""
        while True:
            try:
                return future.result(timeout=poll)
            except FutureTimeout:
                self.nudge()

    def nudge(self):
        """Start a worker when calls wait and every worker has been stuck STUCK_SECONDS (a waiter
        that polls its future calls this as it polls)."""
        with self._ready:
            self._start_workers()

    def pending(self):
        """How many calls wait (not counting those running)."""
        with self._ready:
            return len(self._waiting)

    def _rank(self, future):  # under self._ready
        deadline, order, _ = self._waiting[future]
        return (deadline() if callable(deadline) else deadline), order

    def _forget(self, future):
        if future.cancelled():
            with self._ready:
                self._waiting.pop(future, None)

    def _unstuck_workers(self):  # under self._ready
        now = time.perf_counter()
        return sum(1 for t in self._threads if now - self._busy.get(t, now) < self.STUCK_SECONDS)

    def _start_workers(self):  # under self._ready
        while self._waiting and self._unstuck_workers() < self._workers or len(self._threads) < self._workers:
            thread = threading.Thread(target=_work, args=(weakref.ref(self),), daemon=True,
                                      name=f"{self.name}-{len(self._threads)}")
            self._threads.append(thread)
            thread.start()

    def _next(self):
        """The earliest-due call; None when none came for IDLE_SECONDS; False when this worker
        is surplus (started beside a stuck one) and idle: it ends."""
        me = threading.current_thread()
        with self._ready:
            self._busy.pop(me, None)
            if not self._ready.wait_for(lambda: self._waiting, IDLE_SECONDS):
                if len(self._threads) > self._workers:
                    self._threads.remove(me)
                    return False
                return None
            future = min(self._waiting, key=self._rank)  # a handful of units: a scan is enough
            _, _, call = self._waiting.pop(future)
            self._busy[me] = time.perf_counter()
            return future, call


def _work(queue_ref):
    """A worker's loop. It holds its queue only while it takes a call, so a queue no one else
    holds is collected and its idle workers end."""
    while (queue := queue_ref()) is not None:
        work = queue._next()
        del queue
        if work is False:
            return
        if work is None:
            continue
        future, (fn, args, kwargs) = work
        if not future.set_running_or_notify_cancel():
            continue
        started = time.perf_counter()
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - the caller's future carries it
            future.compute_seconds = time.perf_counter() - started
            future.set_exception(exc)
        else:
            future.compute_seconds = time.perf_counter() - started
            future.set_result(result)
        del future, fn, args, kwargs, work


_QUEUES = weakref.WeakKeyDictionary()
_QUEUES_LOCK = threading.Lock()


def queue_of(backends, workers=1):
    """The ComputeQueue of a process's models (``pool.backends.base.Backends``, shared by every
    unit), made on first use with ``workers``."""
    with _QUEUES_LOCK:
        queue = _QUEUES.get(backends)
        if queue is None:
            queue = _QUEUES[backends] = ComputeQueue("compute", workers)
        return queue

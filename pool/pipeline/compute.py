"""The deadline-first work queue of the cores the units of a process share.

Units keep their own threads and private queues; what they share is compute. When every unit's
thread called the shared models at the same moment, the OS shared the two cores evenly between
Whisper, llama.cpp and Kokoro runs of every unit (each with threads of its own, 6 and more on 2
cores): the first phrase a waiting user needed competed with the fourth sentence of another reply
that still had seconds of audio queued (BENCHMARKS.md, section 5). A ``ComputeQueue`` runs the
model calls of all units ``workers`` at a time, earliest deadline first (EDF): a turn's
transcript and its reply's first phrase are due when the user stopped speaking, a later phrase
when the audio its client holds runs out, speculative work never (``WHENEVER``).

``workers=1`` by default (``COMPUTE_RUNS_AT_ONCE``): one Kokoro run on both cores finishes a
phrase in about 60 % of the time of two runs on one core each (BENCHMARKS.md, section 5), and
what a waiting user hears first is one phrase.

**Calls of a model that batches wait for one another** (``batch`` of ``submit``: Whisper's
``transcribe_batch``). A worker that takes such a call takes every other waiting call of the same
``batch`` with it (up to MAX_BATCH) and runs them as one: when several turns end together, their
speculative transcriptions queue behind the first, and one encode and decode of all of them
costs 0.74-0.84x of one after the other (BENCHMARKS.md, section 5g).

**Speculative work runs in the background lane** (``background=True``, ``COMPUTE_BACKGROUND``).
One model run cannot be paused (an ONNX run of a phrase takes most of a second), so with one
lane a user who stopped speaking waited for a speculative reply's synthesis that had the cores
and may never be used. The background lane is one more worker whose thread, and the model
runtime it calls (``background`` of ``submit``: the same model in a runtime whose threads run at
the lowest OS priority; Kokoro's, ``Backends.tts_background``), yield the cores at once: the
kernel preempts them for the foreground. Speculative work of a model with such a copy runs
there; everything else runs in the foreground in deadline order, as with one lane: llama.cpp's
and Whisper's threads run at normal priority whoever calls them, and another reply's later
phrase is real work (measured in the background too, it made the playback stalls of an
overloaded pool 2-3 times longer: BENCHMARKS.md, section 5c). A background run whose reply is
adopted meanwhile is due like any other: when it is due first of all, the foreground waits for
it instead of starting later-due work beside it, and while no foreground run is under way it
runs at normal priority (its worker and its runtime's threads, ``background_threads``): at the
lowest, any busy normal thread (a peek, another process on the box) would take the cores from a
reply a user waits for (BENCHMARKS.md, section 5d). Raising a priority needs CAP_SYS_NICE;
without it an adopted run stays at the lowest. Linux only (per-thread nice values).

**Two later phrases run side by side** (``pair`` of ``submit``: the same model in a runtime of
one thread, Kokoro's ``Backends.tts_pair``). Two Kokoro runs of one thread each synthesize
more speech a second on two cores than one run of two threads after the other (12-27 % on a
Zen 4, BENCHMARKS.md 5i; 18 % for four replies' backlog on a Xeon, 5j), but each takes longer
than it would alone, so only calls that have a
``pair`` run so: the TTS stage gives one to a reply's later phrases, never to the first phrase a
user waits for in silence. A worker takes two such calls at once when they are the earliest due
and the next in deadline order, and neither would be in time alone and late beside the other:
each is due later than twice its expected compute alone (``expected_seconds``, PAIR_SLOWDOWN)
by PAIR_MARGIN_SECONDS (its client holds seconds of audio), or is due already (its client ran
out: when more replies play than two cores synthesize, the backlog clears sooner two at a time).
"""

import itertools
import logging
import math
import threading
import time
import weakref
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass

from pool import metrics
from pool.backends.base import LOWEST_PRIORITY_NICE, PER_THREAD_PRIORITY, lower_thread_priority, set_threads_priority
from pool.conf import get_config

log = logging.getLogger(__name__)

WHENEVER = math.inf  # the deadline of speculative work: due never, run when nothing else is due
IDLE_SECONDS = 5.0  # how often an idle worker looks whether its queue still exists (or is surplus)
RECHECK_SECONDS = 0.02  # a worker with work waiting that it may not take yet looks again this often
MAX_BATCH = 8  # calls run as one batch at most (a pool's turns that end together)
PAIR_SLOWDOWN = 2.0  # a run on one core of two takes at most twice its time on both
PAIR_MARGIN_SECONDS = 0.25  # slack kept beyond that before two calls run side by side


@dataclass(eq=False)
class _Call:
    deadline: object  # perf_counter seconds, WHENEVER, or a callable returning either
    order: int
    fn: object
    args: tuple
    kwargs: dict
    background: object = None  # what runs instead of fn in the background lane (None: fn)
    batch: object = None  # runs this call with others of the same batch (None: alone)
    pair: object = None  # what runs instead of fn beside another call (None: never beside one)
    expected: float = 0.0  # seconds of compute the call takes alone, as its caller expects

    def rank(self):
        return (self.deadline() if callable(self.deadline) else self.deadline), self.order

    def may_run_beside(self, now):
        """Whether this call may run side by side with another: it has a ``pair``, and it would
        be done in time beside one, or is late already (the module's docstring)."""
        if self.pair is None:
            return False
        due = self.rank()[0]
        return due <= now or due - now >= PAIR_SLOWDOWN * self.expected + PAIR_MARGIN_SECONDS


class ComputeQueue:
    """Calls to the shared models, run ``workers`` at a time on daemon threads named
    ``{name}-N``, the earliest deadline first (ties: the earliest submitted); with
    ``background``, speculative work runs on one more thread, ``{name}-background``, at the
    lowest OS priority (the module's docstring), with ``background_threads`` (native thread ids:
    the low-priority runtime's pool), raised with it while an adopted run has the cores. Workers
    start with the first call and end once the queue is gone (its model unloaded).

    ``submit`` returns a ``concurrent.futures.Future``; cancelling it removes the call from the
    queue, or from a batch not yet started, at once (a call already running runs to its end,
    unless its model takes a ``pool.backends.base.RunStop`` and the caller requests it: Kokoro's
    does).
    The future's ``compute_seconds`` is the call's own run time, without its wait in the queue
    (a batch's: the whole batch's; ``batched``: how many calls it ran with itself included);
    its ``background`` says whether it ran in the background lane, where that time includes
    whatever the foreground took from it, and ``paired`` whether it ran side by side with
    another call on one thread (neither is a measure of the model's speed alone).
    Wait for it with ``result(future)``: a call that has run STUCK_SECONDS (a wedged model) no
    longer counts against ``workers``, so the other units' calls get a worker of their own and
    the stuck unit alone waits (to be quarantined by its drain); surplus workers end when idle.
    """

    STUCK_SECONDS = 5.0  # far beyond any one call: Kokoro's longest phrase takes ~1.5 s here

    def __init__(self, name, workers=1, background=False, background_threads=()):
        self.name = name
        self._workers = workers
        self._background = background and PER_THREAD_PRIORITY
        self._background_threads = tuple(background_threads)
        self._background_id = None  # the background worker's native thread id
        self._raised = False  # whether the background lane runs at normal priority now
        self._may_raise = True  # False once the kernel refused (no CAP_SYS_NICE)
        self._threads = []  # the foreground's
        self._background_thread = None
        self._busy = {}  # worker thread -> perf_counter when its current call started
        self._background_call = None  # the _Call running on the background worker
        self._yielding_since = None  # since when the foreground has waited for that call
        self._waiting = {}  # future -> _Call
        self._order = itertools.count()
        self._ready = threading.Condition()

    def submit(self, deadline, fn, *args, background=None, batch=None, pair=None, expected_seconds=0.0, **kwargs):
        """Queue ``fn(*args, **kwargs)``, due at ``deadline``: ``time.perf_counter()`` seconds,
        ``WHENEVER`` for speculative work, or a callable returning either, asked each time a
        worker picks its next call (a speculative reply the session adopts moves up at once).
        ``background``: what the background lane calls instead of ``fn``, with the same
        arguments (the same model in a low-priority runtime); None: ``fn``. ``batch``: a
        callable that runs several such calls as one, ``batch([args, ...])`` -> their results in
        order (positional ``args`` only, no ``kwargs``): a worker that takes this call takes the
        other waiting calls of an equal ``batch`` too. ``pair``: what runs instead of ``fn``, with
        the same arguments, when this call runs side by side with another (the module's
        docstring); ``expected_seconds``: its compute alone, as the caller expects it. Returns its
        Future."""
        if batch is not None and kwargs:
            raise ValueError("a call that may be batched takes positional arguments only")
        if batch is not None and pair is not None:
            raise ValueError("a call runs in a batch or side by side, not both")
        future = Future()
        with self._ready:
            self._waiting[future] = _Call(deadline, next(self._order), fn, args, kwargs, background, batch, pair,
                                          expected_seconds)
            self._start_workers()
            self._ready.notify_all()
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

    def due_waiting(self):
        """How many waiting calls are due at some time: not speculative work (due never, which a
        running call keeps from nothing a user waits for), but an adopted one (its deadline
        moved up)."""
        with self._ready:
            return sum(1 for call in self._waiting.values() if call.rank()[0] != WHENEVER)

    def _forget(self, future):
        if future.cancelled():
            with self._ready:
                self._waiting.pop(future, None)

    def _unstuck_workers(self):  # under self._ready
        now = time.perf_counter()
        return sum(1 for t in self._threads if now - self._busy.get(t, now) < self.STUCK_SECONDS)

    def _start_workers(self):  # under self._ready
        while self._waiting and self._unstuck_workers() < self._workers or len(self._threads) < self._workers:
            thread = threading.Thread(target=_work, args=(weakref.ref(self), False), daemon=True,
                                      name=f"{self.name}-{len(self._threads)}")
            self._threads.append(thread)
            thread.start()
        if self._background and self._background_thread is None:
            self._background_thread = threading.Thread(target=_work, args=(weakref.ref(self), True), daemon=True,
                                                       name=f"{self.name}-background")
            self._background_thread.start()

    def _prioritize_background(self):  # under self._ready
        """An adopted background run (no longer due never) runs at normal priority while no
        foreground run is under way: it is then the work due first, and at the lowest priority
        any busy normal thread would take the cores from it. Otherwise, the lowest again."""
        call = self._background_call
        wanted = (call is not None and call.rank()[0] != WHENEVER
                  and not any(thread in self._busy for thread in self._threads))
        if wanted == self._raised or not self._may_raise:
            return
        if set_threads_priority((self._background_id, *self._background_threads), 0 if wanted else LOWEST_PRIORITY_NICE):
            self._raised = wanted
        else:
            self._may_raise = False
            log.info("an adopted reply's synthesis stays at the lowest priority: raising it needs CAP_SYS_NICE")

    def _pick(self, background):  # under self._ready
        """The future this worker runs next, or None: the earliest-due call of its lane."""
        ranked = sorted(self._waiting.items(), key=lambda item: item[1].rank())  # a handful of units
        if not self._background:
            return ranked[0][0] if ranked else None
        if background:
            return next((future for future, call in ranked if _speculative(call)), None)
        first = next(((future, call) for future, call in ranked if not _speculative(call)), None)
        if first is None:
            return None
        running = self._background_call
        if running is not None and running.rank() < first[1].rank():
            # The background run is due first (its reply was adopted): it has the cores until it
            # is done. How long it waited before says nothing (the foreground preempted it);
            # only STUCK_SECONDS of having the cores to itself make it a wedged model.
            now = time.perf_counter()
            if self._yielding_since is None:
                self._yielding_since = now
            if now - self._yielding_since < self.STUCK_SECONDS:
                return None
        else:
            self._yielding_since = None
        return first[0]

    def _mate(self, call):  # under self._ready
        """The waiting call to run side by side with ``call`` (just taken, the earliest due of
        the foreground), or None: the next in deadline order, when both may run beside another."""
        now = time.perf_counter()
        if not call.may_run_beside(now):
            return None
        waiting = [(other.rank(), future) for future, other in self._waiting.items()
                   if not (self._background and _speculative(other))]
        if not waiting:
            return None
        future = min(waiting, key=lambda item: item[0])[1]
        return future if self._waiting[future].may_run_beside(now) else None

    def _next(self, background):
        """The next ``[(future, call), ...]`` of this worker's lane (several: a batch, or two calls
        side by side, the earliest due first) and whether they run side by side; None when none
        came for IDLE_SECONDS; False when this worker is surplus (started beside a stuck one)
        and idle: it ends."""
        me = threading.current_thread()
        with self._ready:
            self._busy.pop(me, None)
            if background:
                self._background_call, self._background_id = None, threading.get_native_id()
            self._prioritize_background()
            self._ready.notify_all()  # a foreground worker may have waited for this call
            idle_until = time.monotonic() + IDLE_SECONDS
            while (future := self._pick(background)) is None:
                remaining = idle_until - time.monotonic()
                if remaining <= 0:
                    if not background and len(self._threads) > self._workers:
                        self._threads.remove(me)
                        return False
                    return None
                # Deadlines move with time (and callables with the session): look again soon,
                # and, beside a background run, soon see its reply adopted.
                self._ready.wait(min(remaining, RECHECK_SECONDS)
                                 if self._waiting or self._background_call is not None else remaining)
                self._prioritize_background()
            call = self._waiting.pop(future)
            work, paired = [(future, call)], False
            if call.batch is not None and not background:
                mates = sorted((waiting.rank(), other) for other, waiting in self._waiting.items()
                               if waiting.batch == call.batch)
                work += [(other, self._waiting.pop(other)) for _, other in mates[:MAX_BATCH - 1]]
            elif not background and (mate := self._mate(call)) is not None:
                work, paired = [*work, (mate, self._waiting.pop(mate))], True
            self._busy[me] = time.perf_counter()
            if background:
                self._background_call, self._yielding_since = call, None
            self._prioritize_background()
            return work, paired


def _speculative(call):
    """Work for the background lane: due never, for a model with a low-priority copy."""
    return call.background is not None and call.rank()[0] == WHENEVER


def _work(queue_ref, background):
    """A worker's loop. It holds its queue only while it takes a call, so a queue no one else
    holds is collected and its idle workers end."""
    if background:
        lower_thread_priority()
    while (queue := queue_ref()) is not None:
        taken = queue._next(background)
        del queue
        if taken is False:
            return
        if taken is None:
            continue
        work, paired = taken
        work = [(future, call) for future, call in work if future.set_running_or_notify_cancel()]
        paired = paired and len(work) == 2
        if work:  # counted before the futures settle: a caller that has its result sees the count
            how = "side_by_side" if paired else "background" if background else "batch" if len(work) > 1 else "alone"
            metrics.COMPUTE_CALLS.labels(metrics.PROCESS, how).inc(len(work))
        if paired:
            _run_side_by_side(work)
        elif work:
            _run(work, background)
        del work, taken


def _run_side_by_side(work):
    """Run two calls taken together, each on its own thread with its ``pair`` runtime, and
    settle each future when its own run ends; returns when both have."""
    mate = threading.Thread(target=_run, args=(work[1:], False, True), daemon=True,
                            name=f"{threading.current_thread().name}-beside")
    mate.start()
    _run(work[:1], False, True)
    mate.join()


def _run(work, background, paired=False):
    """Run ``[(future, call), ...]`` (taken by one worker, running) and settle each future: one
    call as itself (``paired``: with its ``pair`` runtime, beside another), several as their
    batch."""
    future, call = work[0]
    started = time.perf_counter()
    try:
        if len(work) == 1:
            fn = call.pair if paired else (call.background or call.fn) if background else call.fn
            results = [fn(*call.args, **call.kwargs)]
        else:
            results = call.batch([c.args for _, c in work])
            if len(results) != len(work):
                raise RuntimeError(f"a batch of {len(work)} calls returned {len(results)} results")
    except BaseException as exc:  # noqa: BLE001 - the callers' futures carry it
        outcomes = [(False, exc)] * len(work)
    else:
        outcomes = [(True, result) for result in results]
    seconds = time.perf_counter() - started
    for (future, _), (ok, outcome) in zip(work, outcomes, strict=True):
        future.compute_seconds, future.background, future.batched = seconds, background, len(work)
        future.paired = paired
        if ok:
            future.set_result(outcome)
        else:
            future.set_exception(outcome)


_QUEUES = weakref.WeakKeyDictionary()
_QUEUES_LOCK = threading.Lock()


def queue_of(backends):
    """The ComputeQueue of a process's models (``pool.backends.base.Backends``, shared by every
    unit), made on first use with the settings' COMPUTE_RUNS_AT_ONCE workers and, with
    COMPUTE_BACKGROUND and a low-priority TTS copy (``backends.tts_background``: only its work
    goes there), the background lane on that copy's threads."""
    with _QUEUES_LOCK:
        queue = _QUEUES.get(backends)
        if queue is None:
            config = get_config()
            background = config["COMPUTE_BACKGROUND"] and backends.tts_background is not None
            queue = _QUEUES[backends] = ComputeQueue(
                "compute", config["COMPUTE_RUNS_AT_ONCE"], background,
                getattr(backends.tts_background, "runtime_threads", ()))
        return queue

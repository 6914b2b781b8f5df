"""Silero VAD (v5/v6 ONNX) run through onnxruntime, one shared session, state per stream.

``silero_vad.load_silero_vad`` keeps the recurrent state inside the model object, so one object
cannot serve several sessions; and importing ``silero_vad`` sets torch's thread count for the
whole process. We run the package's own ONNX file directly: the session is shared (onnxruntime's
``run`` is thread-safe) and each stream keeps its own ``state`` (2 x 1 x 128) and 64-sample
context, exactly as ``silero_vad.utils_vad.OnnxWrapper.__call__`` does.

The windows of every stream run as one batch (the graph takes ``input`` B x 576 and ``state``
2 x B x 128): one window alone costs ~110 us of a core back to back and ~250 us when windows
come apart, as 64 listening sessions send them (2,000 a second); in batches of ~10 it costs
~70 us (BENCHMARKS.md, section 3c).
"""

import threading
import time
import weakref

import numpy as np

from pool.backends.base import SPEECH_RATE, VAD_WINDOW_SAMPLES
from pool.backends.onnx import cpu_session

CONTEXT_SAMPLES = 64  # samples of the previous window prepended to each call, as in OnnxWrapper
# A batch waits at most this long (seconds) for the windows of the other streams that sent one
# lately; a stream alone runs at once. Small against a 32 ms window and the VAD's own delays.
GATHER_SECONDS = 0.004
ACTIVE_SECONDS = 0.1  # a stream that sent a window this recently is expected in the next batch
IDLE_SECONDS = 1.0  # the batch thread looks this often whether its model is still used


class SileroVAD:
    """The shared model. ``model_path``: a Silero VAD ``.onnx``; ``threads``: intra-op threads.

    ``new_stream()`` gives one audio stream's ``SileroStream``. Their windows run in batches on
    one thread of this object's own (``vad-batch``, started at the first window): a batch holds
    what came within GATHER_SECONDS, or sooner every stream active in the last ACTIVE_SECONDS.
    A stream that was in the last batch and waits again (audio sent faster than real time, or the
    second window of one append) runs at once: no stream waits for the others twice in a row.
    """

    def __init__(self, model_path, threads=1):
        self.session = cpu_session(model_path, threads)
        self._takes_rate = any(i.name == "sr" for i in self.session.get_inputs())
        self._sr = np.array(SPEECH_RATE, dtype=np.int64)
        self._lock = threading.Condition()
        self._waiting = []  # _Window objects not yet run
        self._active = {}  # id(stream) -> time.monotonic() of its last window
        self._last = set()  # id(stream) of the last batch's windows
        self._thread = None

    def new_stream(self):
        return SileroStream(self)

    def run(self, stream, x, state):
        """``(probability, new state)`` of one window of ``stream``: ``x`` 1 x 576 float32
        (context and window), ``state`` 2 x 1 x 128. Blocks until its batch has run; raises what
        onnxruntime raised for that batch."""
        window = _Window(id(stream), x, state)
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=_serve, args=(weakref.ref(self),), daemon=True,
                                                name="vad-batch")
                self._thread.start()
            self._waiting.append(window)
            self._lock.notify()
        window.done.wait()
        if window.error is not None:
            raise window.error
        return window.result

    def _run_batch(self, batch):
        try:
            feed = {"input": np.concatenate([w.x for w in batch]),
                    "state": np.concatenate([w.state for w in batch], axis=1)}
            if self._takes_rate:
                feed["sr"] = self._sr
            out, state = self.session.run(None, feed)
            for i, w in enumerate(batch):
                w.result = float(out[i, 0]), state[:, i:i + 1, :].copy()
        except Exception as exc:  # noqa: BLE001 - each caller raises it; this thread goes on
            for w in batch:
                w.error = exc
        for w in batch:
            w.done.set()

    def _next_batch(self):
        """The next windows to run together, or None after IDLE_SECONDS without any."""
        with self._lock:
            if not self._waiting:
                self._lock.wait(IDLE_SECONDS)
                if not self._waiting:
                    return None
            now = time.monotonic()
            self._active = {k: t for k, t in self._active.items() if now - t < ACTIVE_SECONDS}
            expected = len(self._active.keys() | {w.stream for w in self._waiting})
            deadline = now + GATHER_SECONDS
            while (len(self._waiting) < expected and not self._last.intersection(w.stream for w in self._waiting)
                   and (left := deadline - time.monotonic()) > 0):
                self._lock.wait(left)
            batch, self._waiting = self._waiting, []
            self._last = {w.stream for w in batch}
            for w in batch:
                self._active[w.stream] = now
            return batch


def _serve(vad_ref):
    """The batch thread's loop. It holds the model only while it takes and runs a batch, so a
    model no one else holds is collected and its thread ends."""
    while (vad := vad_ref()) is not None:
        batch = vad._next_batch()
        if batch:
            vad._run_batch(batch)
        del vad, batch


class _Window:
    __slots__ = ("stream", "x", "state", "result", "error", "done")

    def __init__(self, stream, x, state):
        self.stream, self.x, self.state = stream, x, state
        self.result = self.error = None
        self.done = threading.Event()


class SileroStream:
    """Speech probability of consecutive 32 ms windows of one audio stream."""

    def __init__(self, vad):
        self._vad = vad
        self.reset()

    def reset(self):
        self._state = np.zeros((2, 1, 128), dtype=np.float32)
        self._context = np.zeros((1, CONTEXT_SAMPLES), dtype=np.float32)

    def probability(self, window):
        """Speech probability of ``window`` (512 float32 samples at 16 kHz). Raises ValueError."""
        if window.shape != (VAD_WINDOW_SAMPLES,):
            raise ValueError(f"Silero VAD takes {VAD_WINDOW_SAMPLES} samples, got {window.shape}")
        x = np.concatenate([self._context, window[np.newaxis, :].astype(np.float32)], axis=1)
        probability, self._state = self._vad.run(self, x, self._state)
        self._context = x[:, -CONTEXT_SAMPLES:]
        return probability

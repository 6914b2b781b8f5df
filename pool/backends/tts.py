"""Text to speech with Kokoro-82M through kokoro-onnx, one shared model for all units."""

import contextlib
import threading

import numpy as np
import onnxruntime as ort

from pool.backends.base import RunStoppedError, at_priority
from pool.backends.onnx import cpu_session
from pool.backends.voices import espeak_language, resolve_voice, voice_language


class KokoroTTS:
    """``model_path``: Kokoro ``.onnx``; ``voices_path``: ``.npz`` of (510, 1, 256) style vectors.

    onnxruntime's ``run`` is thread-safe, but the espeak-ng phonemizer behind kokoro-onnx keeps
    global state, so phonemization takes a lock (one for every KokoroTTS) and synthesis does not.
    """

    _phonemize_lock = threading.Lock()
    stops = True  # synthesize takes a RunStop (pool.backends.base.TTS)
    runtime_threads = ()  # its runtime's threads (native ids) when loaded by pool.backends.base.at_priority

    def __init__(self, model_path, voices_path, threads=2):
        from kokoro_onnx import Kokoro

        session = cpu_session(model_path, threads)
        self.kokoro = Kokoro.from_session(session, str(voices_path))
        self.kokoro.sess = self._session = _StoppableSession(session)
        self.voices = frozenset(self.kokoro.get_voices())
        self.languages = frozenset(voice_language(v) for v in self.voices) - {None}
        self._paths = (model_path, voices_path, threads)

    def at_lowest_priority(self):
        """The same model in a second onnxruntime session whose thread pool runs at the lowest
        OS priority (``pool.backends.base.at_priority``), for the compute queue's
        background lane, with its ``runtime_threads`` (native ids of that thread pool's threads,
        which the lane raises while an adopted reply's phrase runs there). Costs the model's
        memory once more (int8: ~150 MB resident)."""
        copy, threads = at_priority(lambda: type(self)(*self._paths))
        copy.runtime_threads = threads
        return copy

    def on_one_thread(self):
        """The same model in a second onnxruntime session of one intra-op thread, for the compute
        queue's runs side by side (``pool.pipeline.compute``): each concurrent ``run`` of such a
        session computes on its caller's thread alone. Costs the model's memory once more
        (190 MB resident for int8-gemm, 396 MB for fp32: BENCHMARKS.md 5j)."""
        return type(self)(*self._paths[:2], threads=1)

    def resolve_voice(self, name):
        return resolve_voice(name, self.voices)

    def synthesize(self, text, voice, speed=1.0, stop=None):
        """Speech for ``text``: float32 mono at 24 kHz (empty array for text with no phonemes).
        ``stop``: a ``RunStop``; once requested, onnxruntime ends the run at its next node and
        this raises ``RunStoppedError``."""
        voice = self.resolve_voice(voice)
        with self._phonemize_lock:
            phonemes = self.kokoro.tokenizer.phonemize(text, espeak_language(voice))
        if not phonemes.strip():
            return np.zeros(0, dtype=np.float32)
        with self._session.stoppable(stop) as options:
            try:
                audio, _rate = self.kokoro.create(phonemes, voice=voice, speed=speed, is_phonemes=True)
            except Exception as exc:  # onnxruntime's "Exiting due to terminate flag being set"
                if options is not None and options.terminate:
                    raise RunStoppedError(text) from exc
                raise
        return audio.astype(np.float32, copy=False)


class _StoppableSession:
    """An onnxruntime session that runs with the ``RunOptions`` its calling thread set:
    kokoro-onnx calls ``run(output_names, feeds)`` with none, and a run can only be ended early
    through its options (``terminate``, checked between the graph's nodes)."""

    def __init__(self, session):
        self._session = session
        self._local = threading.local()

    def __getattr__(self, name):
        return getattr(self._session, name)

    def run(self, output_names, feeds, run_options=None):
        return self._session.run(output_names, feeds, run_options or getattr(self._local, "options", None))

    @contextlib.contextmanager
    def stoppable(self, stop):
        """A context for this thread's runs: yields their ``RunOptions``, whose ``terminate`` is
        set when ``stop`` is requested (None, and the runs are not stoppable, without a stop)."""
        if stop is None:
            yield None
            return
        options = self._local.options = ort.RunOptions()
        stop.on_request(lambda: setattr(options, "terminate", True))
        try:
            yield options
        finally:
            self._local.options = None

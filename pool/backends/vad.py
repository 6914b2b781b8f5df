"""Silero VAD (v5/v6 ONNX) run through onnxruntime, one shared session, state per stream.

``silero_vad.load_silero_vad`` keeps the recurrent state inside the model object, so one object
cannot serve several sessions; and importing ``silero_vad`` sets torch's thread count for the
whole process. We run the package's own ONNX file directly: the session is shared (onnxruntime's
``run`` is thread-safe) and each stream keeps its own ``state`` (2 x 1 x 128) and 64-sample
context, exactly as ``silero_vad.utils_vad.OnnxWrapper.__call__`` does.
"""

import numpy as np

from pool.backends.base import SPEECH_RATE, VAD_WINDOW_SAMPLES
from pool.backends.onnx import cpu_session

CONTEXT_SAMPLES = 64  # samples of the previous window prepended to each call, as in OnnxWrapper


class SileroVAD:
    """The shared model. ``model_path``: a Silero VAD ``.onnx``; ``threads``: intra-op threads."""

    def __init__(self, model_path, threads=1):
        self.session = cpu_session(model_path, threads)

    def new_stream(self):
        return SileroStream(self.session)


class SileroStream:
    """Speech probability of consecutive 32 ms windows of one audio stream."""

    def __init__(self, session):
        self._session = session
        self._sr = np.array(SPEECH_RATE, dtype=np.int64)
        self.reset()

    def reset(self):
        self._state = np.zeros((2, 1, 128), dtype=np.float32)
        self._context = np.zeros((1, CONTEXT_SAMPLES), dtype=np.float32)

    def probability(self, window):
        """Speech probability of ``window`` (512 float32 samples at 16 kHz). Raises ValueError."""
        if window.shape != (VAD_WINDOW_SAMPLES,):
            raise ValueError(f"Silero VAD takes {VAD_WINDOW_SAMPLES} samples, got {window.shape}")
        x = np.concatenate([self._context, window[np.newaxis, :].astype(np.float32)], axis=1)
        out, self._state = self._session.run(None, {"input": x, "state": self._state, "sr": self._sr})
        self._context = x[:, -CONTEXT_SAMPLES:]
        return float(out[0, 0])

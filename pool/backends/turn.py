"""End of turn: Smart Turn v3.2, an audio model that says whether the speaker has finished.

Smart Turn (pipecat-ai, BSD-2-Clause) is an ONNX classifier over Whisper log-mel features of
the last 8 s of a turn at 16 kHz, zero-padded at the front. It hears intonation and rhythm, so
it tells "ask not" + pause (unfinished) from "fellow Americans." + pause (finished) where a
silence timer cannot. The ``pipecat-ai`` wheel is installed with ``--no-deps`` and never
imported; ``pool.backends.cache`` copies the model file into the cache after checking its sha256.
Features come from transformers' ``WhisperFeatureExtractor(chunk_length=8)``, which gives the
same numbers as pipecat's vendored code (``smart_turn/_whisper_features.py``).
"""

import threading

import numpy as np

from pool.backends.base import SPEECH_RATE
from pool.backends.onnx import cpu_session

WINDOW_SECONDS = 8  # the model's input: the last 8 s of the turn
WINDOW_SAMPLES = WINDOW_SECONDS * SPEECH_RATE
COMPLETE = 0.5  # probability above which the turn is finished (pipecat's threshold)


class SmartTurn:
    """The shared end-of-turn model. ``model_path``: the Smart Turn v3.x ``.onnx`` file.

    One onnxruntime session serves every unit (``run`` is thread-safe); one thread per call,
    about 60 ms on this project's 2-core reference machine (BENCHMARKS.md).
    """

    def __init__(self, model_path, threads=1):
        from transformers import WhisperFeatureExtractor

        self._session = cpu_session(model_path, threads)
        self._features = WhisperFeatureExtractor(chunk_length=WINDOW_SECONDS)
        self._lock = threading.Lock()  # the feature extractor is not documented as thread-safe

    def probability(self, audio):
        """Probability in [0, 1] that the turn in ``audio`` (float32 mono, 16 kHz, the turn so
        far with its trailing pause) is finished."""
        audio = np.asarray(audio, dtype=np.float32)[-WINDOW_SAMPLES:]
        audio = np.pad(audio, (WINDOW_SAMPLES - len(audio), 0))
        with self._lock:
            features = self._features(audio, sampling_rate=SPEECH_RATE, return_tensors="np",
                                      do_normalize=True).input_features
        out = self._session.run(None, {"input_features": features.astype(np.float32)})[0]
        return float(out.reshape(-1)[0])

    def is_complete(self, audio):
        return self.probability(audio) > COMPLETE

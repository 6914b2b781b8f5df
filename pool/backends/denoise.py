"""Noise reduction before the VAD and the STT: RNNoise (Xiph's recurrent denoiser, Valin 2018,
"A Hybrid DSP/Deep Learning Approach to Real-Time Full-Band Speech Enhancement").

The library is the ``librnnoise.so`` that the ``pyrnnoise`` wheel ships (installed with
``--no-deps``: its Python wrapper pulls matplotlib and an audio I/O stack for its command line).
It is called here through ``ctypes`` with its own three functions: ``rnnoise_create``,
``rnnoise_process_frame`` (480 samples at 48 kHz, float32 in the int16 range, in place) and
``rnnoise_destroy``. RNNoise has one model for near and far microphones, so both of OpenAI's
``noise_reduction`` types use it.
"""

import ctypes
import threading

import numpy as np
import soxr

from pool.backends.base import SPEECH_RATE

RNNOISE_RATE = 48_000  # RNNoise's only rate
FRAME = 480  # samples at 48 kHz a call: 10 ms
_LOCK = threading.Lock()  # the library is loaded once per process
_LIB = None


def _library():
    global _LIB
    with _LOCK:
        if _LIB is None:
            from pool.backends.cache import package_dir  # the wheel's folder, without importing its wrapper

            lib = ctypes.CDLL(str(package_dir("pyrnnoise") / "librnnoise.so"))
            lib.rnnoise_create.argtypes, lib.rnnoise_create.restype = [ctypes.c_void_p], ctypes.c_void_p
            lib.rnnoise_destroy.argtypes = [ctypes.c_void_p]
            lib.rnnoise_process_frame.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_float),
                                                  ctypes.POINTER(ctypes.c_float)]
            lib.rnnoise_process_frame.restype = ctypes.c_float
            if lib.rnnoise_get_frame_size() != FRAME:
                raise OSError(f"librnnoise works in frames of {lib.rnnoise_get_frame_size()} samples, not {FRAME}")
            _LIB = lib
    return _LIB


class RNNoise:
    """The denoiser of the pool: one per process; each unit's VAD thread owns a stream of it.
    Raises ``pool.backends.cache.PreparationError`` when the ``pyrnnoise`` wheel is missing."""

    def __init__(self):
        _library()

    def new_stream(self):
        return DenoiseStream()


class DenoiseStream:
    """One unit's denoising state: ``process(samples)`` takes float32 mono at 16 kHz and returns
    the denoised audio at 16 kHz, up to a frame and the two resamplers' delay behind (about 50
    ms: what is held back comes out with the next call, so a turn's last 50 ms wait for more input);
    ``reset()`` forgets the last session (RNNoise's state and the resamplers')."""

    def __init__(self):
        self._lib = _library()
        self._state = None
        self.reset()

    def reset(self):
        if self._state is not None:
            self._lib.rnnoise_destroy(self._state)
        self._state = self._lib.rnnoise_create(None)
        self._up = soxr.ResampleStream(SPEECH_RATE, RNNOISE_RATE, 1, dtype="float32")
        self._down = soxr.ResampleStream(RNNOISE_RATE, SPEECH_RATE, 1, dtype="float32")
        self._pending = np.zeros(0, dtype=np.float32)  # 48 kHz samples short of a frame

    def process(self, samples):
        audio = np.concatenate([self._pending, self._up.resample_chunk(samples)])
        whole = len(audio) - len(audio) % FRAME
        frames = np.ascontiguousarray(audio[:whole] * 32768.0, dtype=np.float32)
        pointer = ctypes.POINTER(ctypes.c_float)
        for start in range(0, whole, FRAME):
            frame = frames[start:start + FRAME]
            at = frame.ctypes.data_as(pointer)
            self._lib.rnnoise_process_frame(self._state, at, at)
        self._pending = audio[whole:].copy()
        return self._down.resample_chunk(frames / 32768.0)

    def __del__(self):
        if self._state is not None:
            self._lib.rnnoise_destroy(self._state)
            self._state = None

"""Text to speech with Kokoro-82M through kokoro-onnx, one shared model for all units."""

import threading

import numpy as np

from pool.backends.onnx import cpu_session
from pool.backends.voices import espeak_language, resolve_voice, voice_language


class KokoroTTS:
    """``model_path``: Kokoro ``.onnx``; ``voices_path``: ``.npz`` of (510, 1, 256) style vectors.

    onnxruntime's ``run`` is thread-safe, but the espeak-ng phonemizer behind kokoro-onnx keeps
    global state, so phonemization takes a lock and synthesis does not.
    """

    def __init__(self, model_path, voices_path, threads=2):
        from kokoro_onnx import Kokoro

        session = cpu_session(model_path, threads)
        self.kokoro = Kokoro.from_session(session, str(voices_path))
        self.voices = frozenset(self.kokoro.get_voices())
        self.languages = frozenset(voice_language(v) for v in self.voices) - {None}
        self._phonemize_lock = threading.Lock()

    def resolve_voice(self, name):
        return resolve_voice(name, self.voices)

    def synthesize(self, text, voice, speed=1.0):
        """Speech for ``text``: float32 mono at 24 kHz (empty array for text with no phonemes)."""
        voice = self.resolve_voice(voice)
        with self._phonemize_lock:
            phonemes = self.kokoro.tokenizer.phonemize(text, espeak_language(voice))
        if not phonemes.strip():
            return np.zeros(0, dtype=np.float32)
        audio, _rate = self.kokoro.create(phonemes, voice=voice, speed=speed, is_phonemes=True)
        return audio.astype(np.float32, copy=False)

"""Text to speech with Kokoro-82M through kokoro-onnx, one shared model for all units."""

import re
import threading

import numpy as np

from pool.backends.onnx import cpu_session

# OpenAI voice names -> Kokoro v1.0 voices shipped in pool/data/voices. A client that asks for any
# of these hears a real voice; an unknown name falls back to DEFAULT_VOICE (never silence).
OPENAI_VOICES = {
    "alloy": "af_alloy",
    "ash": "am_adam",
    "ballad": "bm_fable",
    "coral": "af_heart",
    "echo": "am_echo",
    "sage": "af_sarah",
    "shimmer": "af_nova",
    "verse": "am_puck",
    "marin": "af_bella",
    "cedar": "am_onyx",
}
DEFAULT_VOICE = "af_heart"
# The voice that speaks a reply in a language the session's voice does not (docs/PROTOCOL.md).
LANGUAGE_VOICES = {"en": "af_heart", "es": "ef_dora", "fr": "ff_siwis", "it": "if_sara", "pt": "pf_dora",
                   "hi": "hf_alpha"}
# espeak-ng's language for each Kokoro voice prefix (kokoro-onnx phonemizes with espeak-ng).
ESPEAK_LANGUAGES = {"a": "en-us", "b": "en-gb", "e": "es", "f": "fr-fr", "h": "hi", "i": "it", "p": "pt-br"}
# A Kokoro voice name starts with its language (Kokoro-82M's VOICES.md): a/b American/British
# English, e Spanish, f French, h Hindi, i Italian, j Japanese, p Brazilian Portuguese, z Mandarin.
KOKORO_LANGUAGES = {"a": "en", "b": "en", "e": "es", "f": "fr", "h": "hi", "i": "it", "j": "ja",
                    "p": "pt", "z": "zh"}


def voice_language(name):
    """The language (ISO 639-1) of a Kokoro voice name such as ``ef_dora``; None for any other
    name (an OpenAI voice name, or a name that is not Kokoro's)."""
    if re.fullmatch(r"[a-z][fm]_[a-z]+", str(name)):
        return KOKORO_LANGUAGES.get(name[0])
    return None


def voice_for_language(voice, language, available):
    """The voice a reply in ``language`` (ISO 639-1, or None) is spoken with: the session's
    ``voice`` when it speaks that language (an OpenAI name is English), else ``LANGUAGE_VOICES``'s
    voice for it when ``available`` has it, else ``voice`` all the same."""
    if language is None or voice_language(OPENAI_VOICES.get(str(voice).lower(), voice)) == language:
        return voice
    fallback = LANGUAGE_VOICES.get(language)
    return fallback if fallback in available else voice


def resolve_voice(name, available):
    """Kokoro voice for a client voice name: a Kokoro name as is, an OpenAI name mapped, else default."""
    if name in available:
        return name
    mapped = OPENAI_VOICES.get(str(name).lower())
    return mapped if mapped in available else DEFAULT_VOICE


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
            phonemes = self.kokoro.tokenizer.phonemize(text, ESPEAK_LANGUAGES.get(voice[0], "en-us"))
        if not phonemes.strip():
            return np.zeros(0, dtype=np.float32)
        audio, _rate = self.kokoro.create(phonemes, voice=voice, speed=speed, is_phonemes=True)
        return audio.astype(np.float32, copy=False)

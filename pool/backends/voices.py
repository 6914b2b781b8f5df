"""Voices and languages, in one place: the OpenAI voice names and the Kokoro voices they map to,
the language of each Kokoro voice, and the languages a reply can be spoken in.

Pure tables and functions (no model runtime): the protocol layer checks a session's voice with
them, the TTS speaks with them.
"""

import re
from dataclasses import dataclass

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


@dataclass(frozen=True)
class Language:
    """A language a user may speak (ISO 639-1 code, the key of ``LANGUAGES``): ``name``, as the
    LLM is told ("Answer in Spanish"), and ``voice``, the Kokoro voice that speaks a reply in it
    (docs/PROTOCOL.md, *Languages*), or None where no voice speaks it well."""

    name: str
    voice: str | None = None


LANGUAGES = {
    "en": Language("English", "af_heart"), "es": Language("Spanish", "ef_dora"),
    "fr": Language("French", "ff_siwis"), "it": Language("Italian", "if_sara"),
    "pt": Language("Portuguese", "pf_dora"), "hi": Language("Hindi", "hf_alpha"),
    "de": Language("German"), "ja": Language("Japanese"), "zh": Language("Chinese"),
}
# A Kokoro voice name starts with its language (Kokoro-82M's VOICES.md): a/b American/British
# English, e Spanish, f French, h Hindi, i Italian, j Japanese, p Brazilian Portuguese, z Mandarin;
# each with the espeak-ng voice kokoro-onnx phonemizes it with (None: espeak-ng's English).
KOKORO_PREFIXES = {"a": ("en", "en-us"), "b": ("en", "en-gb"), "e": ("es", "es"), "f": ("fr", "fr-fr"),
                   "h": ("hi", "hi"), "i": ("it", "it"), "j": ("ja", None), "p": ("pt", "pt-br"),
                   "z": ("zh", None)}


def voice_language(name):
    """The language (ISO 639-1) of a Kokoro voice name such as ``ef_dora``; None for any other
    name (an OpenAI voice name, or a name that is not Kokoro's)."""
    if re.fullmatch(r"[a-z][fm]_[a-z]+", str(name)) and name[0] in KOKORO_PREFIXES:
        return KOKORO_PREFIXES[name[0]][0]
    return None


def espeak_language(voice):
    """The espeak-ng voice that phonemizes text for the Kokoro ``voice``."""
    return (KOKORO_PREFIXES.get(voice[0], (None, None))[1]) or "en-us"


def voice_for_language(voice, language, available):
    """The voice a reply in ``language`` (ISO 639-1, or None) is spoken with: the session's
    ``voice`` when it speaks that language (an OpenAI name is English), else the language's own
    voice (``LANGUAGES``) when ``available`` has it, else ``voice`` all the same."""
    if language is None or voice_language(OPENAI_VOICES.get(str(voice).lower(), voice)) == language:
        return voice
    fallback = LANGUAGES[language].voice if language in LANGUAGES else None
    return fallback if fallback in available else voice


def resolve_voice(name, available):
    """Kokoro voice for a client voice name: a Kokoro name as is, an OpenAI name mapped, else default."""
    if name in available:
        return name
    mapped = OPENAI_VOICES.get(str(name).lower())
    return mapped if mapped in available else DEFAULT_VOICE

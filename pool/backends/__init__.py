"""The models behind the four stages, loaded once per process and shared by every unit.

Each stage's backend is any object with the methods of its ``Protocol`` below (structural
typing: nothing to inherit). The default set is Silero VAD, faster-whisper, llama.cpp or
transformers, Kokoro and Smart Turn (this package's modules); the scripted test backend
(``scripted.py``) has the same shape. ``load_backends(config)`` builds them from the settings.
"""

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

log = logging.getLogger(__name__)

SPEECH_RATE = 16_000  # Hz: what the VAD, the STT and the end-of-turn model take (mono float32)
TTS_RATE = 24_000  # Hz: what the TTS returns (mono float32)


class VADStream(Protocol):
    """One session's VAD state (Silero keeps a recurrent state between windows)."""

    def probability(self, window: np.ndarray) -> float:
        """The speech probability in [0, 1] of ``window``: 512 float32 samples at 16 kHz (32 ms)."""

    def reset(self) -> None:
        """Forget the session (a new one starts on this stream)."""


class VAD(Protocol):
    def new_stream(self) -> VADStream:
        """A VAD state for one unit (each unit's VAD thread owns one)."""


class STT(Protocol):
    languages: frozenset  # ISO 639-1 codes the model transcribes

    def transcribe(self, audio: np.ndarray, language: str | None = None, prompt: str | None = None) -> str:
        """The words of ``audio`` (float32 mono at 16 kHz). ``language``: None lets the model
        detect it; ``prompt``: text to bias the spelling (Whisper's initial prompt)."""

    def transcribe_detect(self, audio: np.ndarray, language: str | None = None,
                          prompt: str | None = None) -> tuple[str, str | None]:
        """``(transcript, language)``: as ``transcribe``, with the language the words are in
        (``language`` when given, else what the model detected; None when it cannot say).
        Optional: without it, a turn's language is the session's."""


class LLM(Protocol):
    resumes: bool  # True: the LLM stage pauses a reply by stopping it and continuing from
    # ``request.prefix`` later; False: by blocking its stream

    def generate(self, request, on_text: Callable[[str], None], should_stop: Callable[[], bool],
                 on_function_call: Callable[..., None] | None = None) -> dict:
        """Generate the reply to ``request`` (``pool.backends.llm.LLMRequest``): stream its text
        through ``on_text(text)``; report a tool call as ``on_function_call(name, arguments,
        call_id=None)`` (``arguments``: a JSON string) instead of text; return as soon as
        ``should_stop()`` is true. Returns usage: ``{"input_tokens", "output_tokens"}``."""


class TTS(Protocol):
    voices: frozenset  # voice names the model has
    languages: frozenset  # ISO 639-1 codes of those voices

    def resolve_voice(self, name: str) -> str:
        """The model's voice for a session's ``voice`` (an OpenAI voice name maps to one)."""

    def synthesize(self, text: str, voice: str, speed: float = 1.0) -> np.ndarray:
        """Speech for ``text``: float32 mono at 24 kHz."""


class TurnModel(Protocol):
    def is_complete(self, audio: np.ndarray) -> bool:
        """Whether the user has finished their turn: ``audio`` is the turn so far, float32 mono
        at 16 kHz (``semantic_vad``; ``pool.backends.turn.SmartTurn``)."""


@dataclass(frozen=True)
class Backends:
    vad: VAD
    stt: STT
    llm: LLM
    tts: TTS
    turn: TurnModel | None = None  # None: semantic_vad ends turns on silence alone


# The short names S2S["BACKEND"] takes; anything else is the dotted path of a loader.
LOADERS = {"default": "pool.backends.load_default", "scripted": "pool.backends.scripted.load_scripted"}


class InvalidBackendError(ImproperlyConfigured):
    """S2S["BACKEND"] names no loader that can be imported."""


def backend_loader(name):
    """The loader ``S2S["BACKEND"]`` names: "default", "scripted", or the dotted path of a
    callable ``load(config) -> Backends`` (a host project's own models), imported as channels
    imports ``CHANNEL_LAYERS`` backends. Raises InvalidBackendError."""
    path = LOADERS.get(name, name)
    try:
        return import_string(path)
    except ImportError as exc:
        raise InvalidBackendError(f"S2S['BACKEND'] = {name!r}: cannot import {path!r} ({exc}). Use "
                                  f"'default', 'scripted' or the dotted path of a loader function.") from exc


def load_backends(config):
    """The backends of ``config["BACKEND"]`` (``backend_loader``), loaded."""
    return backend_loader(config["BACKEND"])(config)


def load_default(config):
    """Silero VAD, faster-whisper, the LLM of ``pool.backends.llm.load_llm``, Kokoro and Smart
    Turn. They need the prepared model cache (``manage.py prepare_models``), prepared here when
    missing. Raises ``pool.backends.cache.PreparationError`` when it cannot be, when a file of the cache
    is damaged (its size changed), or when a model file does not load: one line that names the
    file and the command that mends it."""
    from pool.backends.cache import PreparationError, damage, default_paths, is_prepared, prepare
    from pool.backends.llm import load_llm
    from pool.backends.stt import WhisperSTT
    from pool.backends.tts import KokoroTTS
    from pool.backends.turn import SmartTurn
    from pool.backends.vad import SileroVAD

    cache, preset = config["MODEL_CACHE_DIR"], config["PRESET"]
    if not is_prepared(cache, preset):
        problems = damage(cache) + (damage(cache, preset) if preset != "english" else [])
        if problems:
            raise PreparationError(f"The model cache is damaged: {problems[0]}. Run `manage.py prepare_models` "
                                   "to rebuild it.")
        prepare(cache, preset=preset)
    paths = default_paths(cache, preset)
    threads = config["THREADS"]
    started = time.perf_counter()

    def load(setting, default, make):
        path = config[setting] or default
        try:
            return make(path)
        except Exception as exc:  # noqa: BLE001 - any loader's error, said in one line
            mend = (f"check S2S['{setting}']" if config[setting] else
                    "`manage.py prepare_models --verify` checks every model file and rebuilds what is damaged")
            first = (str(exc).strip().splitlines() or [""])[0][:300]
            raise PreparationError(f"{path} could not be loaded ({type(exc).__name__}: {first}); {mend}.") from exc

    backends = Backends(
        vad=load("VAD_MODEL", paths["vad"], lambda path: SileroVAD(path, threads["vad"])),
        stt=load("STT_MODEL", paths["stt"], lambda path: WhisperSTT(path, threads["stt"])),
        llm=load("LLM_MODEL", paths["llm"], lambda path: load_llm(config, path)),
        tts=load("TTS_MODEL", paths["tts_model"], lambda path: KokoroTTS(
            path, config["TTS_VOICES"] or paths["tts_voices"], threads["tts"])),
        turn=load("TURN_MODEL", paths["turn"], SmartTurn),
    )
    log.info("Models loaded in %.1f s", time.perf_counter() - started)
    return backends

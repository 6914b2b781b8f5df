"""The models behind the four stages, loaded once per process and shared by every unit.

Each stage's backend is any object with the methods of its ``Protocol`` in ``base`` (structural
typing: nothing to inherit). The default set is Silero VAD, faster-whisper, llama.cpp or
transformers, Kokoro and Smart Turn (this package's modules), from the model cache (``cache``);
the scripted test backend (``scripted``) has the same shape; the voice and language tables are
``voices``. ``load_backends(config)`` builds them from the settings. The package's modules import
``base`` and ``voices``, never this ``__init__``, which imports them only to load them.
"""

import logging
import time

from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from pool.backends.base import PER_THREAD_PRIORITY, Backends

log = logging.getLogger(__name__)

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
    """The backends of ``config["BACKEND"]`` (``backend_loader``), loaded; first numpy's BLAS is
    held to ``THREADS["blas"]`` threads for the process when that is a count
    (``limit_blas_threads``; "auto" is the default backend's, timed with its Whisper)."""
    if config["THREADS"]["blas"] != "auto":
        limit_blas_threads(config["THREADS"]["blas"])
    return backend_loader(config["BACKEND"])(config)


def limit_blas_threads(threads):
    """Hold numpy's BLAS (OpenBLAS) to ``threads`` threads for the whole process (None: leave it).

    OpenBLAS keeps a helper thread per core and, after each call, lets it spin for a while
    (about 0.1 s) before it sleeps. The STT's feature extraction makes one matrix product per
    transcription: under 64 listening sessions that helper spun a quarter of a core that the
    event loop needed (BENCHMARKS.md, section 3c). One thread runs the product in the calling
    thread, and nothing spins. Not always right: the same spin kept the second core of a VM
    awake while CTranslate2 encoded and decoded, and without it a transcription took 125 ms
    instead of 90 on a Zen 3 (4 s of speech, same section); on a Zen 5 it made no difference
    (3d). Hence the default "auto", timed on each CPU (``cache.blas_threads``). Uses
    threadpoolctl, which finds the BLAS numpy loaded, whatever its name."""
    if threads is None:
        return
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=threads, user_api="blas")


def load_denoiser():
    """RNNoise (``pool.backends.denoise``), or None when its wheel is not installed (sessions'
    noise_reduction is then stored, not acted on; logged once here)."""
    from pool.backends.cache import PreparationError
    from pool.backends.denoise import RNNoise

    try:
        return RNNoise()
    except (PreparationError, OSError) as exc:
        log.warning("noise_reduction will not be acted on: %s", exc)
        return None


def load_echo_canceller():
    """WebRTC's echo canceller (``pool.backends.echo``), or None when the ``livekit`` wheel is not
    installed (the microphone is then taken as it comes; logged once here)."""
    from pool.backends.echo import EchoCanceller

    try:
        return EchoCanceller()
    except ImportError as exc:
        log.warning("echo cancellation is off: %s", exc)
        return None


def load_default(config):
    """Silero VAD, faster-whisper, the LLM of ``pool.backends.llm.load_llm`` (the GGUF chosen
    with ``prepare_models --llm`` when there is one, ``pool.backends.fetch``), Kokoro (the variant
    of ``S2S["TTS_VARIANT"]``; "auto": the faster on this CPU, ``cache.tts_variant``) and Smart
    Turn; Whisper peeks with the window floor of ``S2S["PEEK_WINDOW_FLOOR_S"]`` (None: the one
    timed for this CPU, ``cache.peek_window_floor``). They need the prepared model cache
    (``manage.py prepare_models``), prepared here when missing. Raises
    ``pool.backends.cache.PreparationError`` when it cannot be, when a file of the cache is
    damaged (its size changed), or when a model file does not load: one line that names the file
    and the command that mends it."""
    from pool.backends.cache import (
        STT_NAMES,
        TTS_VARIANT_PATHS,
        PreparationError,
        blas_threads,
        damage,
        default_paths,
        is_prepared,
        peek_window_floor,
        prepare,
        tts_speed,
        tts_variant,
    )
    from pool.backends.fetch import chosen_llm
    from pool.backends.llm import load_llm
    from pool.backends.stt import MIN_WINDOW_SECONDS, WhisperSTT
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
    variant = config["TTS_VARIANT"]
    if variant == "auto" and not config["TTS_MODEL"]:
        variant = tts_variant(cache, threads["tts"])["chosen"]
    blas = threads["blas"]
    if blas == "auto":
        blas = None if config["STT_MODEL"] else blas_threads(cache, preset, threads["stt"])["blas"]
        limit_blas_threads(blas)
    peek_floor = config["PEEK_WINDOW_FLOOR_S"]
    if peek_floor is None:
        peek_floor = MIN_WINDOW_SECONDS if config["STT_MODEL"] else \
            peek_window_floor(cache, preset, threads["stt"])["floor_s"]
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

    tts = load("TTS_MODEL", paths[TTS_VARIANT_PATHS.get(variant, "tts_model")], lambda path: KokoroTTS(
        path, config["TTS_VOICES"] or paths["tts_voices"], threads["tts"]))
    backends = Backends(
        vad=load("VAD_MODEL", paths["vad"], lambda path: SileroVAD(path, threads["vad"])),
        stt=load("STT_MODEL", paths["stt"], lambda path: WhisperSTT(
            path, threads["stt"], None if config["STT_MODEL"] else STT_NAMES[preset], peek_floor)),
        llm=load("LLM_MODEL", chosen_llm(cache) or paths["llm"], lambda path: load_llm(config, path)),
        tts=tts,
        tts_background=tts.at_lowest_priority() if config["COMPUTE_BACKGROUND"] and PER_THREAD_PRIORITY else None,
        tts_pair=tts.on_one_thread() if config["COMPUTE_SIDE_BY_SIDE"] else None,
        turn=load("TURN_MODEL", paths["turn"], SmartTurn),
        denoise=load_denoiser(),
        echo=load_echo_canceller(),
        tts_speed=None if config["TTS_MODEL"] else tts_speed(cache, variant),
    )
    kokoro = config["TTS_MODEL"] or f"{variant}, {'timed fastest on this CPU' if config['TTS_VARIANT'] == 'auto' else 'TTS_VARIANT'}"
    if backends.tts_speed:
        kokoro += f"; {backends.tts_speed:.1f} s of speech per second of compute"
    blas_said = "its own thread count" if blas is None else f"{blas} thread{'s' if blas > 1 else ''}"
    if threads["blas"] == "auto" and not config["STT_MODEL"]:
        blas_said += ", timed on this CPU"
    log.info("Models loaded in %.1f s (Kokoro: %s; numpy's BLAS: %s)", time.perf_counter() - started, kokoro,
             blas_said)
    log.info("Models warmed up in %.1f s", warm_up(backends, config))
    return backends


WARM_UP_TEXT = "Hello, how are you?"  # spoken by the TTS, then heard by the rest


def warm_up(backends, config):
    """Run each default model once before the pool serves, so that its first user does not pay
    for a runtime's first call: onnxruntime's and CTranslate2's first run of a graph, and
    llama.cpp's prefill of the default instructions (``DEFAULT_INSTRUCTIONS`` after
    ``VOICE_STYLE``, as a session sends them), which then stays in every slot's prompt cache: a
    session with those instructions prefills only its own messages. Measured in a fresh process
    on a Zen 4 (BENCHMARKS.md 1i): the first call took 70 ms more than the next in Whisper, 55 ms
    in Kokoro, 90 ms in Smart Turn and 220 ms in llama.cpp, in each slot.

    ``backends``: those of ``load_default``; the LLM only when it has ``warm_up(messages)`` (an
    endpoint's is not called: a request there may cost money, and its server keeps its own
    caches). Returns the seconds taken; raises what a model raises."""
    import numpy as np
    import soxr

    from pool.backends.base import SPEECH_RATE, TTS_RATE, VAD_WINDOW_SAMPLES, with_voice_style

    started = time.perf_counter()
    voice = backends.tts.resolve_voice(config["DEFAULT_VOICE"])
    speech = backends.tts.synthesize(WARM_UP_TEXT, voice)
    for copy in (backends.tts_background, backends.tts_pair):
        if copy is not None:
            copy.synthesize(WARM_UP_TEXT, voice)
    heard = soxr.resample(speech, TTS_RATE, SPEECH_RATE).astype(np.float32)
    stream = backends.vad.new_stream()
    for start in range(0, len(heard) - VAD_WINDOW_SAMPLES + 1, VAD_WINDOW_SAMPLES):
        stream.probability(heard[start:start + VAD_WINDOW_SAMPLES])
    backends.stt.transcribe(heard)
    # A peek as sessions make one ("en"'s phrases count in every language; a setting may drop them).
    backends.stt.hear(heard[:SPEECH_RATE], None, config["BACKCHANNEL_PROMPT"], config["BACKCHANNEL_PHRASES"].get("en", ()))
    backends.turn.is_complete(heard)
    if hasattr(backends.llm, "warm_up"):
        system = with_voice_style(config["DEFAULT_INSTRUCTIONS"], config["VOICE_STYLE"], "audio")
        backends.llm.warm_up([{"role": "system", "content": system}, {"role": "user", "content": WARM_UP_TEXT}])
    return time.perf_counter() - started

"""The models behind the four stages, loaded once per process and shared by every unit.

A backend is a plain object with one job each:

- VAD: ``new_stream()`` -> an object with ``probability(window)``; ``window`` is 512 float32
  samples at 16 kHz (32 ms), the result the speech probability in [0, 1].
- STT: ``transcribe(audio, language, prompt=None)`` -> str; ``audio`` is float32 mono at
  16 kHz; ``prompt``: text to bias the spelling (Whisper's initial prompt).
- LLM: ``generate(request, on_text, should_stop, on_function_call)`` -> usage dict; streams text
  through ``on_text(str)``, reports a tool call through ``on_function_call(name, arguments)``
  and stops early when ``should_stop()`` is true.
- TTS: ``synthesize(text, voice, speed)`` -> float32 mono at 24 kHz; ``resolve_voice(name)``.
- End of turn (``semantic_vad``): ``is_complete(audio)`` -> bool; ``audio`` is the turn so far,
  float32 mono at 16 kHz (``pool.backends.turn.SmartTurn``).

``load_backends(config)`` builds them from the settings dict (``pool.conf.get_config()``).
"""

import logging
import time
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Backends:
    vad: object
    stt: object
    llm: object
    tts: object
    turn: object = None  # None: semantic_vad ends turns on silence alone


def load_backends(config):
    """Load the backends named by ``config["BACKEND"]`` ("default" or "scripted").

    The default set needs the prepared model cache (``manage.py prepare_models``); it is
    prepared here when missing. Raises ``pool.prepare.PreparationError`` when it cannot be.
    """
    if config["BACKEND"] == "scripted":
        from .scripted import load_scripted

        return load_scripted(config)
    if config["BACKEND"] != "default":
        raise ValueError(f"Unknown S2S['BACKEND'] {config['BACKEND']!r}: use 'default' or 'scripted'.")
    from ..prepare import default_paths, is_prepared, prepare
    from .llm import load_llm
    from .stt import WhisperSTT
    from .tts import KokoroTTS
    from .turn import SmartTurn
    from .vad import SileroVAD

    cache = config["MODEL_CACHE_DIR"]
    if not is_prepared(cache):
        prepare(cache)
    paths = default_paths(cache)
    threads = config["THREADS"]
    started = time.perf_counter()
    backends = Backends(
        vad=SileroVAD(config["VAD_MODEL"] or paths["vad"], threads["vad"]),
        stt=WhisperSTT(config["STT_MODEL"] or paths["stt"], threads["stt"]),
        llm=load_llm(config, paths["llm"]),
        tts=KokoroTTS(config["TTS_MODEL"] or paths["tts_model"],
                      config["TTS_VOICES"] or paths["tts_voices"], threads["tts"]),
        turn=SmartTurn(config["TURN_MODEL"] or paths["turn"]),
    )
    log.info("Models loaded in %.1f s", time.perf_counter() - started)
    return backends

"""What every backend shares: the sample rates, the ``Protocol`` of each stage's model, the
request the LLM stage hands its model, and the bundle of a process's models (``Backends``).

Structural typing: a backend is any object with its Protocol's methods, nothing to inherit. This
module loads no model runtime, so the protocol layer and the pipeline may import it.
"""

import logging
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

log = logging.getLogger(__name__)

SPEECH_RATE = 16_000  # Hz: what the VAD, the STT and the end-of-turn model take (mono float32)
TTS_RATE = 24_000  # Hz: what the TTS returns (mono float32)
VAD_WINDOW_SAMPLES = 512  # samples at 16 kHz per VAD call (32 ms), fixed by Silero VAD v5/v6


LOWEST_PRIORITY_NICE = 19  # Linux's weakest nice value: ~1.5 % of a core beside a nice-0 thread
PER_THREAD_PRIORITY = sys.platform.startswith("linux")  # elsewhere a nice value is the whole process's


def lower_thread_priority(nice=LOWEST_PRIORITY_NICE):
    """Run the calling thread, and every thread it starts from now on, at the OS priority of
    ``nice`` (default: the lowest, LOWEST_PRIORITY_NICE): under contention the kernel gives the
    cores to threads of lower nice values first. Linux only (there a nice value belongs to one
    thread, and new threads inherit it); elsewhere, or when the kernel refuses, nothing changes
    (logged). Returns whether it did."""
    if not PER_THREAD_PRIORITY:
        return False
    if not set_threads_priority((threading.get_native_id(),), nice):
        log.warning("could not lower the priority of thread %s to nice %s", threading.current_thread().name, nice)
        return False
    return True


def set_threads_priority(threads, nice):
    """Give the threads ``threads`` of this process (native ids) the nice value ``nice``; a thread
    that has ended is skipped. Lowering a nice value (a higher priority) needs CAP_SYS_NICE, which
    root has on a host and lacks in a default Docker container. Returns False when the kernel
    refused (nothing logged: the caller decides), else True. Linux only (False elsewhere)."""
    if not PER_THREAD_PRIORITY:
        return False
    for thread in threads:
        try:
            os.setpriority(os.PRIO_PROCESS, thread, nice)
        except ProcessLookupError:
            continue
        except PermissionError:
            return False
    return True


def at_priority(make, nice=LOWEST_PRIORITY_NICE):
    """``make()`` called on a new thread at the OS priority of ``nice`` (``lower_thread_priority``;
    default: the lowest), so that the threads it starts (a model runtime's thread pool) run there
    too. Returns ``(its result, the native ids of the threads it started that still run)``: a
    caller may raise them for a while with ``set_threads_priority``. Raises what ``make`` raised.
    Where threads have no priority of their own (not Linux), ``make()`` runs there as it is."""
    outcome = {}

    def run():
        lowered = lower_thread_priority(nice)
        before = _native_thread_ids()
        try:
            outcome["value"] = make()
        except BaseException as exc:  # noqa: BLE001 - raised again in the caller's thread
            outcome["error"] = exc
        # Only threads at this thread's nice value: another started elsewhere meanwhile is not ours.
        outcome["threads"] = tuple(sorted(t for t in _native_thread_ids() - before - {threading.get_native_id()}
                                          if _nice(t) == nice)) if lowered else ()

    thread = threading.Thread(target=run, name=f"loader-at-nice-{nice}")
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"], outcome["threads"]


def _native_thread_ids():
    """The native ids of this process's threads (an empty set where /proc is not Linux's)."""
    try:
        return {int(name) for name in os.listdir("/proc/self/task")}
    except OSError:
        return set()


def _nice(thread):
    try:
        return os.getpriority(os.PRIO_PROCESS, thread)
    except OSError:
        return None


class RunStoppedError(Exception):
    """A model run ended early because its ``RunStop`` was requested."""


class RunStop:
    """A request to end one model run early (a reply cancelled while its phrase is synthesized),
    made from any thread with ``request()``. A backend that can stop mid-run registers what stops
    it with ``on_request(callback)``; the callback runs at once if the stop was requested already."""

    def __init__(self):
        self._lock = threading.Lock()
        self._callbacks = []
        self.requested = False

    def request(self):
        with self._lock:
            if self.requested:
                return
            self.requested = True
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()

    def on_request(self, callback):
        with self._lock:
            if not self.requested:
                self._callbacks.append(callback)
                return
        callback()


class VADStream(Protocol):
    """One session's VAD state (Silero keeps a recurrent state between windows)."""

    def probability(self, window: np.ndarray) -> float:
        """The speech probability in [0, 1] of ``window``: VAD_WINDOW_SAMPLES float32 samples at
        16 kHz."""

    def reset(self) -> None:
        """Forget the session (a new one starts on this stream)."""


class VAD(Protocol):
    def new_stream(self) -> VADStream:
        """A VAD state for one unit (each unit's VAD thread owns one)."""


class STT(Protocol):
    languages: frozenset  # ISO 639-1 codes the model transcribes
    name: str  # the model's name, as sessions announce it (audio.input.transcription.model)

    def transcribe(self, audio: np.ndarray, language: str | None = None, prompt: str | None = None) -> str:
        """The words of ``audio`` (float32 mono at 16 kHz). ``language``: None lets the model
        detect it; ``prompt``: text to bias the spelling (Whisper's initial prompt)."""

    def transcribe_detect(self, audio: np.ndarray, language: str | None = None,
                          prompt: str | None = None) -> tuple[str, str | None]:
        """``(transcript, language)``: as ``transcribe``, with the language the words are in
        (``language`` when given, else what the model detected; None when it cannot say).
        Optional: without it, a turn's language is the session's."""

    def transcribe_batch(self, turns: list[tuple[np.ndarray, str | None, str | None]]) -> list[tuple[str, str | None]]:
        """``transcribe_detect`` of several ``(audio, language, prompt)`` turns at once, the
        results in order: the compute queue runs the transcriptions that wait together as one
        (``pool.pipeline.compute``). Optional (with ``transcribe_detect``): without it, one
        after the other."""


class LLM(Protocol):
    resumes: bool  # True: the LLM stage pauses a reply by stopping it and continuing from
    # ``request.prefix`` later; False: by blocking its stream
    # Optional ``images: bool``: True when messages may hold image_url parts (an endpoint's model
    # may read them); without it, the session leaves images out of the prompt.

    def generate(self, request, on_text: Callable[[str], None], should_stop: Callable[[], bool],
                 on_function_call: Callable[..., None] | None = None) -> dict:
        """Generate the reply to ``request`` (``LLMRequest``, below): stream its text
        through ``on_text(text)``; report a tool call as ``on_function_call(name, arguments,
        call_id=None)`` (``arguments``: a JSON string) instead of text; return as soon as
        ``should_stop()`` is true. Returns usage: ``{"input_tokens", "output_tokens"}``, and
        ``"cached_tokens"`` (those of the input read from a prompt cache) where the backend says."""


class TTS(Protocol):
    voices: frozenset  # voice names the model has
    languages: frozenset  # ISO 639-1 codes of those voices
    # Optional ``stops: bool``: True when ``synthesize`` takes ``stop`` (a ``RunStop``), ends the
    # run soon after it is requested and raises ``RunStoppedError``; without it, a synthesis runs to
    # its end (a cancelled reply's phrase then keeps the cores up to a second).

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
    # None: noise_reduction is stored, not acted on. Else has new_stream() -> an object with
    # process(float32 @ 16 kHz) -> float32 @ 16 kHz and reset() (pool.backends.denoise).
    denoise: object = None
    # None: no echo cancellation. Else has new_stream() -> an object with process(captured,
    # reference), both float32 @ 16 kHz, -> float32 @ 16 kHz, and reset() (pool.backends.echo).
    echo: object = None
    # The TTS model again, in a runtime whose threads run at the lowest OS priority
    # (``KokoroTTS.at_lowest_priority``): the compute queue's background lane synthesizes speculative
    # replies' phrases with it, and the kernel preempts it for real work (pool.pipeline.compute).
    # Its ``runtime_threads``: the native ids of those threads. None: no background lane.
    tts_background: TTS | None = None
    # The TTS model again, in a runtime of one thread (``KokoroTTS.on_one_thread``): the compute
    # queue runs two later phrases side by side on it, one core each (pool.pipeline.compute).
    # None: one synthesis at a time.
    tts_pair: TTS | None = None
    # Seconds of speech the TTS synthesized per second of compute, one stream alone, as
    # prepare_models timed it on this CPU (``cache.tts_speed``); None: not timed (a TTS of one's own).
    tts_speed: float | None = None


def with_voice_style(instructions, style, modality):
    """The system message of a reply: ``instructions`` after the server's voice-style text
    ``style`` (``S2S["VOICE_STYLE"]``) for a spoken reply (``modality`` "audio"); as they are for
    text, or with no style. Here, beside ``LLMRequest``, so that the warm-up of ``load_default``
    prefills the message sessions send."""
    return f"{style}\n\n{instructions}" if style and modality == "audio" else instructions


@dataclass
class LLMRequest:
    """One response to generate. ``max_output_tokens``: a positive int (already capped).

    ``prefix``: the start of the assistant's reply, already generated, to continue (only for
    backends whose ``resumes`` is true; the LLM stage pauses them by stopping and resuming).
    ``reasoning_effort`` (the session's ``reasoning.effort``) and ``parallel_tool_calls``: for
    backends that have them (an OpenAI-compatible endpoint); None: the backend's default. Local
    models think as they were trained and make one call at a time.
    """

    messages: list
    max_output_tokens: int
    tools: list = field(default_factory=list)
    tool_choice: object = "auto"
    prefix: str = ""
    reasoning_effort: str | None = None
    parallel_tool_calls: bool | None = None

    def offered_tools(self):
        """The tools the model may call under ``tool_choice`` (none, all, or the named one)."""
        if self.tool_choice == "none":
            return []
        if isinstance(self.tool_choice, dict):
            return [t for t in self.tools if t.get("name") == self.tool_choice.get("name")]
        return list(self.tools)

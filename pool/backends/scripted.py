"""The scripted test backend: real Silero VAD, Smart Turn, RNNoise and echo canceller, scripted
STT, LLM and TTS.

For fast tests where a real model is not the point. Nothing here pretends to be a model: the STT
returns ``SCRIPT.transcript`` (or, when it is a callable, ``SCRIPT.transcript(audio)``), the LLM streams ``SCRIPT.reply`` word by word, and the TTS returns a
tone whose length follows the text. ``SCRIPT.wedge`` (a threading.Event) blocks the LLM stage while
set, to test drains that never finish; across processes, a user message containing
``WEDGE_WORD`` wedges it the same way (for WEDGE_SECONDS). Tests change ``SCRIPT`` and call
``SCRIPT.reset()`` after.
"""

import re
import threading
import time

import numpy as np

from pool.backends.base import TTS_RATE, Backends
from pool.backends.vad import SileroVAD
from pool.backends.voices import OPENAI_VOICES, resolve_voice


class Script:
    def __init__(self):
        self.reset()

    def reset(self):
        self.transcript = "hello from the scripted backend"
        self.language = "en"  # the language the STT "detects" when the session sets none
        self.stt_languages = []  # the language the STT was asked for, each turn (None: detect)
        self.stt_prompts = []  # the prompt the STT was given, each turn
        self.tts_voices = []  # the voice of each phrase synthesized
        self.tts_texts = []  # the text of each phrase synthesized
        # What peeks at speech over the assistant hear (None: transcript; a callable: of the audio).
        self.peek_transcript = None
        self.peek_likeness = None  # how like a backchannel phrase they find it (WhisperSTT.hear)
        self.reply = "This is a scripted reply. It has two sentences."
        self.token_delay = 0.0  # seconds between LLM words
        self.seconds_per_char = 0.01  # TTS audio length per character of text
        self.stt_error = None  # an exception instance the STT raises, or None
        self.tts_error = None  # an exception instance the TTS raises, or None
        self.wedge = threading.Event()
        self.requests = []  # every LLMRequest the scripted LLM received
        self.tool_arguments = '{"city": "Paris"}'  # arguments of scripted function calls


SCRIPT = Script()
WEDGE_WORD = "__wedge__"
WEDGE_SECONDS = 120.0


class ScriptedSTT:
    languages = frozenset({"en", "de"})  # as a multilingual model, so session tests may set one
    name = "scripted-stt"

    def transcribe_detect(self, audio, language=None, prompt=None):
        """A turn (the STT stage's Transcribe and Speculate)."""
        SCRIPT.stt_languages.append(language)
        SCRIPT.stt_prompts.append(prompt)
        return self._turn(audio), language or SCRIPT.language

    def transcribe(self, audio, language=None, prompt=None):
        """A peek at speech over the assistant (``realtime.session.turns``), with its own prompt."""
        if prompt is not None and SCRIPT.peek_transcript is not None:
            if SCRIPT.stt_error is not None:
                raise SCRIPT.stt_error
            return SCRIPT.peek_transcript(audio) if callable(SCRIPT.peek_transcript) else SCRIPT.peek_transcript
        return self._turn(audio)

    def hear(self, audio, language=None, prompt=None, phrases=()):
        """A peek, as ``WhisperSTT.hear``: what ``transcribe`` hears, and ``SCRIPT.peek_likeness``."""
        return self.transcribe(audio, language, prompt), (SCRIPT.peek_likeness if phrases else None)

    def _turn(self, audio):
        if SCRIPT.stt_error is not None:
            raise SCRIPT.stt_error
        if callable(SCRIPT.transcript):
            return SCRIPT.transcript(audio)
        return SCRIPT.transcript


class ScriptedLLM:
    """Replies ``SCRIPT.reply``; with tools offered and a user message last, calls the first
    offered tool with ``SCRIPT.tool_arguments``; after a function result, says what it returned.
    Continues a reply from ``request.prefix`` as llama.cpp does (``resumes``)."""

    resumes = True

    def generate(self, request, on_text, should_stop, on_function_call=None):
        SCRIPT.requests.append(request)
        last = request.messages[-1]
        if WEDGE_WORD in (last.get("content") or ""):
            time.sleep(WEDGE_SECONDS)  # a stuck handler, as another process sees it
        tools = request.offered_tools()
        if tools and on_function_call and last["role"] == "user":
            on_function_call(tools[0]["name"], SCRIPT.tool_arguments)
            return {"input_tokens": len(request.messages), "output_tokens": 1}
        reply = f"The function returned {last['content']}." if last["role"] == "tool" else SCRIPT.reply
        assert reply.startswith(request.prefix), (reply, request.prefix)
        words = re.findall(r"\s*\S+", reply[len(request.prefix):])[: request.max_output_tokens]
        sent = 0
        for word in words:
            while SCRIPT.wedge.is_set():  # a wedged handler: ignores should_stop on purpose
                time.sleep(0.01)
            if should_stop():
                break
            on_text(word)
            sent += 1
            if SCRIPT.token_delay:
                time.sleep(SCRIPT.token_delay)
        return {"input_tokens": sum(len((m.get("content") or "").split()) for m in request.messages),
                "output_tokens": sent}


class ScriptedTTS:
    voices = frozenset(OPENAI_VOICES.values())
    languages = frozenset({"en"})

    def resolve_voice(self, name):
        return resolve_voice(name, self.voices)

    def synthesize(self, text, voice, speed=1.0):
        SCRIPT.tts_voices.append(voice)
        SCRIPT.tts_texts.append(text)
        if SCRIPT.tts_error is not None:
            raise SCRIPT.tts_error
        seconds = len(text) * SCRIPT.seconds_per_char / speed
        t = np.arange(int(seconds * TTS_RATE)) / TTS_RATE
        return (0.2 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)


def load_scripted(config):
    """The scripted test backend: real Silero VAD, Smart Turn, RNNoise and echo canceller, scripted
    STT, LLM and TTS."""
    from pool.backends.cache import SMART_TURN_FILE, default_paths, package_dir
    from pool.backends.turn import SmartTurn

    paths = default_paths(config["MODEL_CACHE_DIR"])
    turn_path = config["TURN_MODEL"] or package_dir("pipecat") / "audio/turn/smart_turn/data" / SMART_TURN_FILE
    from pool.backends import load_denoiser, load_echo_canceller

    return Backends(vad=SileroVAD(config["VAD_MODEL"] or paths["vad"]), stt=ScriptedSTT(),
                    llm=ScriptedLLM(), tts=ScriptedTTS(), turn=SmartTurn(turn_path), denoise=load_denoiser(),
                    echo=load_echo_canceller())

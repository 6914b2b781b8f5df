"""The effective configuration of one Realtime session: defaults, validation, deep merge.

``session.update`` carries a partial ``session`` object. It is normalised (beta field names mapped
to GA ones), deep-merged over the current configuration (dicts merge key by key; lists, scalars
and ``null`` replace), and the result is validated as a whole. Either the whole update applies or
none of it does: a ProtocolError names the first bad field in ``param``.

Unknown-field policy: a field that OpenAI's GA session does not have is refused with
``unknown_parameter``; a GA field this server does not act on (``tracing``, ``prompt``,
``include``, ``truncation``) is accepted, stored and echoed back; docs/PROTOCOL.md says of every
field whether it is acted on.
"""

import copy
import re
import typing
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from openai.types.realtime import (
    AudioTranscriptionParam,
    RealtimeAudioConfigInputParam,
    RealtimeAudioConfigOutputParam,
    RealtimeAudioConfigParam,
    RealtimeResponseCreateAudioOutputParam,
    RealtimeSessionCreateRequestParam,
)
from openai.types.realtime.noise_reduction_type import NoiseReductionType
from openai.types.realtime.realtime_audio_config_input_param import NoiseReduction
from openai.types.realtime.realtime_reasoning_effort import RealtimeReasoningEffort
from openai.types.realtime.realtime_tools_config_union_param import Mcp

from pool.backends.voices import voice_language
from pool.pipeline.messages import TurnDetection
from realtime.audio import FORMAT_TYPES, PCM_RATE
from realtime.errors import ProtocolError

MAX_INSTRUCTIONS_CHARS = 32_000
MAX_VOICE_CHARS = 64  # a voice name or id (the history's column holds as much)
MAX_PROMPT_CHARS = 1000  # a transcription prompt (Whisper reads at most 224 tokens of it)
MAX_OUTPUT_TOKENS_LIMIT = 4096

SERVER_VAD_DEFAULTS = {
    "type": "server_vad",
    "threshold": 0.5,
    "prefix_padding_ms": 300,
    "silence_duration_ms": 500,
    "create_response": True,
    "interrupt_response": True,
    "idle_timeout_ms": None,
}
SEMANTIC_VAD_DEFAULTS = {
    "type": "semantic_vad",
    "eagerness": "auto",
    "create_response": True,
    "interrupt_response": True,
}
# semantic_vad: at the first END_OF_TURN_CHECK_MS of a pause the end-of-turn model (Smart Turn)
# decides whether the user has finished; when it says no, the turn ends only after the silence
# that eagerness sets (ms; OpenAI documents these as semantic_vad's longest waits).
END_OF_TURN_CHECK_MS = 200
EAGERNESS_SILENCE_MS = {"low": 8000, "medium": 4000, "auto": 4000, "high": 2000}

# Fields of the GA session object (dotted paths of dicts whose keys are fixed): what the pinned
# openai SDK can send, read from its types, so a new SDK field is known without a hand-kept list.
# The server's own session objects also carry "object", "id" and "expires_at", which clients echo.
_KNOWN_KEYS = {
    "session": frozenset(typing.get_type_hints(RealtimeSessionCreateRequestParam)) | {"object", "id", "expires_at"},
    "session.audio": frozenset(typing.get_type_hints(RealtimeAudioConfigParam)),
    "session.audio.input": frozenset(typing.get_type_hints(RealtimeAudioConfigInputParam)),
    "session.audio.output": frozenset(typing.get_type_hints(RealtimeAudioConfigOutputParam)),
    "session.audio.input.transcription": frozenset(typing.get_type_hints(AudioTranscriptionParam)),
    "session.audio.input.noise_reduction": frozenset(typing.get_type_hints(NoiseReduction)),
}
_NULLABLE = {"session.audio.input.transcription", "session.audio.input.noise_reduction"}  # null: off
# ... and of response.create's audio: a response has its own voice and format, nothing else.
RESPONSE_AUDIO_KEYS = frozenset(typing.get_type_hints(RealtimeResponseCreateAudioOutputParam))  # "output"
RESPONSE_AUDIO_OUTPUT_KEYS = frozenset({"voice", "format"})
REASONING_EFFORTS = typing.get_args(RealtimeReasoningEffort)  # the SDK's literals
# turn_detection fields newer than the pinned SDK that clients already send (LiveKit's plugin,
# gpt-realtime-2 guides): stored and echoed, not acted on (docs/PROTOCOL.md).
TURN_DETECTION_STORED = {"model_version"}
NOISE_REDUCTION_TYPES = typing.get_args(NoiseReductionType)

# Beta (preview) session fields -> their GA place; see docs/PROTOCOL.md.
BETA_FORMATS = {
    "pcm16": {"type": "audio/pcm", "rate": PCM_RATE},
    "g711_ulaw": {"type": "audio/pcmu"},
    "g711_alaw": {"type": "audio/pcma"},
}


def default_session(session_id, model, instructions, voice, turn_detection="server_vad", transcription_model="whisper"):
    """A new session's configuration (GA ``session`` object shape). ``turn_detection``:
    "server_vad" or "semantic_vad" (the setting DEFAULT_TURN_DETECTION); ``transcription_model``:
    the name of the STT model loaded (``PoolRegistry.speaks``)."""
    td = SEMANTIC_VAD_DEFAULTS if turn_detection == "semantic_vad" else SERVER_VAD_DEFAULTS
    return {
        "type": "realtime",
        "object": "realtime.session",
        "id": session_id,
        "model": model,
        "output_modalities": ["audio"],
        "instructions": instructions,
        "tools": [],
        "tool_choice": "auto",
        "max_output_tokens": "inf",
        "tracing": None,
        "prompt": None,
        "include": None,
        "truncation": "auto",
        "audio": {
            "input": {
                "format": {"type": "audio/pcm", "rate": PCM_RATE},
                "transcription": {"model": transcription_model, "language": None, "prompt": None},
                "noise_reduction": None,
                "turn_detection": dict(td),
            },
            "output": {
                "format": {"type": "audio/pcm", "rate": PCM_RATE},
                "voice": voice,
                "speed": 1.0,
            },
        },
    }


@dataclass(frozen=True)
class Backchannels:
    """What a listener says over the assistant without taking the turn, and how a peek at such
    speech is judged (the BACKCHANNEL_* and INTERRUPTION_* settings; ``realtime.session.turns``).

    ``words``: words (lower case, any spelling the STT may use) that are a listener's;
    ``by_language``: ISO 639-1 code -> more of them, which count while the user speaks that
    language; ``prompt``: the STT's prompt for peeks; ``phrases``: ISO code -> the phrases a
    peek's audio is scored against (``pool.backends.stt.WhisperSTT.hear``; "en"'s are scored in
    every language); ``likeness``: a peek at least this like one of them is a backchannel,
    whatever words the STT wrote (None: the words alone decide); ``cues`` and
    ``cues_by_language``: words that mark an interruption, whatever it sounds like;
    ``max_ms``: voiced speech (ms) under which speech without a cue is judged by its end unless a
    peek heard it less like every phrase than ``unlike`` (0 or None: off).
    """

    words: tuple = ()
    prompt: str | None = None
    by_language: dict = field(default_factory=dict)
    phrases: dict = field(default_factory=dict)
    likeness: float | None = None
    cues: tuple = ()
    cues_by_language: dict = field(default_factory=dict)
    max_ms: int = 0
    unlike: float | None = None

    def phrases_for(self, language):
        """The phrases a peek is scored against while the user speaks ``language``."""
        return (*self.phrases.get("en", ()), *(self.phrases.get(language, ()) if language != "en" else ()))


@dataclass(frozen=True)
class SessionDefaults:
    """What a new session starts from, every field required: the values live in one place, the
    ``S2S`` settings (``pool.conf.DEFAULTS``), and ``session_defaults`` reads them.

    ``speaks``: ``PoolRegistry.speaks`` (the loaded models' languages, voices and STT name);
    ``max_output_tokens``: the cap of every response; ``context_chars``: the LLM context budget
    (characters); ``turn_detection``: "server_vad" or "semantic_vad"; the rest as the settings of
    the same names (INTERRUPT_MIN_SPEECH_MS, BACKCHANNEL_* as ``backchannels``, HISTORY_MAX_ITEMS,
    IMAGE_URL_HOSTS, MCP_*, VOICE_STYLE, SPECULATIVE_REPLIES).
    """

    model: str
    instructions: str
    voice: str
    speaks: dict
    max_output_tokens: int
    context_chars: int
    turn_detection: str
    interrupt_min_speech_ms: int
    backchannels: Backchannels
    history_max_items: int
    image_url_hosts: tuple = ()
    mcp_server_hosts: tuple = ()
    mcp_timeout_seconds: float = 10.0
    mcp_max_rounds: int = 3
    voice_style: str = ""
    speculative_replies: bool = False

    def session(self, session_id):
        """A new session's configuration (``default_session``)."""
        return default_session(session_id, self.model, self.instructions, self.voice, self.turn_detection,
                               self.speaks["transcription_model"])


def session_defaults(config, speaks, model="s2s-default"):
    """The ``SessionDefaults`` of the ``S2S`` settings ``config`` (``pool.conf.get_config()``)
    and ``speaks`` (``PoolRegistry.speaks``)."""
    return SessionDefaults(
        model=model,
        instructions=config["DEFAULT_INSTRUCTIONS"],
        voice=config["DEFAULT_VOICE"],
        speaks=speaks,
        max_output_tokens=config["LLM_MAX_OUTPUT_TOKENS"],
        context_chars=config["LLM_CONTEXT_CHARS"],
        turn_detection=config["DEFAULT_TURN_DETECTION"],
        interrupt_min_speech_ms=config["INTERRUPT_MIN_SPEECH_MS"],
        backchannels=Backchannels(tuple(config["BACKCHANNEL_WORDS"]), config["BACKCHANNEL_PROMPT"],
                                  config["BACKCHANNEL_WORDS_BY_LANGUAGE"], config["BACKCHANNEL_PHRASES"],
                                  config["BACKCHANNEL_LIKENESS"], tuple(config["INTERRUPTION_WORDS"]),
                                  config["INTERRUPTION_WORDS_BY_LANGUAGE"], config["BACKCHANNEL_MAX_MS"],
                                  config["INTERRUPTION_LIKENESS"]),
        history_max_items=config["HISTORY_MAX_ITEMS"],
        image_url_hosts=tuple(config["IMAGE_URL_HOSTS"]),
        mcp_server_hosts=tuple(config["MCP_SERVER_HOSTS"]),
        voice_style=config["VOICE_STYLE"] or "",
        mcp_timeout_seconds=config["MCP_TIMEOUT_SECONDS"],
        mcp_max_rounds=config["MCP_MAX_ROUNDS"],
        speculative_replies=config["SPECULATIVE_REPLIES"],
    )


def check_languages(config, speaks):
    """A language the loaded models cannot hear or speak is refused, never ignored: the
    transcription language must be one the STT transcribes, and a Kokoro voice name
    (``ef_dora``) must be of a language the TTS speaks. ``speaks``: ``PoolRegistry.speaks``.
    Raises ProtocolError ``unsupported_language``."""
    language = (config["audio"]["input"]["transcription"] or {}).get("language")
    heard = speaks["transcription_languages"]
    if language is not None and str(language).lower() not in heard:
        raise ProtocolError(
            "unsupported_language", f"This server's speech recognition transcribes {', '.join(heard)} "
            f"only, not {language!r}.", param="session.audio.input.transcription.language")
    voice = voice_name(config["audio"]["output"]["voice"])
    spoken = voice_language(voice)
    if spoken is not None and spoken not in speaks["voice_languages"]:
        raise ProtocolError(
            "unsupported_language", f"Voice {voice!r} speaks {spoken!r}; this server's voices speak "
            f"{', '.join(speaks['voice_languages'])} only.", param="session.audio.output.voice")


def map_beta_fields(update):
    """Move beta-shaped session fields to their GA place. Returns a new dict."""
    update = dict(update)
    if "audio" in update and not isinstance(update["audio"], dict):
        return update  # not ours to fix: validation names it
    audio = copy.deepcopy(update.get("audio", {}))
    audio_in = audio.setdefault("input", {})
    audio_out = audio.setdefault("output", {})
    if not isinstance(audio_in, dict) or not isinstance(audio_out, dict):
        return update
    moved = False

    def move(name, target, key, convert=lambda v: v):
        nonlocal moved
        if name in update:
            value = update.pop(name)
            target[key] = convert(value)
            moved = True

    def fmt(value):
        return BETA_FORMATS.get(value, value) if isinstance(value, str) else value

    move("modalities", update, "output_modalities", _beta_modalities)
    move("voice", audio_out, "voice")
    move("speed", audio_out, "speed")
    move("input_audio_format", audio_in, "format", fmt)
    move("output_audio_format", audio_out, "format", fmt)
    move("turn_detection", audio_in, "turn_detection")
    move("input_audio_transcription", audio_in, "transcription")
    move("input_audio_noise_reduction", audio_in, "noise_reduction")
    move("max_response_output_tokens", update, "max_output_tokens")
    update.pop("temperature", None)  # beta only; GA sessions have no temperature
    if moved or "audio" in update:
        update["audio"] = {k: v for k, v in audio.items() if v}
        if not update["audio"]:
            del update["audio"]
    return update


def _beta_modalities(value):
    if isinstance(value, list) and "audio" in value:
        return ["audio"]
    return value


def deep_merge(base, update):
    """Merge ``update`` into a copy of ``base``: dicts recursively; anything else replaces."""
    merged = copy.deepcopy(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def apply_update(current, update):
    """Return the session that ``session.update`` with ``update`` makes of ``current``.

    Raises ProtocolError (``invalid_value``, ``unknown_parameter``, ``invalid_type``) with
    ``param`` set; ``current`` is never modified.
    """
    if not isinstance(update, dict):
        raise ProtocolError("invalid_type", "'session' must be an object.", param="session")
    update = map_beta_fields(update)
    _check_unknown(update, "session")
    for frozen in ("id", "object"):
        update.pop(frozen, None)
    new_td = update.get("audio", {}).get("input", {}).get("turn_detection", ...)
    merged = deep_merge(current, update)
    if new_td is not ...:
        merged["audio"]["input"]["turn_detection"] = _merge_turn_detection(
            current["audio"]["input"]["turn_detection"], new_td
        )
    validate(merged)
    return merged


def _check_unknown(update, path):
    for key, value in update.items():
        if key not in _KNOWN_KEYS[path]:
            raise ProtocolError("unknown_parameter", f"Unknown parameter: '{path}.{key}'.",
                                param=f"{path}.{key}")
        child = f"{path}.{key}"
        if child in _KNOWN_KEYS and not (value is None and child in _NULLABLE):
            if not isinstance(value, dict):
                raise ProtocolError("invalid_type", f"'{child}' must be an object.", param=child)
            _check_unknown(value, child)


def _merge_turn_detection(current, new):
    """A partial turn_detection keeps the current type; a new type starts from its defaults."""
    if new is None:
        return None
    if not isinstance(new, dict):
        raise ProtocolError("invalid_type", "turn_detection must be an object or null.",
                            param="session.audio.input.turn_detection")
    kind = new.get("type") or (current or {}).get("type") or "server_vad"
    if current and current.get("type") == kind:
        base = current
    else:
        base = SEMANTIC_VAD_DEFAULTS if kind == "semantic_vad" else SERVER_VAD_DEFAULTS
    return {**base, **new, "type": kind}


def _fail(param, message, code="invalid_value"):
    raise ProtocolError(code, message, param=f"session.{param}")


def _number(value, param, low, high, integer=False):
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds):
        _fail(param, f"'{param}' must be {'an integer' if integer else 'a number'}.", "invalid_type")
    if not low <= value <= high:
        _fail(param, f"'{param}' must be between {low} and {high}, got {value}.")


def _format(fmt, param):
    validate_format(fmt, f"session.{param}")


def validate_format(fmt, param):
    """An audio format object (``{"type": "audio/pcm", "rate": 24000}``, ``audio/pcmu``,
    ``audio/pcma``), normalised in place (the rate set, or dropped where it has none). Raises
    ProtocolError naming ``param``."""
    if not isinstance(fmt, dict) or fmt.get("type") not in FORMAT_TYPES:
        raise ProtocolError("invalid_value", f"'{param}' must be an object whose type is one of "
                            f"{', '.join(FORMAT_TYPES)}.", param=param)
    if fmt["type"] == "audio/pcm":
        rate = fmt.setdefault("rate", PCM_RATE)
        if rate != PCM_RATE:
            raise ProtocolError("invalid_value", f"audio/pcm supports only rate {PCM_RATE}, got {rate!r}.",
                                param=f"{param}.rate")
    else:
        fmt.pop("rate", None)


def validate(session):
    """Check a whole merged session; normalises formats in place. Raises ProtocolError."""
    if session.get("type") not in ("realtime", "transcription"):
        _fail("type", "session.type must be 'realtime' or 'transcription'.")
    if not isinstance(session.get("model"), (str, type(None))):
        _fail("model", "'model' must be a string.", "invalid_type")
    modalities = session.get("output_modalities")
    if modalities not in (["audio"], ["text"]):
        _fail("output_modalities", "output_modalities must be [\"audio\"] or [\"text\"].")
    instructions = session.get("instructions")
    if not isinstance(instructions, str):
        _fail("instructions", "'instructions' must be a string.", "invalid_type")
    if len(instructions) > MAX_INSTRUCTIONS_CHARS:
        _fail("instructions", f"'instructions' is limited to {MAX_INSTRUCTIONS_CHARS} characters.")
    validate_max_output_tokens(session.get("max_output_tokens"), "session.max_output_tokens")
    validate_tools(session.get("tools"), session.get("tool_choice"), "session")
    validate_reasoning(session.get("reasoning"), "session.reasoning")
    if not isinstance(session.get("parallel_tool_calls", True), bool):
        _fail("parallel_tool_calls", "'parallel_tool_calls' must be a boolean.", "invalid_type")

    audio_in, audio_out = session["audio"]["input"], session["audio"]["output"]
    _format(audio_in.get("format"), "audio.input.format")
    _format(audio_out.get("format"), "audio.output.format")
    _validate_transcription(audio_in.get("transcription"))
    _validate_noise_reduction(audio_in.get("noise_reduction"))
    validate_voice(audio_out.get("voice"), "session.audio.output.voice")
    _number(audio_out.get("speed"), "audio.output.speed", 0.25, 1.5)
    _validate_turn_detection(audio_in.get("turn_detection"))


def _object_or_null(value, param):
    """False for null (the feature is off); True for an object; else invalid_type."""
    if value is None:
        return False
    if not isinstance(value, dict):
        _fail(param, f"{param.rsplit('.', 1)[-1]} must be an object or null.", "invalid_type")
    return True


def _validate_transcription(transcription):
    param = "audio.input.transcription"
    if not _object_or_null(transcription, param):
        return
    model = transcription.get("model")
    if model is not None and not isinstance(model, str):
        _fail(f"{param}.model", "'model' must be a string.", "invalid_type")
    prompt = transcription.get("prompt")
    if prompt is not None and not isinstance(prompt, str):
        _fail(f"{param}.prompt", "'prompt' must be a string.", "invalid_type")
    if prompt is not None and len(prompt) > MAX_PROMPT_CHARS:
        _fail(f"{param}.prompt", f"'prompt' is limited to {MAX_PROMPT_CHARS} characters.")
    keywords = transcription.get("keywords")
    if keywords is not None and not (isinstance(keywords, list) and all(isinstance(k, str) for k in keywords)):
        _fail(f"{param}.keywords", "'keywords' must be a list of strings.", "invalid_type")
    if keywords is not None and len(", ".join(keywords)) > MAX_PROMPT_CHARS:
        _fail(f"{param}.keywords", f"'keywords' are limited to {MAX_PROMPT_CHARS} characters in all.")


def _validate_noise_reduction(noise_reduction):
    param = "audio.input.noise_reduction"
    if not _object_or_null(noise_reduction, param):
        return
    if noise_reduction.get("type") not in NOISE_REDUCTION_TYPES:
        _fail(f"{param}.type", f"noise_reduction.type must be one of {', '.join(NOISE_REDUCTION_TYPES)}.")
    if "strength" in noise_reduction:
        _number(noise_reduction["strength"], f"{param}.strength", 0.0, 10.0)


def stt_prompt(transcription):
    """The STT's initial prompt for a session's turns: its transcription ``prompt``, then its
    ``keywords`` (comma-separated), or None. Whisper reads it as text that came before the turn,
    so it biases spelling ("ComfyUI", not "comfy UI")."""
    transcription = transcription or {}
    parts = [transcription.get("prompt") or "", ", ".join(transcription.get("keywords") or [])]
    return " ".join(part for part in parts if part) or None


def validate_voice(voice, param):
    """A voice: a name (OpenAI's, or a Kokoro voice), or ``{"id": name}`` (the SDK's custom voice
    reference, resolved as a name: one that names nothing speaks the default voice). Raises
    ProtocolError."""
    name = voice.get("id") if isinstance(voice, dict) and set(voice) == {"id"} else voice
    if not isinstance(name, str) or not name.strip():
        raise ProtocolError("invalid_type", "'voice' must be a non-empty string or {\"id\": string}.", param=param)
    if len(name) > MAX_VOICE_CHARS:
        raise ProtocolError("invalid_value", f"'voice' is limited to {MAX_VOICE_CHARS} characters.", param=param)


def voice_name(voice):
    """The name of a valid voice (``validate_voice``): ``"alloy"`` for ``"alloy"`` or ``{"id": "alloy"}``."""
    return voice["id"] if isinstance(voice, dict) else voice


def validate_reasoning(reasoning, param):
    """``reasoning``: None or ``{"effort": one of REASONING_EFFORTS}``. Raises ProtocolError."""
    if reasoning is None:
        return
    if not isinstance(reasoning, dict) or not set(reasoning) <= {"effort"}:
        raise ProtocolError("invalid_type", "'reasoning' must be an object with at most 'effort'.", param=param)
    effort = reasoning.get("effort")
    if effort is not None and effort not in REASONING_EFFORTS:
        raise ProtocolError("invalid_value", f"reasoning.effort must be one of {', '.join(REASONING_EFFORTS)}.",
                            param=f"{param}.effort")


def _validate_turn_detection(td):
    if td is None:
        return
    param = "audio.input.turn_detection"
    if td["type"] not in ("server_vad", "semantic_vad"):
        _fail(f"{param}.type", "turn_detection.type must be 'server_vad' or 'semantic_vad'.")
    allowed = SERVER_VAD_DEFAULTS if td["type"] == "server_vad" else SEMANTIC_VAD_DEFAULTS
    for key in td:
        if key not in allowed and key not in TURN_DETECTION_STORED:
            _fail(f"{param}.{key}", f"Unknown parameter for {td['type']}: '{key}'.",
                  "unknown_parameter")
    version = td.get("model_version")
    if version is not None and (not isinstance(version, str) or len(version) > MAX_VOICE_CHARS):
        _fail(f"{param}.model_version", f"'model_version' must be a string of at most {MAX_VOICE_CHARS} "
              "characters.", "invalid_type" if not isinstance(version, str) else "invalid_value")
    for flag in ("create_response", "interrupt_response"):
        if not isinstance(td.get(flag), bool):
            _fail(f"{param}.{flag}", f"'{flag}' must be a boolean.", "invalid_type")
    if td["type"] == "server_vad":
        _number(td["threshold"], f"{param}.threshold", 0.0, 1.0)
        _number(td["prefix_padding_ms"], f"{param}.prefix_padding_ms", 0, 5000, integer=True)
        _number(td["silence_duration_ms"], f"{param}.silence_duration_ms", 0, 10_000, integer=True)
        if td["idle_timeout_ms"] is not None:
            _number(td["idle_timeout_ms"], f"{param}.idle_timeout_ms", 5000, 30_000, integer=True)
    elif not isinstance(td["eagerness"], str) or td["eagerness"] not in EAGERNESS_SILENCE_MS:
        _fail(f"{param}.eagerness", "eagerness must be one of low, medium, high, auto.")


def validate_max_output_tokens(value, param):
    """``max_output_tokens``: an integer 1..4096 or ``"inf"``. Raises ProtocolError."""
    if value == "inf":
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise ProtocolError("invalid_type", "max_output_tokens must be an integer or 'inf'.", param=param)
    if not 1 <= value <= MAX_OUTPUT_TOKENS_LIMIT:
        raise ProtocolError("invalid_value",
                            f"max_output_tokens must be between 1 and {MAX_OUTPUT_TOKENS_LIMIT}.",
                            param=param)


def validate_tools(tools, tool_choice, prefix):
    """``tools``: function tools and (in a session) ``mcp`` tools; ``tool_choice``: auto, none,
    required, a function, or an MCP server's tool. Raises ProtocolError naming the field."""
    if not isinstance(tools, list):
        raise ProtocolError("invalid_type", "'tools' must be a list.", param=f"{prefix}.tools")
    labels = set()
    for i, tool in enumerate(tools):
        param = f"{prefix}.tools[{i}]"
        kind = tool.get("type", "function") if isinstance(tool, dict) else None
        if kind == "mcp" and prefix == "session":
            _validate_mcp_tool(tool, param)
            if tool["server_label"] in labels:
                raise ProtocolError("invalid_value", "Each MCP tool needs its own server_label.",
                                    param=f"{param}.server_label")
            labels.add(tool["server_label"])
            continue
        if kind == "mcp":
            raise ProtocolError("invalid_value", "MCP tools are set for the session (session.update), not "
                                "for one response.", param=param)
        if kind != "function":
            raise ProtocolError("invalid_value", "Only function and mcp tools are supported.", param=param)
        if not isinstance(tool.get("name"), str) or not tool["name"]:
            raise ProtocolError("invalid_value", "A function tool needs a 'name'.", param=f"{param}.name")
        if not isinstance(tool.get("parameters", {}), dict):
            raise ProtocolError("invalid_type", "'parameters' must be a JSON schema object.",
                                param=f"{param}.parameters")
    if tool_choice in ("auto", "none", "required"):
        return
    if isinstance(tool_choice, dict) and tool_choice.get("type", "function") == "function" \
            and isinstance(tool_choice.get("name"), str):
        return
    if isinstance(tool_choice, dict) and tool_choice.get("type") == "mcp" \
            and isinstance(tool_choice.get("server_label"), str) and isinstance(tool_choice.get("name", ""), str):
        return
    raise ProtocolError("invalid_value", "tool_choice must be auto, none, required, a function or an MCP tool.",
                        param=f"{prefix}.tool_choice")


MCP_TOOL_KEYS = frozenset(typing.get_type_hints(Mcp))  # the fields of an ``mcp`` tool, from the pinned SDK
_MCP_LABEL = re.compile(r"[A-Za-z0-9_-]{1,64}")
_MCP_FILTER_KEYS = frozenset({"tool_names", "read_only"})


def _validate_mcp_tool(tool, param):
    """One ``mcp`` tool of a session: a ``server_label``, an http(s) ``server_url`` (OpenAI's
    connectors and tunnels are not here), string headers, and filters of the SDK's shapes."""
    for key in tool:
        if key not in MCP_TOOL_KEYS:
            raise ProtocolError("unknown_parameter", f"Unknown parameter: '{param}.{key}'.", param=f"{param}.{key}")
    if not isinstance(tool.get("server_label"), str) or not _MCP_LABEL.fullmatch(tool["server_label"]):
        raise ProtocolError("invalid_value", "server_label must be 1 to 64 letters, digits, '_' or '-'.",
                            param=f"{param}.server_label")
    for key in ("connector_id", "tunnel_id"):
        if tool.get(key):
            raise ProtocolError("invalid_value", f"{key} names a service of OpenAI's; give this server an MCP "
                                "server_url instead.", param=f"{param}.{key}")
    url = tool.get("server_url")
    if not isinstance(url, str) or len(url) > 2048 or not url.startswith(("http://", "https://")) \
            or not urlsplit(url).hostname:
        raise ProtocolError("invalid_value", "An MCP tool needs an http(s) server_url.", param=f"{param}.server_url")
    headers = tool.get("headers")
    if headers is not None and (not isinstance(headers, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and len(k) + len(v) <= 8192 for k, v in headers.items())):
        raise ProtocolError("invalid_type", "'headers' must map names to strings.", param=f"{param}.headers")
    if not isinstance(tool.get("authorization", ""), str):
        raise ProtocolError("invalid_type", "'authorization' must be a string.", param=f"{param}.authorization")
    allowed = tool.get("allowed_tools")
    if allowed is not None and not _is_names(allowed) and not _is_tool_filter(allowed):
        raise ProtocolError("invalid_value", "allowed_tools must be a list of tool names or a filter "
                            "{tool_names, read_only}.", param=f"{param}.allowed_tools")
    approval = tool.get("require_approval")
    if approval is not None and approval not in ("always", "never") and not (
            isinstance(approval, dict) and set(approval) <= {"always", "never"}
            and all(_is_tool_filter(value) for value in approval.values())):
        raise ProtocolError("invalid_value", "require_approval must be 'always', 'never' or "
                            "{always, never} filters.", param=f"{param}.require_approval")


def _is_names(value):
    return isinstance(value, list) and all(isinstance(name, str) for name in value)


def _is_tool_filter(value):
    return isinstance(value, dict) and set(value) <= _MCP_FILTER_KEYS and _is_names(value.get("tool_names", [])) \
        and isinstance(value.get("read_only", False), bool)


def check_mcp_hosts(config, hosts):
    """The MCP servers of a session are on hosts the operator allows (``MCP_SERVER_HOSTS``), so
    that a client cannot make the server send requests anywhere else. Raises ProtocolError
    ``invalid_value``."""
    for index, tool in enumerate(config["tools"]):
        if tool.get("type") == "mcp" and urlsplit(tool["server_url"]).hostname not in hosts:
            raise ProtocolError("invalid_value", "This server may call MCP servers on " + (
                ", ".join(hosts) if hosts else "no host") + " only (MCP_SERVER_HOSTS).",
                param=f"session.tools[{index}].server_url")


def effective_silence_ms(td):
    """Silence (ms) that always ends a turn under ``td`` (server_vad or semantic_vad)."""
    if td["type"] == "semantic_vad":
        return EAGERNESS_SILENCE_MS[td["eagerness"]]
    return td["silence_duration_ms"]


def vad_settings(td):
    """What the VAD stage needs of a session's ``turn_detection`` (None: manual turns); see
    ``pool.pipeline.messages.ConfigureInput``."""
    if td is None:
        return None
    return TurnDetection(threshold=td.get("threshold", SERVER_VAD_DEFAULTS["threshold"]),
                         prefix_padding_ms=td.get("prefix_padding_ms", SERVER_VAD_DEFAULTS["prefix_padding_ms"]),
                         silence_ms=effective_silence_ms(td),
                         check_ms=END_OF_TURN_CHECK_MS if td["type"] == "semantic_vad" else None)

"""A response: its parameters (``response.create`` overrides over the session) and its body;
its output items are its ``output`` (``realtime.session.output.ResponseOutput``).

The life cycle (created -> output items -> ``response.done``) is driven by
``realtime.session.RealtimeSession``; when a reply starts is decided by ``realtime.session.turns``.
"""

import copy

from pool.backends.voices import LANGUAGES
from realtime import session_config as sc
from realtime.errors import ProtocolError
from realtime.session.conversation import check_images, normalise_item


class Speculation:
    """A speculative reply (``ResponseJob.speculative``) to ``item_id``, a turn not yet committed:
    its ``job`` and the pipeline events it made (``held``), sent only if it is adopted.
    ``format``: the output audio format it was started with."""

    def __init__(self, item_id, job, audio_format):
        self.item_id, self.job, self.format = item_id, job, audio_format
        self.held = []

    def fits(self, request, voice, params, speed, last_turn):
        """Whether it is the reply the session would start now: the same LLM request (the turn
        committed with the words it was started on, and nothing else changed), voice, modality,
        format and speed, answering the same last turn (``last_turn``: its item id)."""
        job = self.job
        return (job.request == request and job.voice == voice and job.modality == params["modality"]
                and self.format == params["format"] and job.speed == speed and self.item_id == last_turn
                and not job.cancelled.is_set())


class Response:
    """One response in progress. ``job``: its ``pool.pipeline.messages.ResponseJob``; ``output``:
    its ``ResponseOutput``; ``automatic``: started by turn detection for a user turn, not by the
    client's ``response.create``."""

    def __init__(self, response_id, job, output, metadata, automatic=False):
        self.id = response_id
        self.automatic = automatic
        self.job = job
        self.output = output
        self.metadata = metadata
        self.turns = []  # the user turns this reply is the first to see (realtime.session.turns)
        # The MCP calls the server runs for it (realtime.session.mcp), round by round: a round is
        # the LLM's part, then its calls; the next round's LLM sees their results.
        self.function_names = set()  # the function tools offered (the client runs those)
        self.round_calls = []  # this round's mcp_call items
        self.calls_running = {}  # item id -> its asyncio task
        self.llm_done = False  # this round's LLM part has finished
        self.rounds = 1
        self.usage = {"input_tokens": 0, "cached_tokens": 0, "output_tokens": 0}

    def add_usage(self, usage):
        """One round's tokens (the first round's prompt counts as the input, and the part of it
        the LLM read from its prompt cache as the cached input)."""
        if not self.usage["input_tokens"]:
            self.usage["input_tokens"] = usage.get("input_tokens", 0)
            self.usage["cached_tokens"] = usage.get("cached_tokens", 0)
        self.usage["output_tokens"] += usage.get("output_tokens", 0)

    def body(self, status, status_details=None, usage=None):
        return {
            "object": "realtime.response",
            "id": self.id,
            "status": status,
            "status_details": status_details,
            "output": self.output.public(),
            "conversation_id": "auto" if self.output.in_conversation else None,
            "output_modalities": [self.output.modality],
            "metadata": self.metadata,
            "usage": usage,
        }


def with_reply_language(instructions, language):
    """``instructions`` with the reply's language said to the LLM (``language``: ISO 639-1 of
    the user's turn, or None to say nothing)."""
    name = LANGUAGES[language].name if language in LANGUAGES else language
    if not name:
        return instructions
    return f"{instructions}\n\nThe user speaks {name}. Answer in {name}."


def response_params(config, overrides, resolve_item, max_tokens_cap, image_hosts=()):
    """The effective parameters of a response: ``overrides`` (``response.create``'s ``response``)
    over the session ``config``; their types are checked already (``realtime.schema``).
    ``resolve_item(item_id)`` finds an ``item_reference``. Raises ProtocolError naming the bad
    field."""
    modalities = overrides.get("output_modalities", overrides.get("modalities", config["output_modalities"]))
    if isinstance(modalities, list) and "audio" in modalities:
        modalities = ["audio"]
    if modalities not in (["audio"], ["text"]):
        raise ProtocolError("invalid_value", 'output_modalities must be ["audio"] or ["text"].',
                            param="response.output_modalities")
    instructions = overrides.get("instructions", config["instructions"])
    if not isinstance(instructions, str) or len(instructions) > sc.MAX_INSTRUCTIONS_CHARS:
        raise ProtocolError("invalid_value", "instructions must be a string of at most "
                            f"{sc.MAX_INSTRUCTIONS_CHARS} characters.", param="response.instructions")
    max_tokens = overrides.get("max_output_tokens", config["max_output_tokens"])
    sc.validate_max_output_tokens(max_tokens, "response.max_output_tokens")
    tools = overrides.get("tools", config["tools"])
    tool_choice = overrides.get("tool_choice", config["tool_choice"])
    if "tools" in overrides or "tool_choice" in overrides:  # the session's were checked at its update
        sc.validate_tools(overrides.get("tools", []), tool_choice, "response")
    conversation = overrides.get("conversation", "auto")
    if conversation not in ("auto", "none"):
        raise ProtocolError("invalid_value", "conversation must be 'auto' or 'none'.",
                            param="response.conversation")
    reasoning = overrides.get("reasoning", config.get("reasoning"))
    sc.validate_reasoning(reasoning, "response.reasoning")
    audio_out = {**config["audio"]["output"], **_audio_output_overrides(overrides)}
    sc.validate_voice(audio_out["voice"], "response.audio.output.voice")
    sc.validate_format(audio_out["format"], "response.audio.output.format")
    input_items = overrides.get("input")
    if input_items is not None:
        for index, entry in enumerate(input_items):
            check_images(entry, image_hosts, f"response.input[{index}]")
        input_items = [resolve_item(entry["id"]) if entry.get("type") == "item_reference" else normalise_item(entry)
                       for entry in input_items]
    return {
        "modality": modalities[0],
        "instructions": instructions,
        "max_tokens": max_tokens_cap if max_tokens == "inf" else min(max_tokens, max_tokens_cap),
        "tools": tools,
        "tool_choice": tool_choice,
        "conversation": conversation == "auto",
        "metadata": overrides.get("metadata"),
        "input": input_items,
        "reasoning_effort": (reasoning or {}).get("effort"),
        "parallel_tool_calls": overrides.get("parallel_tool_calls", config.get("parallel_tool_calls")),
        "voice": sc.voice_name(audio_out["voice"]),
        "format": audio_out["format"],
    }


def _audio_output_overrides(overrides):
    """``response.create``'s own ``audio.output`` voice and format (or the beta ``voice`` and
    ``output_audio_format``): for this response only."""
    audio = overrides.get("audio") or {}
    for key in audio:
        if key not in sc.RESPONSE_AUDIO_KEYS:
            raise ProtocolError("unknown_parameter", f"Unknown parameter: 'response.audio.{key}'.",
                                param=f"response.audio.{key}")
    output = audio.get("output") or {}
    if not isinstance(output, dict):
        raise ProtocolError("invalid_type", "'response.audio.output' must be an object.", param="response.audio.output")
    for key in output:
        if key not in sc.RESPONSE_AUDIO_OUTPUT_KEYS:
            raise ProtocolError("unknown_parameter", f"Unknown parameter: 'response.audio.output.{key}' (a "
                                "response has its own voice and format; speed is the session's).",
                                param=f"response.audio.output.{key}")
    output = dict(output)
    if "voice" in overrides:
        output.setdefault("voice", overrides["voice"])
    if "output_audio_format" in overrides:
        fmt = overrides["output_audio_format"]
        output.setdefault("format", sc.BETA_FORMATS.get(fmt, fmt) if isinstance(fmt, str) else fmt)
    return {key: copy.deepcopy(value) for key, value in output.items() if key in ("voice", "format")}


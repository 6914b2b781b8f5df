"""The per-session protocol state machine: configuration, conversation items, responses.

``RealtimeSession`` runs on the event loop and never blocks: client events come in through
``handle_client_event``, pipeline events through ``handle_pipeline_event``, and server events go
out through the ``send`` callable it was given. Audio work is submitted to the unit (``port``);
the unit's stage threads compute and emit events back.
"""

import copy
import json
import logging
import time

from pool import messages as m
from pool import metrics
from pool.backends.llm import LLMRequest
from pool.ids import new_id

from . import session_config as sc
from .audio import InputAudioDecoder, OutputAudioEncoder, bytes_per_second
from .errors import ProtocolError
from .events import require

log = logging.getLogger(__name__)


class _Response:
    def __init__(self, response_id, job, conversation, metadata, modality):
        self.id = response_id
        self.job = job
        self.in_conversation = conversation
        self.metadata = metadata
        self.modality = modality
        self.output = []  # output items in order (messages and function calls)
        self.item = None  # the open assistant message item, created with its first output
        self.text = []  # its transcript (audio) or text deltas, in order
        self.audio_ms = 0.0
        self.marks = {}  # time.perf_counter() marks of the turn it answers (_log_turn)

    def where(self, item, content=True):
        """The addressing fields of an output item's events."""
        fields = {"response_id": self.id, "item_id": item["id"], "output_index": self.output.index(item)}
        if content:
            fields["content_index"] = 0
        return fields

    def body(self, status, status_details=None, usage=None):
        return {
            "object": "realtime.response",
            "id": self.id,
            "status": status,
            "status_details": status_details,
            "output": [_public(item) for item in self.output],
            "conversation_id": "auto" if self.in_conversation else None,
            "output_modalities": [self.modality],
            "metadata": self.metadata,
            "usage": usage,
        }


class RealtimeSession:
    """One client's session on one unit.

    ``port``: the unit, with ``submit(msg) -> bool``; ``send(event_dict)``: queues a server event;
    ``defaults``: ``{"model", "instructions", "voice", "max_output_tokens", "context_chars"}`` of
    new sessions (``context_chars``: the LLM context budget for conversation items, characters).
    """

    def __init__(self, session_id, port, send, defaults):
        self.id = session_id
        self._port = port
        self._send_raw = send
        self._max_tokens_cap = defaults["max_output_tokens"]
        self._context_chars = defaults.get("context_chars", 8000)
        self.config = sc.default_session(session_id, defaults["model"], defaults["instructions"],
                                         defaults["voice"])
        self.items = {}  # item id -> item, in conversation order
        self.response = None  # the active _Response
        # The session row's counters (pool.models.Session), reported when the session ends.
        self.stats = {"turns": 0, "responses": 0, "cancelled_responses": 0, "errors": 0,
                      "stage_failures": 0, "audio_in_seconds": 0.0, "audio_out_seconds": 0.0,
                      "last_error": ""}
        self._turn_marks = {}
        self._input_format = None
        self._configure_input()

    # --- sending ---------------------------------------------------------------------------

    def send(self, event_type, **fields):
        self._send_raw({"type": event_type, "event_id": new_id("event"), **fields})

    def send_error(self, error):
        """Send an ``error`` event for a ProtocolError; the session goes on."""
        self.stats["errors"] += 1
        self.stats["last_error"] = f"{error.code}: {error.message}"[:500]
        metrics.ERRORS.labels(metrics.PROCESS, error.code).inc()
        self.send("error", error=error.to_error())

    def start(self):
        """The first server event of every session."""
        self.send("session.created", session=copy.deepcopy(self.config))

    def close(self):
        """The client is gone: stop the active response's generation and speech now."""
        if self.response is not None:
            self.response.job.cancelled.set()

    # --- client events ---------------------------------------------------------------------

    def handle_client_event(self, event):
        """Carry out one parsed client event; a ProtocolError becomes an ``error`` event."""
        handler = getattr(self, "_on_" + event["type"].replace(".", "_"))
        try:
            handler(event)
        except ProtocolError as error:
            if error.event_id is None:
                error.event_id = event.get("event_id")
            self.send_error(error)

    def _on_session_update(self, event):
        update = require(event, "session", dict)
        self.config = sc.apply_update(self.config, update)
        self._configure_input()
        self.send("session.updated", session=copy.deepcopy(self.config))

    def _on_input_audio_buffer_append(self, event):
        audio = require(event, "audio", str)
        if not audio:
            raise ProtocolError("invalid_value", "'audio' is empty.", param="audio")
        self._submit(m.AppendInput(audio, event.get("event_id")))
        self.stats["audio_in_seconds"] += len(audio) * 3 / 4 / bytes_per_second(self._input_format)

    def _on_input_audio_buffer_commit(self, event):
        self._submit(m.CommitInput(event.get("event_id")))

    def _on_input_audio_buffer_clear(self, event):
        self._submit(m.ClearInput(event.get("event_id")))

    def _on_conversation_item_create(self, event):
        item = require(event, "item", dict)
        previous = require(event, "previous_item_id", str, optional=True)
        if previous is not None and previous != "root" and previous not in self.items:
            raise ProtocolError("item_not_found", f"Item with id '{previous}' not found.",
                                param="previous_item_id")
        item = self._normalise_item(item)
        if item["id"] in self.items:
            raise ProtocolError("item_already_exists", f"Item '{item['id']}' already exists.",
                                param="item.id")
        self._insert_item(item, previous)

    def _on_conversation_item_retrieve(self, event):
        item = self._item(require(event, "item_id", str))
        self.send("conversation.item.retrieved", item=copy.deepcopy(item))

    def _on_conversation_item_delete(self, event):
        item_id = require(event, "item_id", str)
        self._item(item_id)
        del self.items[item_id]
        self.send("conversation.item.deleted", item_id=item_id)

    def _on_conversation_item_truncate(self, event):
        item = self._item(require(event, "item_id", str))
        content_index = require(event, "content_index", int)
        audio_end_ms = require(event, "audio_end_ms", int)
        if item.get("role") != "assistant" or not item["content"] or content_index != 0:
            raise ProtocolError("invalid_value", "Only an assistant audio item's content 0 can be "
                                "truncated.", param="content_index")
        heard = item.get("_audio_ms", 0)
        if not 0 <= audio_end_ms <= heard:
            raise ProtocolError("invalid_value", f"audio_end_ms must be between 0 and the item's "
                                f"audio length ({int(heard)} ms).", param="audio_end_ms")
        if self.response and self.response.item is item:
            self._cancel_response("client_cancelled")
        part = item["content"][0]
        words = (part.get("transcript") or "").split()
        keep = int(len(words) * audio_end_ms / heard) if heard else 0
        part["transcript"] = " ".join(words[:keep])
        item["_audio_ms"] = audio_end_ms
        self.send("conversation.item.truncated", item_id=item["id"], content_index=0,
                  audio_end_ms=audio_end_ms)

    def _on_response_create(self, event):
        overrides = require(event, "response", dict, optional=True, default={})
        self.create_response(overrides, event.get("event_id"))

    def _on_response_cancel(self, event):
        response_id = require(event, "response_id", str, optional=True)
        if self.response is None or (response_id and response_id != self.response.id):
            raise ProtocolError("response_cancel_not_active",
                                "Cancellation failed: no active response found.")
        self._cancel_response("client_cancelled")

    def _on_output_audio_buffer_clear(self, event):
        raise ProtocolError("unsupported_transport", "output_audio_buffer.clear is only for WebRTC "
                            "and SIP connections; over WebSocket, use response.cancel and "
                            "conversation.item.truncate.")

    # --- helpers for client events ---------------------------------------------------------

    def _submit(self, msg):
        if not self._port.submit(msg):
            raise ProtocolError("server_busy", "The unit's input queue is full; retry shortly.",
                                type="server_error")

    def _item(self, item_id):
        if item_id not in self.items:
            raise ProtocolError("item_not_found", f"Item with id '{item_id}' not found.", param="item_id")
        return self.items[item_id]

    def _configure_input(self):
        audio_in = self.config["audio"]["input"]
        if audio_in["format"] != self._input_format:
            self._input_format = copy.deepcopy(audio_in["format"])
            self._decoder = InputAudioDecoder(self._input_format)
        td = audio_in["turn_detection"]
        vad = None
        if td is not None:
            vad = {"threshold": td.get("threshold", sc.SERVER_VAD_DEFAULTS["threshold"]),
                   "prefix_padding_ms": td.get("prefix_padding_ms", sc.SERVER_VAD_DEFAULTS["prefix_padding_ms"]),
                   "silence_ms": sc.effective_silence_ms(td)}
        language = (audio_in["transcription"] or {}).get("language")
        self._submit(m.ConfigureInput(self._decoder, vad, language))

    def _normalise_item(self, item):
        kind = item.get("type", "message")
        item = {**copy.deepcopy(item), "id": item.get("id") or new_id("item"), "object": "realtime.item"}
        if kind == "message":
            if item.get("role") not in ("user", "assistant", "system"):
                raise ProtocolError("invalid_value", "item.role must be user, assistant or system.",
                                    param="item.role")
            if not isinstance(item.get("content"), list):
                raise ProtocolError("invalid_type", "item.content must be a list.", param="item.content")
            for i, part in enumerate(item["content"]):
                if not isinstance(part, dict) or part.get("type") not in (
                        "input_text", "input_audio", "text", "output_text", "output_audio"):
                    raise ProtocolError("invalid_value", "Unsupported content part.",
                                        param=f"item.content[{i}]")
        elif kind == "function_call":
            for name in ("call_id", "name", "arguments"):
                if not isinstance(item.get(name), str):
                    raise ProtocolError("invalid_type", f"item.{name} must be a string.", param=f"item.{name}")
        elif kind == "function_call_output":
            for name in ("call_id", "output"):
                if not isinstance(item.get(name), str):
                    raise ProtocolError("invalid_type", f"item.{name} must be a string.", param=f"item.{name}")
        else:
            raise ProtocolError("invalid_value", f"Unsupported item type {str(kind)[:50]!r}.", param="item.type")
        item["type"] = kind
        item.setdefault("status", "completed")
        return item

    def _insert_item(self, item, previous_item_id=None):
        """Add an item after ``previous_item_id`` (None: at the end; "root": first)."""
        ids = list(self.items)
        if previous_item_id is None:
            position = len(ids)
        elif previous_item_id == "root":
            position = 0
        else:
            position = ids.index(previous_item_id) + 1
        before = ids[position - 1] if position else None
        entries = list(self.items.items())
        entries.insert(position, (item["id"], item))
        self.items = dict(entries)
        public = _public(item)
        self.send("conversation.item.added", previous_item_id=before, item=public)
        if item.get("status") == "completed":
            self.send("conversation.item.done", previous_item_id=before, item=public)

    # --- responses -------------------------------------------------------------------------

    def create_response(self, overrides, event_id=None):
        """Start a response (``response.create`` or a server-VAD turn). Raises ProtocolError."""
        if self.response is not None:
            raise ProtocolError(
                "conversation_already_has_active_response",
                f"Conversation already has an active response in progress: {self.response.id}. "
                "Wait until the response is finished before creating a new one.", event_id=event_id)
        params = self._response_params(overrides)
        response_id = new_id("resp")
        request = LLMRequest(self._llm_messages(params), params["max_tokens"], params["tools"],
                             params["tool_choice"])
        audio_out = self.config["audio"]["output"]
        job = m.ResponseJob(response_id, request, params["modality"], audio_out["voice"],
                            audio_out["speed"], OutputAudioEncoder(audio_out["format"]))
        response = _Response(response_id, job, params["conversation"], params["metadata"],
                             params["modality"])
        if not self._port.submit(job):
            raise ProtocolError("server_busy", "The unit cannot take another response now.",
                                type="server_error", event_id=event_id)
        self.response = response
        self.stats["responses"] += 1
        # The marks of the turn this response answers travel with it (the next turn may start).
        response.marks = {**self._turn_marks, "response_created": time.perf_counter()}
        self.send("response.created", response=response.body("in_progress"))

    def _response_params(self, overrides):
        config = self.config
        known = {"instructions", "tools", "tool_choice", "output_modalities", "conversation",
                 "input", "metadata", "max_output_tokens", "audio", "modalities", "voice",
                 "output_audio_format", "temperature", "prompt", "tracing"}
        for key in overrides:
            if key not in known:
                raise ProtocolError("unknown_parameter", f"Unknown parameter: 'response.{key}'.",
                                    param=f"response.{key}")
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
        sc.validate_tools(tools, tool_choice, "response")
        conversation = overrides.get("conversation", "auto")
        if conversation not in ("auto", "none"):
            raise ProtocolError("invalid_value", "conversation must be 'auto' or 'none'.",
                                param="response.conversation")
        metadata = overrides.get("metadata")
        if metadata is not None and not isinstance(metadata, dict):
            raise ProtocolError("invalid_type", "metadata must be an object.", param="response.metadata")
        input_items = overrides.get("input")
        if input_items is not None:
            if not isinstance(input_items, list):
                raise ProtocolError("invalid_type", "input must be a list of items.", param="response.input")
            input_items = [self._input_item(entry, i) for i, entry in enumerate(input_items)]
        cap = self._max_tokens_cap
        return {
            "modality": modalities[0],
            "instructions": instructions,
            "max_tokens": cap if max_tokens == "inf" else min(max_tokens, cap),
            "tools": tools,
            "tool_choice": tool_choice,
            "conversation": conversation == "auto",
            "metadata": metadata,
            "input": input_items,
        }

    def _input_item(self, entry, index):
        if isinstance(entry, dict) and entry.get("type") == "item_reference":
            return self._item(entry.get("id"))
        if not isinstance(entry, dict):
            raise ProtocolError("invalid_type", "input entries must be objects.", param=f"response.input[{index}]")
        return self._normalise_item(entry)

    def _llm_messages(self, params):
        """System instructions and the conversation as chat messages. With ``truncation``
        "auto" (the default) only the most recent items that fit ``context_chars`` are sent, so
        a long call keeps a bounded prompt (prefill time and memory); "disabled" sends all."""
        items = params["input"] if params["input"] is not None else list(self.items.values())
        history = [message for message in map(_item_message, items) if message]
        if self.config["truncation"] != "disabled":
            budget, kept = self._context_chars, []
            for message in reversed(history):
                budget -= len(json.dumps(message))
                if budget < 0 and kept:
                    break
                kept.append(message)
            history = kept[::-1]
            while history and history[0]["role"] == "tool":  # never a result without its call
                history.pop(0)
        return [{"role": "system", "content": params["instructions"]}, *history]

    def _cancel_response(self, reason):
        response, self.response = self.response, None
        response.job.cancelled.set()
        self.stats["cancelled_responses"] += 1
        self._close_item(response, "incomplete")
        self.send("response.done", response=response.body(
            "cancelled", {"type": "cancelled", "reason": reason}))

    def _add_output(self, response, item):
        response.output.append(item)
        if response.in_conversation:
            previous = list(self.items)[-1] if self.items else None
            self.items[item["id"]] = item
            self.send("conversation.item.added", previous_item_id=previous, item=_public(item))
        self.send("response.output_item.added", response_id=response.id,
                  output_index=len(response.output) - 1, item=_public(item))

    def _finish_output(self, response, item, status):
        item["status"] = status
        self.send("response.output_item.done", response_id=response.id,
                  output_index=response.output.index(item), item=_public(item))
        if response.in_conversation:
            self.send("conversation.item.done", item=_public(item))

    def _open_item(self, response):
        item = {"id": new_id("item"), "object": "realtime.item", "type": "message",
                "status": "in_progress", "role": "assistant", "content": []}
        response.item, response.text, response.audio_ms = item, [], 0.0
        self._add_output(response, item)
        if response.modality == "audio":
            item["content"].append({"type": "output_audio", "transcript": ""})
            part = {"type": "audio", "transcript": ""}
        else:
            item["content"].append({"type": "output_text", "text": ""})
            part = {"type": "text", "text": ""}
        self.send("response.content_part.added", part=part, **response.where(item))

    def _close_item(self, response, status):
        item, response.item = response.item, None
        if item is None:
            return
        text = "".join(response.text)
        where = response.where(item)
        if response.modality == "audio":
            item["content"][0]["transcript"] = text
            self.send("response.output_audio.done", **where)
            self.send("response.output_audio_transcript.done", transcript=text, **where)
            part = {"type": "audio", "transcript": text}
        else:
            item["content"][0]["text"] = text
            self.send("response.output_text.done", text=text, **where)
            part = {"type": "text", "text": text}
        self.send("response.content_part.done", part=part, **where)
        item["_audio_ms"] = response.audio_ms
        self._finish_output(response, item, status)

    # --- pipeline events -------------------------------------------------------------------

    def handle_pipeline_event(self, event):
        """One event from the unit's stage threads (called on the event loop)."""
        handler = _PIPELINE_HANDLERS.get(type(event))
        if handler:
            handler(self, event)

    def _on_speech_started(self, event):
        self._turn_marks = {}
        self.send("input_audio_buffer.speech_started", audio_start_ms=event.audio_start_ms,
                  item_id=event.item_id)
        td = self.config["audio"]["input"]["turn_detection"]
        if self.response is not None and td and td.get("interrupt_response"):
            self._cancel_response("turn_detected")

    def _on_speech_stopped(self, event):
        self._turn_marks["speech_stopped"] = time.perf_counter()
        self.send("input_audio_buffer.speech_stopped", audio_end_ms=event.audio_end_ms,
                  item_id=event.item_id)

    def _on_input_committed(self, event):
        self.stats["turns"] += 1
        previous = list(self.items)[-1] if self.items else None
        self.send("input_audio_buffer.committed", previous_item_id=previous, item_id=event.item_id)
        item = {"id": event.item_id, "object": "realtime.item", "type": "message",
                "status": "completed", "role": "user",
                "content": [{"type": "input_audio", "transcript": None}]}
        self._insert_item(item)

    def _on_input_cleared(self, event):
        self.send("input_audio_buffer.cleared")

    def _on_input_rejected(self, event):
        self.send_error(ProtocolError(event.code, event.message, event_id=event.event_id,
                                      param="audio" if event.code in ("invalid_base64", "invalid_audio") else None))

    def _on_transcribed(self, event):
        self._turn_marks["transcribed"] = time.perf_counter()
        self._turn_marks["stt_seconds"] = event.stt_seconds
        item = self.items.get(event.item_id)
        if item is None:
            return  # deleted while it was transcribed
        item["content"][0]["transcript"] = event.transcript
        if self.config["audio"]["input"]["transcription"] is not None:
            # Whisper transcribes the whole item at once: one delta, then completed.
            self.send("conversation.item.input_audio_transcription.delta", item_id=event.item_id,
                      content_index=0, delta=event.transcript)
            self.send("conversation.item.input_audio_transcription.completed",
                      item_id=event.item_id, content_index=0, transcript=event.transcript,
                      usage={"type": "duration", "seconds": round(event.audio_seconds, 3)})
        td = self.config["audio"]["input"]["turn_detection"]
        wants_response = td is not None and td.get("create_response") and self.config["type"] == "realtime"
        if wants_response and event.transcript.strip() and self.response is None:
            self.create_response({})

    def _on_transcription_failed(self, event):
        if event.item_id in self.items:
            self.send("conversation.item.input_audio_transcription.failed", item_id=event.item_id,
                      content_index=0, error={"type": "transcription_error", "code": "transcription_failed",
                                              "message": event.message, "param": None})

    def _active(self, response_id):
        return self.response if self.response and self.response.id == response_id else None

    def _on_response_text(self, event):
        response = self._active(event.response_id)
        if response is None:
            return
        if response.item is None:
            self._open_item(response)
        response.text.append(event.text)
        self.send("response.output_text.delta", delta=event.text, **response.where(response.item))

    def _on_response_audio(self, event):
        response = self._active(event.response_id)
        if response is None:
            return
        if response.item is None:
            self._open_item(response)
            response.marks["first_audio"] = time.perf_counter()
        where = response.where(response.item)
        if event.transcript:
            response.text.append(event.transcript)
            self.send("response.output_audio_transcript.delta", delta=event.transcript, **where)
        for chunk in event.chunks:
            self.send("response.output_audio.delta", delta=chunk, **where)
        response.audio_ms += event.audio_ms
        self.stats["audio_out_seconds"] += event.audio_ms / 1000

    def _on_response_finished(self, event):
        response = self._active(event.response_id)
        if response is None:
            return
        self.response = None
        usage = {"total_tokens": event.usage.get("input_tokens", 0) + event.usage.get("output_tokens", 0),
                 "input_tokens": event.usage.get("input_tokens", 0),
                 "output_tokens": event.usage.get("output_tokens", 0)}
        if event.error:
            self._close_item(response, "incomplete")
            self.send("response.done", response=response.body(
                "failed", {"type": "failed", "error": {"type": "server_error", "code": "model_error",
                                                        "message": event.error}}, usage))
            return
        self._close_item(response, "completed")
        self.send("response.done", response=response.body("completed", None, usage))
        self._log_turn(response)

    def _on_response_function_call(self, event):
        response = self._active(event.response_id)
        if response is None:
            return
        self._close_item(response, "completed")
        item = {"id": new_id("item"), "object": "realtime.item", "type": "function_call",
                "status": "in_progress", "call_id": event.call_id, "name": event.name, "arguments": ""}
        self._add_output(response, item)
        where = {**response.where(item, content=False), "call_id": event.call_id}
        self.send("response.function_call_arguments.delta", delta=event.arguments, **where)
        item["arguments"] = event.arguments
        self.send("response.function_call_arguments.done", name=event.name, arguments=event.arguments, **where)
        self._finish_output(response, item, "completed")

    def _on_stage_failed(self, event):
        self.stats["stage_failures"] += 1
        self.send_error(ProtocolError("stage_failed", f"The {event.stage} stage failed: {event.message}",
                                      type="server_error"))
        if self.response is not None and event.stage in ("llm", "tts"):
            failed, self.response = self.response, None
            failed.job.cancelled.set()
            self._close_item(failed, "incomplete")
            self.send("response.done", response=failed.body(
                "failed", {"type": "failed", "error": {"type": "server_error", "code": "stage_failed",
                                                        "message": event.message}}))

    def _log_turn(self, response):
        """One JSON log line per voice turn: milliseconds from speech_stopped to each stage mark,
        and each stage's own compute time (read by bench/turn_latency.py)."""
        marks, timings = response.marks, response.job.timings
        stopped = marks.get("speech_stopped")
        if stopped is None:
            return

        def since(t):
            return round((t - stopped) * 1000, 1) if t else None

        turn = {
            "session": self.id,
            "response": response.id,
            "transcribed_ms": since(marks.get("transcribed")),
            "response_created_ms": since(marks.get("response_created")),
            "llm_start_ms": since(timings.get("llm_start")),
            "llm_first_text_ms": since(timings.get("llm_first_text")),
            "llm_first_phrase_ms": since(timings.get("llm_first_phrase")),
            "tts_first_audio_ms": since(timings.get("tts_first_audio")),
            "first_audio_sent_ms": since(marks.get("first_audio")),
            "stt_compute_ms": round(marks.get("stt_seconds", 0) * 1000, 1),
            "tts_first_compute_ms": round(timings.get("tts_first_seconds", 0) * 1000, 1),
            "audio_out_s": round(response.audio_ms / 1000, 2),
        }
        log.info("turn timings %s", json.dumps(turn))
        metrics.turn(turn)

def _public(item):
    """An item as sent on the wire (without private bookkeeping keys)."""
    return {k: copy.deepcopy(v) for k, v in item.items() if not k.startswith("_")}


def _item_message(item):
    """A conversation item as a chat-completions message for the LLM (None when it has no text)."""
    if item["type"] == "function_call":
        return {"role": "assistant", "content": None, "tool_calls": [{
            "id": item["call_id"], "type": "function",
            "function": {"name": item["name"], "arguments": item["arguments"]}}]}
    if item["type"] == "function_call_output":
        return {"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]}
    texts = []
    for part in item.get("content", []):
        text = part.get("text") if part.get("type") in ("input_text", "text", "output_text") else part.get("transcript")
        if text:
            texts.append(text)
    if not texts:
        return None
    return {"role": item["role"], "content": " ".join(texts)}


_PIPELINE_HANDLERS = {
    m.SpeechStarted: RealtimeSession._on_speech_started,
    m.SpeechStopped: RealtimeSession._on_speech_stopped,
    m.InputCommitted: RealtimeSession._on_input_committed,
    m.InputCleared: RealtimeSession._on_input_cleared,
    m.InputRejected: RealtimeSession._on_input_rejected,
    m.Transcribed: RealtimeSession._on_transcribed,
    m.TranscriptionFailed: RealtimeSession._on_transcription_failed,
    m.ResponseText: RealtimeSession._on_response_text,
    m.ResponseAudio: RealtimeSession._on_response_audio,
    m.ResponseFunctionCall: RealtimeSession._on_response_function_call,
    m.ResponseFinished: RealtimeSession._on_response_finished,
    m.StageFailed: RealtimeSession._on_stage_failed,
}

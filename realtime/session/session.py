"""The per-session protocol state machine: configuration, client events, pipeline events.

``RealtimeSession`` runs on the event loop and never blocks: client events come in through
``handle_client_event``, pipeline events through ``handle_pipeline_event``, and server events go
out through the ``send`` callable it was given. Audio work is submitted to the unit (``port``);
the unit's stage threads compute and emit events back. Both directions dispatch the same way:
an event type ``a.b_c`` (or a message class ``BC``) is handled by the method ``_on_a_b_c``
(``_on_b_c``). Its parts are objects it owns, each in its module: the items (``conversation``) and the client's
item events (``conversation_events``), a response's parameters and body (``responses``) and its
output items (``output``, owned by the response), and when speech is a turn and when a reply
starts (``turns``). A response ends in one place, ``_end_response``.
"""

import asyncio
import copy
import functools
import json
import logging
import re
import time
from dataclasses import replace

from pool import metrics
from pool.backends.base import LLMRequest, with_voice_style
from pool.backends.voices import voice_for_language
from pool.history.recorder import NoRecords
from pool.ids import new_id
from pool.pipeline import messages as m
from pool.pipeline.playback import Playback
from pool.pipeline.timings import Marks, TurnTimings
from realtime import session_config as sc
from realtime.audio import InputAudioDecoder, OutputAudioEncoder, bytes_per_second
from realtime.errors import ProtocolError
from realtime.mcp_client import McpCallError
from realtime.session import conversation as conv
from realtime.session import turns
from realtime.session.conversation_events import ConversationEvents
from realtime.session.history import SessionHistory
from realtime.session.mcp import McpServers
from realtime.session.output import ResponseOutput
from realtime.session.responses import Response, Speculation, response_params, with_reply_language
from realtime.session.turns import TurnTaking

log = logging.getLogger(__name__)

_CAMEL = re.compile(r"(?<!^)(?=[A-Z])")
# Client events after which a speculative reply is not the reply the turn would get.
CHANGES_THE_NEXT_REPLY = frozenset({"session.update", "conversation.item.create", "conversation.item.delete",
                                    "conversation.item.truncate", "input_audio_buffer.clear", "response.create"})


def server_error(event_id=None):
    """The ``error`` of an event the server failed to carry out (a bug; logged)."""
    return ProtocolError("server_error", "The server failed to carry out this event; the session goes on.",
                         type="server_error", event_id=event_id)


def _usage(tokens):
    """A response's ``usage``, in OpenAI's shape, from its ``{"input_tokens", "cached_tokens",
    "output_tokens"}``. Every token is text: the LLM reads the transcript, not the audio."""
    read, cached, written = tokens["input_tokens"], tokens["cached_tokens"], tokens["output_tokens"]
    return {"total_tokens": read + written, "input_tokens": read, "output_tokens": written,
            "input_token_details": {"text_tokens": read, "audio_tokens": 0, "cached_tokens": cached},
            "output_token_details": {"text_tokens": written, "audio_tokens": 0}}


def _llm_tool_choice(tool_choice):
    """The session's ``tool_choice`` for the LLM, which sees MCP tools as functions: an MCP
    server's named tool is that function; a server without a name, any tool."""
    if isinstance(tool_choice, dict) and tool_choice.get("type") == "mcp":
        return {"type": "function", "name": tool_choice["name"]} if tool_choice.get("name") else "required"
    return tool_choice


@functools.cache
def _pipeline_handler_name(event_type):
    """``SpeechStarted`` -> ``_on_speech_started`` (cached: audio events are frequent)."""
    return "_on_" + _CAMEL.sub("_", event_type.__name__).lower()


class RealtimeSession:
    """One client's session on one unit.

    ``port``: the unit, with ``submit(msg) -> bool``; ``send(event_dict)``: queues a server event;
    ``defaults``: a ``realtime.session_config.SessionDefaults``; ``recorder``: where
    its history goes (``pool.history.recorder.Records``; the default keeps nothing); ``recording``: a
    ``pool.history.recordings.SessionRecording`` that gets the assistant audio sent, or None.
    ``media_format``: the audio format of a transport that carries audio itself (WebRTC's
    tracks: PCM16 at 24 kHz both ways, whatever the session's ``audio`` formats say); None: the
    session's formats (WebSocket). ``playback``: what its client plays
    (``pool.pipeline.playback.Playback``; the unit's context shares it when the VAD cancels the
    echo of it).
    """

    def __init__(self, session_id, port, send, defaults, recorder=None, recording=None, media_format=None,
                 playback=None):
        self.id = session_id
        self._port = port
        self._send_raw = send
        self._max_tokens_cap = defaults.max_output_tokens
        self._context_chars = defaults.context_chars
        self._voice_style = defaults.voice_style
        self._speaks = defaults.speaks  # PoolRegistry.speaks: the models' languages
        self._defaults = defaults
        self.config = defaults.session(session_id)
        self.conversation = conv.Conversation()
        self.playback = playback or Playback()
        self.turns = TurnTaking(session_id, self.conversation, defaults.interrupt_min_speech_ms,
                                defaults.backchannels, self.playback)
        self._turn_timer = None  # a turns.Wait in progress
        self._idle_timer = None  # server_vad's idle timeout (turns.idle_wait)
        self._turn_language = None  # of the latest user turn: the next reply's language
        self.response = None  # the active Response
        self._speculation = None  # a speculative reply to the speech in progress (Speculation)
        self._resumed_pause = None  # (item_id, samples) of the last pause speech went on after
        self._speculative_replies = defaults.speculative_replies
        # The session row's counters (pool.models.Session), reported when the session ends.
        self.stats = {"turns": 0, "responses": 0, "completed_responses": 0, "cancelled_responses": 0,
                      "errors": 0, "stage_failures": 0, "audio_in_seconds": 0.0, "audio_out_seconds": 0.0,
                      "last_error": ""}
        self._turn_marks = Marks()  # of the latest voice turn (pool.pipeline.timings)
        self.history = SessionHistory(session_id, recorder or NoRecords(), defaults.history_max_items)
        self.conversation_events = ConversationEvents(self.conversation, self.send, self.history,
                                                      defaults.image_url_hosts)
        self._image_hosts = defaults.image_url_hosts
        self.mcp = McpServers(self.send, self.send_error, self.conversation_events, self.history,
                              defaults.mcp_timeout_seconds)
        self._mcp_hosts, self._mcp_max_rounds = defaults.mcp_server_hosts, defaults.mcp_max_rounds
        self._approved = []  # mcp_approval_request items approved, run by the next response
        self._images_dropped = False  # the one notice per session that the LLM reads no images
        self._recording = recording
        self._input_format = None
        self._media_format = media_format
        # Appends submitted to the VAD, heard by it, and covered by a CatchUpInput (_ask_catch_up).
        self._appends_sent = self._appends_heard = self._catch_up_asked = 0
        self._configure_input()

    @property
    def items(self):
        return self.conversation.items

    # --- sending ---------------------------------------------------------------------------

    def send(self, event_type, **fields):
        self._send_raw({"type": event_type, "event_id": new_id("event"), **fields})

    def send_error(self, error):
        """Send an ``error`` event for a ProtocolError; the session goes on."""
        self.stats["errors"] += 1
        self.stats["last_error"] = f"{error.code}: {error.message}"[:500]
        metrics.ERRORS.labels(metrics.PROCESS, error.code).inc()
        event = error.to_event()
        self.history.error(event["event_id"], event["error"])
        self._send_raw(event)

    def start(self, *initial):
        """The first server event of every session. ``initial``: ``session.update`` bodies the
        session starts with, in order (a client secret's ``session``, a WebRTC call's; None for
        none), announced by ``session.created``; if one no longer passes (the models changed
        since a secret was issued) the session starts with the defaults and an ``error``
        follows."""
        error = None
        try:
            for update in initial:
                if update:
                    self._update_config(update)
        except ProtocolError as exc:
            error = exc
            self.config = self._defaults.session(self.id)
            self._configure_input()
        self.send("session.created", session=copy.deepcopy(self.config))
        if error is not None:
            self.send_error(error)
        self.mcp.configure(self.config["tools"])

    def close(self):
        """The client is gone: stop the active response's generation and speech now, and close
        the history (its summary joins ``stats``)."""
        self._cancel_turn_timer()
        self._drop_speculation()
        if self._idle_timer is not None:
            self._idle_timer.cancel()
        if self.response is not None:
            self.response.job.cancelled.set()
            for task in self.response.calls_running.values():
                task.cancel()
        self.mcp.close()
        self.stats.update(self.history.close())
        # The parts it owns (and turn-taking's view of the active response) send through it:
        # without these references, it goes by refcount.
        self.response = self.turns.response = self.conversation_events = self.mcp = None

    # --- turn-taking's decisions ----------------------------------------------------------

    def _carry_out(self, decisions):
        """Carry out what turn-taking decided (``realtime.session.turns``), in order."""
        for decision in decisions:
            if isinstance(decision, turns.Announce):
                self._cancel_turn_timer()
                self.send("input_audio_buffer.speech_started", audio_start_ms=decision.event.audio_start_ms,
                          item_id=decision.event.item_id)
            elif isinstance(decision, turns.Cancel):
                if self.response is not None:
                    self.cancel_response(decision.reason)
            elif isinstance(decision, turns.Peek):
                self.submit(m.PeekInput(decision.item_id, decision.after_ms, decision.prompt, decision.phrases))
            elif isinstance(decision, turns.Judged):
                metrics.OVERLAPS.labels(metrics.PROCESS, decision.verdict).inc()
                self.history.overlap(decision.verdict, decision.event.audio_start_ms, heard=decision.heard,
                                     held_ms=decision.held_ms)
            elif isinstance(decision, turns.Release):
                for event in decision.events:
                    self.handle_pipeline_event(event)
                self._carry_out(self.turns.settle())
            elif isinstance(decision, turns.Start):
                self.create_response({}, automatic=True)
            elif isinstance(decision, turns.Wait):
                self._cancel_turn_timer()
                self._turn_timer = asyncio.get_running_loop().call_later(decision.seconds, self._decide_again)
            elif isinstance(decision, turns.CatchUp):
                self._ask_catch_up()
        if self.response is not None:  # the peeks' cores (pool.pipeline.stages.tts)
            undecided = self.response.job.overlap_undecided
            undecided.set() if self.turns.undecided else undecided.clear()
        self._arm_idle_timer()

    def _arm_idle_timer(self):
        """(Re)start server_vad's idle timeout where turn-taking says it runs, or stop it."""
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        wait = self.turns.idle_wait()
        if wait is not None:
            self._idle_timer = asyncio.get_running_loop().call_later(max(wait, 0.0), self._idle_timeout)

    def _idle_timeout(self):
        """No speech for ``idle_timeout_ms``: the VAD commits the silence (``InputTimedOut``)."""
        self._idle_timer = None
        wait = self.turns.idle_wait()
        if wait is None or wait > 0.01:
            self._arm_idle_timer()  # something happened meanwhile
            return
        td = self.config["audio"]["input"]["turn_detection"]
        if self._port.submit(m.TimeoutInput(td["idle_timeout_ms"])):
            self.turns.timing_out = True

    def _decide_again(self):
        """Turn-taking's ``maybe_respond`` once more (after a Wait, or once the input has room)."""
        self._turn_timer = None
        try:
            self._carry_out(self.turns.maybe_respond())
        except ProtocolError as error:
            self.send_error(error)

    def _cancel_turn_timer(self):
        if self._turn_timer is not None:
            self._turn_timer.cancel()
            self._turn_timer = None

    def _ask_catch_up(self):
        """Ask the VAD to say (``InputCaughtUp``) when it has heard every append sent so far."""
        if self._catch_up_asked >= self._appends_sent:
            return
        if self._port.submit(m.CatchUpInput(self._appends_sent)):
            self._catch_up_asked = self._appends_sent
        else:  # the VAD inbox is full: ask again when it has room
            loop = asyncio.get_running_loop()
            self._port.when_input_room(lambda: loop.call_soon_threadsafe(self._decide_again))

    def submit(self, msg):
        """Queue work on the unit. Raises ProtocolError ``server_busy`` when it cannot take it."""
        if not self._port.submit(msg):
            raise ProtocolError("server_busy", "The unit's input queue is full; retry shortly.",
                                type="server_error")

    # --- client events ---------------------------------------------------------------------

    def handle_client_event(self, event):
        """Carry out one parsed client event; a ProtocolError becomes an ``error`` event, and so
        does a bug (``server_error``, logged with its traceback): the session goes on."""
        handler = getattr(self, "_on_" + event["type"].replace(".", "_"))
        if event["type"] in CHANGES_THE_NEXT_REPLY:
            self._drop_speculation()
        try:
            handler(event)
        except ProtocolError as error:
            if error.event_id is None:
                error.event_id = event.get("event_id")
            self.send_error(error)
        except Exception:  # noqa: BLE001 - one event's bug must not end the session
            log.exception("session %s: %s failed", self.id, event["type"])
            self.send_error(server_error(event.get("event_id")))

    def _on_session_update(self, event):
        self._update_config(event["session"])
        self.send("session.updated", session=copy.deepcopy(self.config))
        self.mcp.configure(self.config["tools"])

    def _update_config(self, update):
        """Apply a ``session.update`` body, all or nothing. Raises ProtocolError."""
        config = sc.apply_update(self.config, update)
        sc.check_languages(config, self._speaks)
        sc.check_mcp_hosts(config, self._mcp_hosts)
        self.config = config
        self.turns.language = (config["audio"]["input"]["transcription"] or {}).get("language") or self._turn_language
        self._configure_input()
        if self.config["audio"]["input"]["turn_detection"] is None:
            self._carry_out(self.turns.input_reset())  # manual turns: the VAD no longer ends speech
        self._arm_idle_timer()

    def _on_input_audio_buffer_append(self, event):
        audio = event["audio"]
        self.submit(m.AppendInput(audio, event.get("event_id")))
        self._appends_sent += 1
        self.turns.input_heard = False
        self.stats["audio_in_seconds"] += len(audio) * 3 / 4 / bytes_per_second(self._input_format)

    def _on_input_audio_buffer_commit(self, event):
        self.submit(m.CommitInput(event.get("event_id")))

    def _on_input_audio_buffer_clear(self, event):
        self.submit(m.ClearInput(event.get("event_id")))

    def _on_response_create(self, event):
        self.create_response(event.get("response") or {}, event.get("event_id"))

    def _on_response_cancel(self, event):
        response_id = event.get("response_id")
        if self.response is None or (response_id and response_id != self.response.id):
            raise ProtocolError("response_cancel_not_active",
                                "Cancellation failed: no active response found.")
        self.cancel_response("client_cancelled")

    def _on_output_audio_buffer_clear(self, event):
        raise ProtocolError("unsupported_transport", "output_audio_buffer.clear is only for WebRTC "
                            "and SIP connections; over WebSocket, use response.cancel and "
                            "conversation.item.truncate.")

    def _on_conversation_item_create(self, event):
        item = self.conversation_events.create(event)
        if item["type"] == "mcp_approval_response" and item["approve"]:
            # The approved call runs in a response of its own, now or when the active one ends.
            self._approved.append(self.conversation.get(item["approval_request_id"]))
            if self.response is None:
                self.create_response({}, event.get("event_id"))

    def _on_conversation_item_retrieve(self, event):
        self.conversation_events.retrieve(event)

    def _on_conversation_item_delete(self, event):
        self.conversation_events.delete(event)

    def _on_conversation_item_truncate(self, event):
        """What the user heard of an assistant audio item: of the reply still being spoken (its
        speech stops now), or of one already done."""
        item = self.conversation.get(event["item_id"])
        content_index, audio_end_ms = event["content_index"], event["audio_end_ms"]
        if item.get("role") != "assistant" or not item["content"] or content_index != 0:
            raise ProtocolError("invalid_value", "Only an assistant audio item's content 0 can be "
                                "truncated.", param="content_index")
        playing = self.response if self.response and self.response.output.item is item else None
        heard = playing.output.audio_ms if playing else item.get("_audio_ms", 0)
        if not 0 <= audio_end_ms <= heard:
            raise ProtocolError("invalid_value", f"audio_end_ms must be between 0 and the item's "
                                f"audio sent so far ({int(heard)} ms).", param="audio_end_ms")
        if playing:
            # Still being spoken: stop its speech now; the transcript is cut when it closes, and
            # the response ends at response.cancel or when its stages have stopped.
            playing.output.truncate(audio_end_ms)
            playing.job.cancelled.set()
            self.turns.response_truncated()
        else:
            part = item["content"][0]
            part["transcript"] = conv.cut_transcript(part.get("transcript") or "", audio_end_ms, heard)
            item["_audio_ms"] = audio_end_ms
        self.send("conversation.item.truncated", item_id=item["id"], content_index=0,
                  audio_end_ms=audio_end_ms)

    # --- helpers for client events ---------------------------------------------------------

    def _configure_input(self):
        audio_in = self.config["audio"]["input"]
        wire_format = self._media_format or audio_in["format"]
        if wire_format != self._input_format:
            self._input_format = copy.deepcopy(wire_format)
            self._decoder = InputAudioDecoder(self._input_format)
        language = (audio_in["transcription"] or {}).get("language")
        self.turns.configure(audio_in["turn_detection"], self.config["type"] == "realtime")
        self.submit(m.ConfigureInput(self._decoder, sc.vad_settings(audio_in["turn_detection"]), language,
                                     sc.stt_prompt(audio_in["transcription"]),
                                     noise_reduction=audio_in.get("noise_reduction") is not None))

    # --- responses -------------------------------------------------------------------------

    def create_response(self, overrides, event_id=None, automatic=False):
        """Start a response: the client's ``response.create``, or (``automatic``) the reply to
        a server-VAD turn. Raises ProtocolError."""
        if self.response is not None:
            raise ProtocolError(
                "conversation_already_has_active_response",
                f"Conversation already has an active response in progress: {self.response.id}. "
                "Wait until the response is finished before creating a new one.", event_id=event_id)
        language = self._turn_language if len(self._speaks["transcription_languages"]) > 1 else None
        params, functions, request, voice = self._plan(overrides, language)
        if not self._speaks.get("sees_images", False) and not self._images_dropped and any(
                conv.images(item) for item in params["input"] or self.items.values()):
            self._images_dropped = True
            log.info("session %s: the LLM reads no images; they are left out of its prompt", self.id)
            self.history.notice("The LLM reads no images: the images of this conversation were left out of "
                                "its prompt.")
        speculation, self._speculation = self._speculation, None
        job = None
        if speculation is not None:
            if automatic and speculation.fits(request, voice, params, self.config["audio"]["output"]["speed"],
                                              (self.turns.unanswered or [None])[-1]):
                job = speculation.job  # already thinking and speaking: it goes on
                job.marks.take_turn(self._turn_marks)
                metrics.SPECULATIVE_REPLIES.labels(metrics.PROCESS, "used").inc()
            else:
                self._discard(speculation)
                speculation = None
        if job is None:
            # The marks of the voice turn it answers travel with it (the next turn may start).
            job = m.ResponseJob(new_id("resp"), request, params["modality"], voice,
                                self.config["audio"]["output"]["speed"],
                                OutputAudioEncoder(self._media_format or params["format"]), marks=self._turn_marks)
        response_id = job.response_id
        output = ResponseOutput(response_id, params["modality"], params["conversation"], voice, self.send,
                                self.conversation, self.history)
        response = Response(response_id, job, output, params["metadata"], automatic)
        response.function_names = {tool["name"] for tool in functions}  # the client's to run; the rest MCP's
        approved, self._approved = self._approved, []
        if not approved and speculation is None and not self._port.submit(job):
            raise ProtocolError("server_busy", "The unit cannot take another response now.",
                                type="server_error", event_id=event_id)
        job.marks.reach("response_created")
        self._turn_marks = Marks()  # taken: a later response (after text) answers no voice turn
        self.response = response
        self.history.opened(response_id)
        self.stats["responses"] += 1
        self.turns.response_created(response)
        self._arm_idle_timer()  # none runs while a reply is under way
        self.send("response.created", response=response.body("in_progress"))
        if speculation is not None:  # what it made while the user paused goes out now, in order
            job.adopt()
            for event in speculation.held:
                self.handle_pipeline_event(event)
        if approved:  # the calls first; the LLM then answers with their results
            response.llm_done = True
            for request_item in approved:
                self._start_mcp_call(response, request_item["server_label"], request_item["name"],
                                     request_item["arguments"], request_item["id"])
            self._next_round(response)

    def _plan(self, overrides, language, said=None):
        """``(params, function tools, LLMRequest, voice)`` of a response started now with
        ``overrides`` (``response.create``'s), in ``language`` (None: the session's); ``said``:
        the transcript of a turn not yet committed, as the user message it will be (a
        speculative reply). Raises ProtocolError."""
        params = response_params(self.config, overrides, self.conversation.get, self._max_tokens_cap,
                                 self._image_hosts)
        # A reply is in the language of the user's latest turn: the LLM is told it (a model that
        # hears several languages), and it is spoken by a voice of that language.
        instructions = with_voice_style(params["instructions"], self._voice_style, params["modality"])
        messages = self.conversation.llm_messages(with_reply_language(instructions, language),
                                                  params["input"], self.config["truncation"], self._context_chars,
                                                  with_images=self._speaks.get("sees_images", False))
        if said is not None:
            messages = [*messages, {"role": "user", "content": said}]
        functions = [tool for tool in params["tools"] if tool.get("type", "function") == "function"]
        tools = functions + self.mcp.offered(besides={tool["name"] for tool in functions})
        request = LLMRequest(messages, params["max_tokens"], tools, _llm_tool_choice(params["tool_choice"]),
                             reasoning_effort=params["reasoning_effort"],
                             parallel_tool_calls=params["parallel_tool_calls"])
        voice = params["voice"] if language is None else voice_for_language(
            params["voice"], language, self._speaks["voices"])
        return params, functions, request, voice

    # --- speculative replies --------------------------------------------------------------

    def _on_speculated(self, event):
        """The STT transcribed the speech in progress at its first pause: when the turn that
        would end there would be answered at once, start its reply now, held
        (``ResponseJob.speculative``): its LLM and first phrase run while the silence timer
        runs out, on cores no other reply needs. The commit adopts it if it ends with the same
        words (``create_response``); anything else discards it without a trace."""
        self._drop_speculation()
        if (event.item_id, event.samples) == self._resumed_pause:
            return  # speech went on while the STT transcribed this pause: no reply can be for it
        if not self._speculative_replies or not self.turns.may_speculate(event.item_id, event.transcript):
            return
        language = event.language if len(self._speaks["transcription_languages"]) > 1 else None
        try:
            params, _functions, request, voice = self._plan({}, language, said=event.transcript)
        except ProtocolError:
            return
        # Marks of its own: its stages' marks are the turn's only if it is adopted.
        job = m.ResponseJob(new_id("resp"), request, params["modality"], voice, self.config["audio"]["output"]["speed"],
                            OutputAudioEncoder(self._media_format or params["format"]), speculative=True)
        if self._port.submit(job):
            self._speculation = Speculation(event.item_id, job, params["format"])

    def _on_speech_resumed(self, event):
        self._resumed_pause = (event.item_id, event.samples)
        if self._speculation is not None and self._speculation.item_id == event.item_id:
            self._drop_speculation()

    def _drop_speculation(self):
        """What the session was told or did makes a speculative reply of no use."""
        if self._speculation is not None:
            self._discard(self._speculation)
            self._speculation = None

    @staticmethod
    def _discard(speculation):
        """Stop a speculative reply's work at once; what it made was never sent, and is not kept."""
        speculation.job.cancelled.set()
        speculation.held.clear()
        metrics.SPECULATIVE_REPLIES.labels(metrics.PROCESS, "discarded").inc()

    def cancel_response(self, reason):
        """Cancel the active response (``reason``: turn_detected or client_cancelled)."""
        self._end_response("cancelled", {"type": "cancelled", "reason": reason})

    def _end_response(self, status, details=None, usage=None):
        """The one place a response ends: its stages stop, its open item closes, response.done
        goes out, and turn-taking decides what comes next."""
        response, self.response = self.response, None
        response.job.cancelled.set()
        for item_id, task in response.calls_running.items():
            task.cancel()
            response.output.finish_mcp_call(next(i for i in response.round_calls if i["id"] == item_id))
        response.calls_running.clear()
        if status in ("cancelled", "completed"):
            self.stats[f"{status}_responses"] += 1
        response.output.close("completed" if status == "completed" else "incomplete")
        self.send("response.done", response=response.body(status, details, usage))
        timings = TurnTimings.from_marks(response.job.marks)
        self.history.response(response.id, status, details, usage, timings)
        if status == "completed" and timings is not None:
            log.info("turn timings %s %s", response.id, json.dumps(timings.as_dict()))
            metrics.turn(timings)
        self._carry_out(self.turns.response_ended(response, status, (details or {}).get("reason")))
        if self._approved and self.response is None:
            try:
                self.create_response({})
            except ProtocolError as error:
                self.send_error(error)

    # --- pipeline events -------------------------------------------------------------------

    def handle_pipeline_event(self, event):
        """One event from the unit's stage threads (called on the event loop). Turn-taking may
        hold it back (speech not yet known to be a turn) and hand it back later; a speculative
        reply's output waits for its adoption."""
        speculation = self._speculation
        if speculation is not None and getattr(event, "response_id", None) == speculation.job.response_id:
            speculation.held.append(event)
            return
        try:
            decisions = self.turns.intercept(event)
            if decisions is not None:
                self._carry_out(decisions)
                return
            handler = getattr(self, _pipeline_handler_name(type(event)), None)
            if handler:
                handler(event)
        except ProtocolError as error:
            self.send_error(error)
        except Exception:  # noqa: BLE001 - one event's bug must not end the session
            log.exception("session %s: %s failed", self.id, type(event).__name__)
            self.send_error(server_error())

    def _on_speech_started(self, event):
        if self._speculation is not None and self._speculation.item_id != event.item_id:
            self._drop_speculation()  # other speech: the turn it was for is not the last
        self._turn_marks = Marks()
        self.history.speech_started(event.item_id, event.audio_start_ms)
        self._carry_out(self.turns.speech_started(event))

    def _on_speech_stopped(self, event):
        self._turn_marks.speech_stopped = time.perf_counter()
        self.history.speech_stopped(event.item_id, event.audio_end_ms)
        self._carry_out(self.turns.speech_stopped())
        self.send("input_audio_buffer.speech_stopped", audio_end_ms=event.audio_end_ms,
                  item_id=event.item_id)

    def _on_input_committed(self, event):
        self.stats["turns"] += 1
        self._turn_marks.committed = time.perf_counter()
        self.send("input_audio_buffer.committed", previous_item_id=self.conversation.last_id(),
                  item_id=event.item_id)
        item = conv.user_audio_item(event.item_id)
        self.conversation_events.insert(item)
        self.history.committed(item)
        self._carry_out(self.turns.committed(event.item_id))

    def _on_input_timed_out(self, event):
        self.turns.timed_out(event.item_id)
        if event.item_id is not None:
            self.send("input_audio_buffer.timeout_triggered", audio_start_ms=event.audio_start_ms,
                      audio_end_ms=event.audio_end_ms, item_id=event.item_id)
        self._arm_idle_timer()

    def _on_echo_removed(self, event):
        log.info("session %s: echo of the playback removed from the microphone, %d-%d ms", self.id,
                 event.start_ms, event.end_ms)
        metrics.OVERLAPS.labels(metrics.PROCESS, "echo").inc()
        self.history.overlap("echo", event.start_ms, event.end_ms)

    def _on_input_caught_up(self, event):
        self._appends_heard = max(self._appends_heard, event.appends)
        self.turns.input_heard = self._appends_heard >= self._appends_sent
        self._carry_out(self.turns.maybe_respond())  # more appends since: another CatchUp

    def _on_input_cleared(self, event):
        self._carry_out(self.turns.input_reset())
        self.send("input_audio_buffer.cleared")

    def _on_input_rejected(self, event):
        self.send_error(ProtocolError(event.code, event.message, event_id=event.event_id, param=event.param))

    def _on_transcribed(self, event):
        self._turn_language = event.language
        if event.language is not None:
            self.turns.language = event.language
        self._turn_marks.transcribed = time.perf_counter()  # the latest item's
        self._turn_marks.stt_compute_s = event.stt_seconds
        self._turn_marks.stt_speculative = event.speculative
        item = self.items.get(event.item_id)
        if item is not None:  # else deleted while it was transcribed
            item["content"][0]["transcript"] = event.transcript
            item["_language"] = event.language
            if self.config["audio"]["input"]["transcription"] is not None:
                # Whisper transcribes the whole item at once: one delta, then completed.
                self.send("conversation.item.input_audio_transcription.delta", item_id=event.item_id,
                          content_index=0, delta=event.transcript)
                self.send("conversation.item.input_audio_transcription.completed",
                          item_id=event.item_id, content_index=0, transcript=event.transcript,
                          usage={"type": "duration", "seconds": round(event.audio_seconds, 3)},
                          **({"language": event.language} if event.language else {}))
        self.history.transcribed(event.item_id)
        self._carry_out(self.turns.transcribed(event.item_id))

    def _on_transcription_failed(self, event):
        if event.item_id in self.items:
            self.send("conversation.item.input_audio_transcription.failed", item_id=event.item_id,
                      content_index=0, error={"type": "transcription_error", "code": "transcription_failed",
                                              "message": event.message, "param": None})
        self.history.transcribed(event.item_id)
        self._carry_out(self.turns.transcribed(event.item_id))

    def _active(self, response_id):
        return self.response if self.response and self.response.id == response_id else None

    def _on_response_text(self, event):
        response = self._active(event.response_id)
        if response is not None:
            response.output.add_text(event.text)

    def _on_response_audio(self, event):
        response = self._active(event.response_id)
        if response is None:
            return
        opens = response.output.item is None  # the first audio of an item
        if not response.output.add_audio(event.chunks, event.transcript, event.audio_ms):
            return  # truncated by the client
        if opens:
            response.job.marks.reach("first_audio_sent")
        if self._recording is not None and event.samples is not None:
            self._recording.sent(event.samples)
        self.playback.sent(event.audio_ms / 1000, event.samples)
        self.stats["audio_out_seconds"] += event.audio_ms / 1000

    def _on_response_function_call(self, event):
        response = self._active(event.response_id)
        if response is None:
            return
        server = None if event.name in response.function_names else self.mcp.find(event.name)
        if server is None:
            response.output.add_function_call(event.call_id, event.name, event.arguments)
        elif server.needs_approval(event.name):
            response.output.add_mcp_approval_request(server.label, event.name, event.arguments)
        else:
            self._start_mcp_call(response, server.label, event.name, event.arguments)

    # --- MCP calls, run by the server within a response (realtime.session.mcp) -------------

    def _start_mcp_call(self, response, server_label, name, arguments, approval_request_id=None):
        item = response.output.add_mcp_call(server_label, name, arguments, approval_request_id)
        response.round_calls.append(item)
        server = self.mcp.by_label(server_label)
        if server is None:  # the session no longer names it (approved before an update)
            response.output.finish_mcp_call(item, error=McpCallError(
                "http_error", f"The session has no MCP server '{server_label}' now.").as_error())
            return
        task = asyncio.get_running_loop().create_task(self.mcp.call(server, name, arguments))
        response.calls_running[item["id"]] = task
        task.add_done_callback(lambda done: self._mcp_call_done(response, item, done))

    def _mcp_call_done(self, response, item, task):
        if task.cancelled() or response.calls_running.pop(item["id"], None) is None:
            return  # the response ended first (_end_response closed the item)
        failure = task.exception()
        if failure is not None and not isinstance(failure, McpCallError):
            log.error("session %s: MCP call %s failed", self.id, item["name"], exc_info=failure)
            failure = McpCallError("http_error", f"{type(failure).__name__}: {failure}")
        if failure is None:
            response.output.finish_mcp_call(item, output=task.result())
        else:
            response.output.finish_mcp_call(item, error=failure.as_error())
        self._next_round(response)

    def _next_round(self, response):
        """When this round's LLM part and calls are done: the next round, which sees the calls'
        results (without tools after MCP_MAX_ROUNDS rounds, so a reply always ends)."""
        if response is not self.response or not response.llm_done or response.calls_running:
            return
        calls, response.round_calls = response.round_calls, []
        if not calls:
            self._end_response("completed", None, _usage(response.usage))
            return
        job = response.job
        messages = job.request.messages + [message for item in response.output.items
                                           for message in conv.item_messages(item)]
        last = response.rounds >= self._mcp_max_rounds
        request = replace(job.request, messages=messages, prefix="", tool_choice="none" if last else "auto")
        next_job = m.ResponseJob(job.response_id, request, job.modality, job.voice, job.speed, job.encoder,
                                 marks=job.marks)
        response.rounds += 1
        response.llm_done = False
        response.job = next_job
        if not self._port.submit(next_job):
            self._end_response("failed", {"type": "failed", "error": {
                "type": "server_error", "code": "server_busy", "message": "The unit cannot take the reply's "
                "next round now."}}, _usage(response.usage))

    def _on_response_finished(self, event):
        response = self._active(event.response_id)
        if response is None:
            return
        if response.output.truncated_ms is not None:
            self.cancel_response("client_cancelled")  # truncated by the client, no cancel came
            return
        response.add_usage(event.usage)
        if event.error:
            self._end_response("failed", {"type": "failed", "error": {
                "type": "server_error", "code": "model_error", "message": event.error}}, _usage(response.usage))
        else:
            response.llm_done = True
            self._next_round(response)

    def _on_stage_failed(self, event):
        self.stats["stage_failures"] += 1
        self.send_error(ProtocolError("stage_failed", f"The {event.stage} stage failed: {event.message}",
                                      type="server_error"))
        if self.response is not None and event.stage in ("llm", "tts"):
            self._end_response("failed", {"type": "failed", "error": {
                "type": "server_error", "code": "stage_failed", "message": event.message}})

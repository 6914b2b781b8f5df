"""The output of one response: its items and their events, in protocol order, and what the user
heard of them.

``ResponseOutput`` is owned by its ``Response`` (``response.output``): the session hands it the
pipeline's response events of that response (text, audio, function calls) and closes it when
the response ends. It sends through the session's ``send`` and keeps its items in the
conversation (when the response is in it) and the history; when a response starts and ends, and
what that means for turn-taking, stays the session's.
"""

from realtime.session import conversation as conv


class ResponseOutput:
    """The output items of response ``response_id``: ``items`` in order (messages and function
    calls), ``item`` the open assistant message (created with its first output), its ``text``
    (transcript or text deltas, in order) and ``audio_ms`` sent so far, and ``truncated_ms`` once
    the client truncated it while it played (``conversation.item.truncate``).

    ``modality``: "audio" or "text"; ``in_conversation``: its items join the conversation;
    ``voice``: the voice that speaks it (kept with its message in the history); ``send(type,
    **fields)``: the session's; ``conversation``: a ``realtime.session.conversation.Conversation``;
    ``history``: the session's ``realtime.session.history.SessionHistory``.
    """

    def __init__(self, response_id, modality, in_conversation, voice, send, conversation, history):
        self.response_id, self.modality, self.in_conversation, self.voice = response_id, modality, in_conversation, voice
        self._send, self._conversation, self._history = send, conversation, history
        self.items = []
        self.item = None
        self.text = []
        self.audio_ms = 0.0
        self.truncated_ms = None

    def where(self, item, content=True):
        """The addressing fields of an output item's events."""
        fields = {"response_id": self.response_id, "item_id": item["id"], "output_index": self.items.index(item)}
        if content:
            fields["content_index"] = 0
        return fields

    def public(self):
        """The items as ``response.done``'s ``output`` shows them."""
        return [conv.public(item) for item in self.items]

    # --- what the pipeline produced ----------------------------------------------------------

    def add_text(self, text):
        """A text delta of a text response."""
        if self.item is None:
            self._open_item()
        self.text.append(text)
        self._send("response.output_text.delta", delta=text, **self.where(self.item))

    def add_audio(self, chunks, transcript, audio_ms):
        """Audio deltas (base64 ``chunks``, ``audio_ms`` of them) and their ``transcript`` delta.
        Returns False, sending nothing, once the client truncated the item: the user stopped
        listening."""
        if self.truncated_ms is not None:
            return False
        if self.item is None:
            self._open_item()
        where = self.where(self.item)
        if transcript:
            self.text.append(transcript)
            self._send("response.output_audio_transcript.delta", delta=transcript, **where)
        for chunk in chunks:
            self._send("response.output_audio.delta", delta=chunk, **where)
        self.audio_ms += audio_ms
        return True

    def add_function_call(self, call_id, name, arguments):
        """A function call item, whole (the LLM stage sends its arguments at once)."""
        self.close("completed")
        item = conv.function_call(call_id, name)
        self._add(item)
        where = {**self.where(item, content=False), "call_id": call_id}
        self._send("response.function_call_arguments.delta", delta=arguments, **where)
        item["arguments"] = arguments
        self._send("response.function_call_arguments.done", name=name, arguments=arguments, **where)
        self._finish(item, "completed")

    def add_mcp_call(self, server_label, name, arguments, approval_request_id=None):
        """A call of an MCP tool that the server runs now (``finish_mcp_call`` when it is done).
        Returns its item."""
        self.close("completed")
        item = conv.mcp_call(server_label, name, approval_request_id)
        self._add(item)
        where = self.where(item, content=False)
        self._send("response.mcp_call_arguments.delta", delta=arguments, **where)
        item["arguments"] = arguments
        self._send("response.mcp_call_arguments.done", arguments=arguments, **where)
        self._send("response.mcp_call.in_progress", item_id=item["id"], output_index=where["output_index"])
        return item

    def finish_mcp_call(self, item, output=None, error=None):
        """An MCP call is done: its ``output`` text, or its ``error`` (an ``mcp_call`` error object;
        None for both: cut short by the end of the response)."""
        item["output"], item["error"] = output, error
        failed = output is None
        self._send("response.mcp_call.failed" if failed else "response.mcp_call.completed",
                   item_id=item["id"], output_index=self.items.index(item))
        self._finish(item, "incomplete" if failed else "completed")

    def add_mcp_approval_request(self, server_label, name, arguments):
        """The model called an MCP tool that needs the client's approval: the call waits for an
        ``mcp_approval_response`` item."""
        self.close("completed")
        item = conv.mcp_approval_request(server_label, name, arguments)
        self._add(item)
        self._finish(item, "completed")

    def truncate(self, audio_end_ms):
        """The client cut the open item at ``audio_end_ms`` while it played: the transcript is
        cut to match when the item closes."""
        self.truncated_ms = audio_end_ms

    def close(self, status):
        """Close the open message item, if any (``status``: "completed" or "incomplete"), with
        what the user heard of it."""
        item, self.item = self.item, None
        if item is None:
            return
        text = "".join(self.text)
        audio_ms = self.audio_ms
        if self.truncated_ms is not None:  # what the user heard, as conversation.item.truncate said
            text = conv.cut_transcript(text, self.truncated_ms, audio_ms)
            audio_ms = self.truncated_ms
        where = self.where(item)
        if self.modality == "audio":
            item["content"][0]["transcript"] = text
            self._send("response.output_audio.done", **where)
            self._send("response.output_audio_transcript.done", transcript=text, **where)
            part = {"type": "audio", "transcript": text}
        else:
            item["content"][0]["text"] = text
            self._send("response.output_text.done", text=text, **where)
            part = {"type": "text", "text": text}
        self._send("response.content_part.done", part=part, **where)
        item["_audio_ms"] = audio_ms
        self._finish(item, status)

    # --- items -------------------------------------------------------------------------------

    def _open_item(self):
        item = conv.assistant_message(self.modality)
        self.item, self.text, self.audio_ms = item, [], 0.0
        self._add(item)
        part = {"type": "audio", "transcript": ""} if self.modality == "audio" else {"type": "text", "text": ""}
        self._send("response.content_part.added", part=part, **self.where(item))

    def _add(self, item):
        self._history.opened(item["id"])
        self.items.append(item)
        if self.in_conversation:
            previous = self._conversation.last_id()
            self._conversation.items[item["id"]] = item
            self._send("conversation.item.added", previous_item_id=previous, item=conv.public(item))
        self._send("response.output_item.added", response_id=self.response_id,
                   output_index=len(self.items) - 1, item=conv.public(item))

    def _finish(self, item, status):
        item["status"] = status
        self._send("response.output_item.done", response_id=self.response_id,
                   output_index=self.items.index(item), item=conv.public(item))
        if self.in_conversation:
            self._send("conversation.item.done", item=conv.public(item))
        voice = self.voice if item["type"] == "message" and self.modality == "audio" else ""
        self._history.item(item, self.response_id, voice)

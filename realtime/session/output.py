"""The output of a response: its items and their events, in protocol order, and what the user
heard of them (``conversation.item.truncate``).

A part of ``realtime.session.RealtimeSession`` (a mixin: it uses the session's ``send``,
``history``, ``conversation``, ``response``, ``turns`` and ``stats``): the pipeline's response
events (``ResponseText``, ``ResponseAudio``, ``ResponseFunctionCall``, ``ResponseFinished``)
become output items here. When a response starts and ends is the session's
(``create_response``, ``_end_response``).
"""

from realtime.errors import ProtocolError
from realtime.session import conversation as conv


class ResponseOutput:
    """Output items of the active response (mixed into ``RealtimeSession``)."""

    def _on_conversation_item_truncate(self, event):
        item = self.conversation.get(event["item_id"])
        content_index, audio_end_ms = event["content_index"], event["audio_end_ms"]
        if item.get("role") != "assistant" or not item["content"] or content_index != 0:
            raise ProtocolError("invalid_value", "Only an assistant audio item's content 0 can be "
                                "truncated.", param="content_index")
        playing = self.response if self.response and self.response.item is item else None
        heard = playing.audio_ms if playing else item.get("_audio_ms", 0)
        if not 0 <= audio_end_ms <= heard:
            raise ProtocolError("invalid_value", f"audio_end_ms must be between 0 and the item's "
                                f"audio sent so far ({int(heard)} ms).", param="audio_end_ms")
        if playing:
            # Still being spoken: stop its speech now; the transcript is cut when it closes, and
            # the response ends at response.cancel or when its stages have stopped.
            playing.truncated_ms = audio_end_ms
            playing.job.cancelled.set()
            self.turns.response_truncated()
        else:
            part = item["content"][0]
            part["transcript"] = conv.cut_transcript(part.get("transcript") or "", audio_end_ms, heard)
            item["_audio_ms"] = audio_end_ms
        self.send("conversation.item.truncated", item_id=item["id"], content_index=0,
                  audio_end_ms=audio_end_ms)

    def _add_output(self, response, item):
        self.history.opened(item["id"])
        response.output.append(item)
        if response.in_conversation:
            previous = self.conversation.last_id()
            self.items[item["id"]] = item
            self.send("conversation.item.added", previous_item_id=previous, item=conv.public(item))
        self.send("response.output_item.added", response_id=response.id,
                  output_index=len(response.output) - 1, item=conv.public(item))

    def _finish_output(self, response, item, status):
        item["status"] = status
        self.send("response.output_item.done", response_id=response.id,
                  output_index=response.output.index(item), item=conv.public(item))
        if response.in_conversation:
            self.send("conversation.item.done", item=conv.public(item))
        voice = response.job.voice if item["type"] == "message" and response.modality == "audio" else ""
        self.history.item(item, response.id, voice)

    def _open_item(self, response):
        item = conv.assistant_message(response.modality)
        response.item, response.text, response.audio_ms = item, [], 0.0
        self._add_output(response, item)
        part = {"type": "audio", "transcript": ""} if response.modality == "audio" else {"type": "text", "text": ""}
        self.send("response.content_part.added", part=part, **response.where(item))

    def _close_item(self, response, status):
        item, response.item = response.item, None
        if item is None:
            return
        text = "".join(response.text)
        audio_ms = response.audio_ms
        if response.truncated_ms is not None:  # what the user heard, as conversation.item.truncate said
            text = conv.cut_transcript(text, response.truncated_ms, audio_ms)
            audio_ms = response.truncated_ms
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
        item["_audio_ms"] = audio_ms
        self._finish_output(response, item, status)

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
        if response is None or response.truncated_ms is not None:
            return
        if response.item is None:
            self._open_item(response)
            response.job.marks.reach("first_audio_sent")
        where = response.where(response.item)
        if event.transcript:
            response.text.append(event.transcript)
            self.send("response.output_audio_transcript.delta", delta=event.transcript, **where)
        for chunk in event.chunks:
            self.send("response.output_audio.delta", delta=chunk, **where)
        if self._recording is not None and event.samples is not None:
            self._recording.sent(event.samples)
        response.audio_ms += event.audio_ms
        self.turns.audio_sent(event.audio_ms)
        self.stats["audio_out_seconds"] += event.audio_ms / 1000

    def _on_response_finished(self, event):
        response = self._active(event.response_id)
        if response is None:
            return
        if response.truncated_ms is not None:
            self.cancel_response("client_cancelled")  # truncated by the client, no cancel came
            return
        usage = {"total_tokens": event.usage.get("input_tokens", 0) + event.usage.get("output_tokens", 0),
                 "input_tokens": event.usage.get("input_tokens", 0),
                 "output_tokens": event.usage.get("output_tokens", 0)}
        if event.error:
            self._end_response("failed", {"type": "failed", "error": {
                "type": "server_error", "code": "model_error", "message": event.error}}, usage)
        else:
            self._end_response("completed", None, usage)

    def _on_response_function_call(self, event):
        response = self._active(event.response_id)
        if response is None:
            return
        self._close_item(response, "completed")
        item = conv.function_call(event.call_id, event.name)
        self._add_output(response, item)
        where = {**response.where(item, content=False), "call_id": event.call_id}
        self.send("response.function_call_arguments.delta", delta=event.arguments, **where)
        item["arguments"] = event.arguments
        self.send("response.function_call_arguments.done", name=event.name, arguments=event.arguments, **where)
        self._finish_output(response, item, "completed")

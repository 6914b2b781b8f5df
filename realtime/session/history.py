"""What one session leaves in its history: its items, the errors it was sent, its responses.

The session tells ``SessionHistory`` when an item is final (a user turn once transcribed, a reply
once it has stopped, a client's item at once), when it sent an error and how each response
ended. Each becomes one record (``pool.history.rows.ItemRecord`` / ``ResponseRecord``) on the
recorder's queue, made storable there (``pool.history.storable``): written by the recorder thread in
batches, never per audio frame, and never waited for. At most ``max_items`` records are kept per
session; past that they are counted.
"""

import statistics
import time

from pool.history.rows import ItemRecord, ResponseRecord
from pool.ids import new_id
from realtime.session.conversation import public


def item_text(item):
    """The words of an item: its text or transcript parts, a call's ``name(arguments)``, a
    call's output; an MCP call's ``label.name(arguments) -> output``, the tools an MCP server
    listed, an approval's answer."""
    kind = item["type"]
    if kind == "function_call":
        return f"{item.get('name', '')}({item.get('arguments', '')})"
    if kind == "function_call_output":
        return item.get("output", "")
    if kind in ("mcp_call", "mcp_approval_request"):
        call = f"{item['server_label']}.{item['name']}({item['arguments']})"
        if kind == "mcp_approval_request":
            return call
        return f"{call} -> " + (item.get("output") or "" if item.get("error") is None
                                else f"error: {item['error']['message']}")
    if kind == "mcp_list_tools":
        return f"{item['server_label']}: " + ", ".join(tool["name"] for tool in item["tools"])
    if kind == "mcp_approval_response":
        return ("approved" if item["approve"] else "refused") + (f": {item['reason']}" if item.get("reason") else "")
    parts = (part.get("text") or part.get("transcript") or "" for part in item.get("content", []))
    return " ".join(p for p in parts if p)


HISTORY_IMAGE_CHARS = 256 * 1024  # a larger data: URL is kept as a note of its size only


def _bounded(item):
    """``item`` with each image whose data: URL is over HISTORY_IMAGE_CHARS replaced by a note of
    its size: the history keeps that an image was there, not megabytes of it."""
    for part in item.get("content") or ():
        url = part.get("image_url") or ""
        if part.get("type") == "input_image" and url.startswith("data:") and len(url) > HISTORY_IMAGE_CHARS:
            part["image_url"] = f"{url.split(',', 1)[0]},... ({len(url)} characters, not kept)"
    return item


class SessionHistory:
    """The history of session ``session_id``, kept through ``recorder.history(session_id,
    record)`` (``pool.history.recorder.Records``; ``NoRecords`` keeps nothing). Times (``at_ms``) are
    milliseconds since the session started."""

    def __init__(self, session_id, recorder, max_items):
        self.session_id = session_id
        self._recorder = recorder
        self._max_items = max_items
        self._started = time.monotonic()
        self._opened = {}  # item or response id -> at_ms it began (speech started, reply opened)
        self._speech = {}  # user item id -> [audio_start_ms, audio_end_ms] (VAD, buffer time)
        self._awaiting = {}  # user audio item id -> item, committed and not yet transcribed
        self.kept = self.dropped = 0
        self._first_audio_ms = []  # of the session's answered voice turns

    def now_ms(self):
        return int((time.monotonic() - self._started) * 1000)

    def opened(self, some_id):
        """An item or response begins now (its record, written later, is placed here)."""
        self._opened.setdefault(some_id, self.now_ms())

    def speech_started(self, item_id, audio_start_ms):
        self.opened(item_id)
        self._speech[item_id] = [audio_start_ms, None]

    def speech_stopped(self, item_id, audio_end_ms):
        if item_id in self._speech:
            self._speech[item_id][1] = audio_end_ms

    def committed(self, item):
        """A user audio turn: kept once ``transcribed`` (or when the session ends)."""
        self.opened(item["id"])
        self._awaiting[item["id"]] = item

    def transcribed(self, item_id):
        item = self._awaiting.pop(item_id, None)
        if item is not None:
            self.item(item)

    def item(self, item, response_id="", voice=""):
        """Keep ``item`` (a conversation item dict, as it is now)."""
        start, end = self._speech.pop(item["id"], (None, None))
        audio_ms = item.get("_audio_ms")
        self._keep(ItemRecord(
            item_id=item["id"], kind=item["type"], role=item.get("role", ""), status=item.get("status", ""),
            text=item_text(item), at_ms=self._opened.pop(item["id"], None) or self.now_ms(),
            data=_bounded(public(item)), audio_start_ms=start, audio_end_ms=end,
            audio_ms=None if audio_ms is None else int(audio_ms),
            interrupted=item.get("role") == "assistant" and item.get("status") == "incomplete",
            voice=voice, language=item.get("_language") or "", response_id=response_id))

    def notice(self, text):
        """Keep a notice of the server's about this session (``text``), e.g. images left out."""
        self._keep(ItemRecord(item_id=new_id("notice"), kind="notice", role="", status="", at_ms=self.now_ms(),
                              text=text, data={"notice": text}))

    def overlap(self, verdict, start_ms, end_ms=None, heard=(), held_ms=None):
        """Keep what was heard over the assistant's speech and what it was taken for
        (``verdict``: "interruption", "turn", "backchannel", "noise" or "echo"); ``start_ms`` and
        ``end_ms``: where, in the input audio buffer; ``heard``: ``[(voiced ms or None,
        transcript, likeness or None), ...]`` of its peeks and transcript (the likeness: how
        like a backchannel phrase the peek's audio sounded, ``turns.interrupts``); ``held_ms``:
        how long it was held."""
        said = [transcript for _, transcript, _ in heard if transcript]
        self._keep(ItemRecord(
            item_id=new_id("overlap"), kind="overlap", role="user", status=verdict, at_ms=self.now_ms(),
            text=said[-1] if said else "", audio_start_ms=start_ms, audio_end_ms=end_ms,
            data={"verdict": verdict, "heard": [{"voiced_ms": ms, "transcript": t, "likeness": x} for ms, t, x in heard],
                  "held_ms": held_ms}))

    def error(self, event_id, error):
        """Keep an ``error`` event sent (``error``: its error object)."""
        self._keep(ItemRecord(item_id=event_id, kind="error", role="", status="", at_ms=self.now_ms(),
                              text=f"{error['code']}: {error['message']}", data=error))

    def response(self, response_id, status, details, usage, timings):
        """Keep how a response ended (``details``: its status_details; ``timings``: a
        ``pool.pipeline.timings.TurnTimings`` or None)."""
        details = details or {}
        reason = details.get("reason") or (details.get("error") or {}).get("code") or ""
        usage = usage or {}
        if timings is not None and status == "completed" and timings.first_audio_sent_ms is not None:
            self._first_audio_ms.append(timings.first_audio_sent_ms)
        self._keep(ResponseRecord(
            response_id=response_id, status=status, reason=reason,
            at_ms=self._opened.pop(response_id, None) or self.now_ms(),
            input_tokens=usage.get("input_tokens"), output_tokens=usage.get("output_tokens"), timings=timings))

    def close(self):
        """The session ends: keep the turns still waiting for their transcript. Returns the
        session row's history fields (``pool.models.Session``)."""
        for item_id in list(self._awaiting):
            self.transcribed(item_id)
        p50 = statistics.median(self._first_audio_ms) if self._first_audio_ms else None
        return {"first_audio_p50_ms": p50, "history_dropped": self.dropped}

    def _keep(self, record):
        if self.kept >= self._max_items:
            self.dropped += 1
            return
        self.kept += 1
        self._recorder.history(self.session_id, record)

"""The conversation of one session: its items, in order, and how they read to the LLM.

Items are GA ``realtime.item`` dicts. Keys starting with ``_`` are private bookkeeping (the audio
length of an assistant item, ``_audio_ms``) and never reach the wire (``public``). Every item dict
the server makes is built here (``user_audio_item``, ``assistant_message``, ``function_call``,
the ``mcp_*`` items of MCP tools).
"""

import copy
import json
from urllib.parse import urlsplit

from pool.ids import new_id
from realtime.errors import ProtocolError


def public(item):
    """An item as sent on the wire (without private bookkeeping keys)."""
    return {k: copy.deepcopy(v) for k, v in item.items() if not k.startswith("_")}


def new_item(kind, status, item_id=None, **fields):
    """Every item dict is made here: ``{"id", "object": "realtime.item", "type": kind, "status",
    **fields}`` (a new ``item_...`` id unless ``item_id`` is given)."""
    return {"id": item_id or new_id("item"), "object": "realtime.item", "type": kind, "status": status, **fields}


def user_audio_item(item_id):
    """The user item of a committed audio turn; its transcript comes later."""
    return new_item("message", "completed", item_id, role="user",
                    content=[{"type": "input_audio", "transcript": None}])


def assistant_message(modality):
    """A new, in-progress assistant message with one content part for ``modality``."""
    part = {"type": "output_audio", "transcript": ""} if modality == "audio" else {"type": "output_text", "text": ""}
    return new_item("message", "in_progress", role="assistant", content=[part])


def function_call(call_id, name):
    return new_item("function_call", "in_progress", call_id=call_id, name=name, arguments="")


def mcp_call(server_label, name, approval_request_id=None):
    """A new, in-progress call of tool ``name`` of MCP server ``server_label``, run by the server."""
    return new_item("mcp_call", "in_progress", server_label=server_label, name=name, arguments="",
                    approval_request_id=approval_request_id, output=None, error=None)


def mcp_approval_request(server_label, name, arguments):
    """The model's call of an MCP tool that waits for the client's ``mcp_approval_response``."""
    return new_item("mcp_approval_request", "completed", server_label=server_label, name=name, arguments=arguments)


def mcp_list_tools(server_label):
    """The tools of MCP server ``server_label``, being listed (``tools`` filled in when done)."""
    return new_item("mcp_list_tools", "in_progress", server_label=server_label, tools=[])


def normalise_item(item):
    """A client's item (``conversation.item.create``, ``response.input``), already of the shape
    ``realtime.schema.Item``, completed with ``id``, ``object`` and ``status``."""
    return {**copy.deepcopy(item), **new_item(item.get("type", "message"), item.get("status") or "completed",
                                              item.get("id"))}


IMAGE_COST_CHARS = 1000  # what an image counts for in the LLM context budget (characters)
_DATA_IMAGE = ("data:image/png;", "data:image/jpeg;", "data:image/webp;", "data:image/gif;")


def images(item):
    """The ``input_image`` parts of an item."""
    return [part for part in item.get("content") or () if part.get("type") == "input_image"]


def check_images(item, allowed_hosts, param="item"):
    """An item's images: in user messages only, each a ``data:image/...;base64`` URL or an
    http(s) URL of one of ``allowed_hosts`` (IMAGE_URL_HOSTS: the LLM endpoint fetches it).
    Raises ProtocolError ``invalid_value`` naming the part."""
    for index, part in enumerate(item.get("content") or ()):
        if part.get("type") != "input_image":
            continue
        where = f"{param}.content[{index}]"
        if item.get("role") != "user":
            raise ProtocolError("invalid_value", "Only user messages may hold images.", param=f"{where}.type")
        url = part.get("image_url") or ""
        if url.startswith(_DATA_IMAGE) and ";base64," in url[:40]:
            continue
        host = urlsplit(url).hostname if url.startswith(("http://", "https://")) else None
        if host is None or host not in allowed_hosts:
            raise ProtocolError("invalid_value", "image_url must be a data:image/png, jpeg, webp or gif base64 URL"
                                + (", or an http(s) URL of " + ", ".join(allowed_hosts) if allowed_hosts else "")
                                + ".", param=f"{where}.image_url")


def item_messages(item, with_images=False):
    """A conversation item as chat-completions messages for the LLM: none when it has no text
    (nor images it may send), two for an MCP call (the call and its result), else one.
    ``with_images``: its images go as ``image_url`` parts (an endpoint that reads images);
    otherwise they are left out."""
    if item["type"] == "function_call":
        return [_tool_call(item["call_id"], item["name"], item["arguments"])]
    if item["type"] == "function_call_output":
        return [{"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]}]
    if item["type"] == "mcp_call":
        if item.get("output") is None and item.get("error") is None:
            return []  # still running, or cut short: no result to show the model
        result = item["output"] if item.get("error") is None else f"Error: {item['error']['message']}"
        return [_tool_call(item["id"], item["name"], item["arguments"]),
                {"role": "tool", "tool_call_id": item["id"], "content": result}]
    texts = []
    for part in item.get("content") or ():
        text = part.get("text") if part.get("type") in ("input_text", "text", "output_text") else part.get("transcript")
        if text:
            texts.append(text)
    pictures = images(item) if with_images else []
    if pictures:
        parts = [{"type": "text", "text": " ".join(texts)}] if texts else []
        for part in pictures:
            url = {"url": part["image_url"], **({"detail": part["detail"]} if part.get("detail") else {})}
            parts.append({"type": "image_url", "image_url": url})
        return [{"role": item["role"], "content": parts}]
    if not texts:
        return []
    return [{"role": item["role"], "content": " ".join(texts)}]


def _tool_call(call_id, name, arguments):
    return {"role": "assistant", "content": None, "tool_calls": [{
        "id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}]}


def _cost(message):
    """Characters ``message`` counts for in the context budget: its JSON, an image as IMAGE_COST_CHARS."""
    if isinstance(message.get("content"), list):
        return sum(len(part.get("text", "")) + (IMAGE_COST_CHARS if part["type"] == "image_url" else 0)
                   for part in message["content"]) + 50
    return len(json.dumps(message))


def cut_transcript(text, audio_end_ms, audio_ms):
    """The part of a spoken ``text`` heard in its first ``audio_end_ms`` of ``audio_ms``
    (words in proportion to time: the TTS gives no word timings)."""
    said = text.split()
    keep = int(len(said) * audio_end_ms / audio_ms) if audio_ms else 0
    return " ".join(said[:keep])


class Conversation:
    """The items of one session, in conversation order (``items``: id -> item)."""

    def __init__(self):
        self.items = {}

    def get(self, item_id):
        """The item; raises ProtocolError ``item_not_found``."""
        if item_id not in self.items:
            raise ProtocolError("item_not_found", f"Item with id '{item_id}' not found.", param="item_id")
        return self.items[item_id]

    def last_id(self):
        return next(reversed(self.items)) if self.items else None

    def insert(self, item, previous_item_id=None):
        """Add an item after ``previous_item_id`` (None: at the end; "root": first). Returns the
        id of the item now before it (None when first)."""
        ids = list(self.items)
        if previous_item_id is None:
            position = len(ids)
        elif previous_item_id == "root":
            position = 0
        else:
            position = ids.index(previous_item_id) + 1
        entries = list(self.items.items())
        entries.insert(position, (item["id"], item))
        self.items = dict(entries)
        return ids[position - 1] if position else None

    def delete(self, item_id):
        self.get(item_id)
        del self.items[item_id]

    def transcript(self, item_id):
        """The words of a user audio item so far ("" when none, or when it is gone)."""
        item = self.items.get(item_id)
        if item is None or not item.get("content"):
            return ""
        return (item["content"][0].get("transcript") or "").strip()

    def has_call(self, call_id):
        return any(item["type"] == "function_call" and item["call_id"] == call_id
                   for item in self.items.values())

    def llm_messages(self, instructions, items, truncation, budget, with_images=False):
        """System instructions and ``items`` (None: the whole conversation) as chat messages
        (``with_images``: see ``item_messages``).

        With ``truncation`` "auto" only the most recent messages that fit ``budget`` characters
        of JSON are sent, so a long call keeps a bounded prompt; "disabled" sends all.
        """
        items = list(self.items.values()) if items is None else items
        history = [message for item in items for message in item_messages(item, with_images)]
        if truncation != "disabled":
            kept = []
            for message in reversed(history):
                budget -= _cost(message)
                if budget < 0 and kept:
                    break
                kept.append(message)
            history = kept[::-1]
            while history and history[0]["role"] == "tool":  # never a result without its call
                history.pop(0)
        return [{"role": "system", "content": instructions}, *history]

"""Parsing client frames into client events, and the envelope checks every event gets.

A client event is a JSON object with a string ``type`` and an optional string ``event_id``.
Anything else is answered with an ``error`` event (never a dropped socket):

- ``invalid_json``: the text frame is not JSON, or is nested deeper than ``MAX_DEPTH``;
- ``invalid_frame``: a binary frame (the protocol is JSON text only);
- ``invalid_event``: JSON that is not an object;
- ``missing_required_parameter``: no ``type``;
- ``invalid_type``: a field of the wrong type (``param`` names it);
- ``unknown_event_type``: a ``type`` that is not one of the client events;
- ``unknown_parameter``: a field the event type does not have (the event is not carried out).
"""

import json

from .errors import ProtocolError

# JSON nested deeper than this is refused: copying or validating it would exhaust Python's
# stack (a tool's JSON schema of a few levels is far below it).
MAX_DEPTH = 64


def loads(text):
    """``json.loads`` for client input: a dict or list nested at most MAX_DEPTH deep. Raises
    ProtocolError ``invalid_json``."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ProtocolError("invalid_json", f"The message is not valid JSON: {str(exc)[:200]}.") from None
    level, depth = [value], 0
    while level:  # breadth first, without recursion
        depth += 1
        if depth > MAX_DEPTH:
            raise ProtocolError("invalid_json", f"The message is nested more than {MAX_DEPTH} levels deep.")
        level = [child for node in level if isinstance(node, (dict, list))
                 for child in (node.values() if isinstance(node, dict) else node)]
    return value

# Client event type -> the fields it may carry besides ``type`` and ``event_id``.
CLIENT_EVENT_FIELDS = {
    "session.update": {"session"},
    "input_audio_buffer.append": {"audio"},
    "input_audio_buffer.commit": set(),
    "input_audio_buffer.clear": set(),
    "conversation.item.create": {"item", "previous_item_id"},
    "conversation.item.retrieve": {"item_id"},
    "conversation.item.truncate": {"item_id", "content_index", "audio_end_ms"},
    "conversation.item.delete": {"item_id"},
    "response.create": {"response"},
    "response.cancel": {"response_id"},
    "output_audio_buffer.clear": set(),
}
CLIENT_EVENT_TYPES = frozenset(CLIENT_EVENT_FIELDS)


def parse_client_frame(text_data=None, bytes_data=None):
    """Return the client event dict of one WebSocket frame. Raises ProtocolError."""
    if text_data is None:
        raise ProtocolError("invalid_frame", "Binary frames are not supported; send JSON text frames.")
    event = loads(text_data)
    if not isinstance(event, dict):
        raise ProtocolError("invalid_event", "A client event must be a JSON object.")
    event_id = event.get("event_id")
    if event_id is not None and not isinstance(event_id, str):
        raise ProtocolError("invalid_type", "'event_id' must be a string.", param="event_id")
    if "type" not in event:
        raise ProtocolError("missing_required_parameter", "Missing required parameter: 'type'.",
                            param="type", event_id=event_id)
    if not isinstance(event["type"], str):
        raise ProtocolError("invalid_type", "'type' must be a string.", param="type", event_id=event_id)
    if event["type"] not in CLIENT_EVENT_TYPES:
        raise ProtocolError("unknown_event_type", f"Unknown event type: {event['type'][:100]!r}.",
                            param="type", event_id=event_id)
    for name in event:
        if name not in ("type", "event_id") and name not in CLIENT_EVENT_FIELDS[event["type"]]:
            raise ProtocolError("unknown_parameter", f"Unknown parameter: '{name[:100]}'.",
                                param=name[:100], event_id=event_id)
    return event


def require(event, name, kind, *, optional=False, default=None):
    """``event[name]`` checked to be of ``kind`` (a type or tuple). Raises ProtocolError."""
    if name not in event or (optional and event[name] is None):
        if optional:
            return default
        raise ProtocolError("missing_required_parameter", f"Missing required parameter: '{name}'.",
                            param=name, event_id=event.get("event_id"))
    value = event[name]
    if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        value = None  # bool is an int subclass; never accept it as a number
    if not isinstance(value, kind):
        raise ProtocolError("invalid_type", f"'{name}' has the wrong type.", param=name,
                            event_id=event.get("event_id"))
    return value

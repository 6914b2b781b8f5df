"""Parsing client frames into client events: JSON, text that can be stored, the event's shape.

A client event is a JSON object with a string ``type`` and an optional string ``event_id``, whose
fields have the shape ``realtime.schema`` gives its type. Anything else is answered with an
``error`` event (never a dropped socket):

- ``invalid_json``: the text frame is not JSON, or is nested deeper than ``MAX_DEPTH``;
- ``invalid_frame``: a binary frame (the protocol is JSON text only);
- ``invalid_event``: JSON that is not an object;
- ``missing_required_parameter``: no ``type``, or a required field missing;
- ``invalid_type`` / ``invalid_value``: a field of the wrong type or value (``param`` names it),
  or text holding NUL (U+0000) or an unpaired UTF-16 surrogate (``\\ud800``): neither is text
  that every database can store, or that a client in another language could read back;
- ``unknown_event_type``: a ``type`` that is not one of the client events;
- ``unknown_parameter``: a field the event type does not have (the event is not carried out).
"""

import json
import re

from realtime import schema
from realtime.errors import ProtocolError

# JSON nested deeper than this is refused: copying or validating it would exhaust Python's
# stack (a tool's JSON schema of a few levels is far below it).
MAX_DEPTH = 64
CLIENT_EVENT_TYPES = frozenset(schema.CLIENT_EVENTS)
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")  # after parsing, a surrogate is unpaired


def loads(text):
    """``json.loads`` for client input (str or bytes): a value nested at most MAX_DEPTH deep
    whose strings hold neither NUL nor an unpaired surrogate. Raises ProtocolError
    ``invalid_json`` or (for such text) ``invalid_value``, naming the field."""
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
    # Such text can only come from a JSON escape, or from bytes decoded with surrogatepass: the
    # scan of every string runs only then (an audio append is plain ASCII).
    if isinstance(text, bytes) or not text.isascii() or "\\u" in text:
        _check_text(value)
    return value


def _check_text(value, path=""):
    """Raise ProtocolError ``invalid_value`` at the first string (or key) of ``value`` holding
    NUL or an unpaired surrogate."""
    if isinstance(value, str):
        if _UNSTORABLE.search(value):
            raise ProtocolError("invalid_value", f"'{path or 'the message'}' holds NUL (U+0000) or an unpaired "
                                "UTF-16 surrogate, which is not text that can be kept.", param=path or None)
    elif isinstance(value, dict):
        for key, child in value.items():
            _check_text(key, path)
            _check_text(child, f"{path}.{key}" if path else key)
    elif isinstance(value, list):
        for i, child in enumerate(value):
            _check_text(child, f"{path}[{i}]")


def read_client_message(text_data, bytes_data, limit):
    """The client event of one message of a transport (a WebSocket frame, a data channel
    message), at most ``limit`` bytes (MAX_MESSAGE_BYTES). Raises ProtocolError
    ``message_too_large``, or as ``parse_client_frame``."""
    size = len(text_data) if text_data is not None else len(bytes_data or b"")
    if text_data is not None and limit < size * 4:  # UTF-8 may take up to 4 bytes a character
        size = len(text_data.encode())
    if size > limit:
        raise ProtocolError("message_too_large", f"A client message may be at most {limit} bytes; got {size}.")
    return parse_client_frame(text_data, bytes_data)


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
    schema.check(event)
    return event

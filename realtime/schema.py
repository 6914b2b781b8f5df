"""The shape of every client event: its fields, their types and their lengths, in one place.

One ``TypedDict`` per client event type, and one per conversation item shape, checked by pydantic
at the protocol edge (``check``), before any handler runs: strict types (no coercion: a number is
not a string, ``true`` is not an integer), unknown fields refused, ids at most ``MAX_ID_CHARS``.
What a handler gets is therefore well typed; what depends on the session (an item id that must
exist, a value's range under the session's configuration) is the handler's, and the session
configuration's fields are ``realtime.session_config``'s.

The field names and types follow the pinned ``openai`` SDK's realtime types (GA), plus the beta
names this server maps (``docs/PROTOCOL.md``). A pydantic error becomes one ``ProtocolError``:
``missing_required_parameter``, ``unknown_parameter``, ``invalid_value`` (a value outside its
literals or lengths) or ``invalid_type``, with ``param`` the dotted path of the field
(``item.content[0].text``).
"""

from typing import Annotated, Any, Literal, NotRequired, Required

from pydantic import ConfigDict, Discriminator, StringConstraints, Tag, TypeAdapter, ValidationError, with_config
from typing_extensions import TypedDict

from realtime.errors import ProtocolError

# OpenAI's limit for the ids a client chooses (items); the server's own are 27 characters.
MAX_ID_CHARS = 32
STRICT = ConfigDict(extra="forbid", strict=True)

Id = Annotated[str, StringConstraints(min_length=1, max_length=MAX_ID_CHARS)]
Status = Literal["completed", "incomplete", "in_progress"]


# --- conversation items ----------------------------------------------------------------------

@with_config(STRICT)
class TextPart(TypedDict):
    type: Literal["input_text", "output_text", "text"]  # "text": the beta name
    text: NotRequired[str | None]


@with_config(STRICT)
class AudioPart(TypedDict):
    type: Literal["input_audio", "output_audio", "audio"]
    audio: NotRequired[str | None]  # base64, in the session's input format
    transcript: NotRequired[str | None]


@with_config(STRICT)
class ImagePart(TypedDict):
    type: Literal["input_image"]
    image_url: NotRequired[str | None]  # a data: URL, or http(s) of an IMAGE_URL_HOSTS host
    detail: NotRequired[Literal["auto", "low", "high"] | None]


ContentPart = Annotated[TextPart | AudioPart | ImagePart, Discriminator("type")]


@with_config(STRICT)
class MessageItem(TypedDict, total=False):
    type: Literal["message"]
    id: Id
    object: Literal["realtime.item"]
    status: Status
    role: Required[Literal["user", "assistant", "system"]]
    content: Required[list[ContentPart]]


@with_config(STRICT)
class FunctionCallItem(TypedDict, total=False):
    type: Required[Literal["function_call"]]
    id: Id
    object: Literal["realtime.item"]
    status: Status
    call_id: Required[str]
    name: Required[str]
    arguments: Required[str]  # JSON text


@with_config(STRICT)
class FunctionCallOutputItem(TypedDict, total=False):
    type: Required[Literal["function_call_output"]]
    id: Id
    object: Literal["realtime.item"]
    status: Status
    call_id: Required[str]
    output: Required[str]


@with_config(STRICT)
class McpApprovalResponseItem(TypedDict, total=False):
    """The client's answer to an ``mcp_approval_request`` item (``approve``: run the call)."""

    type: Required[Literal["mcp_approval_response"]]
    id: Id
    object: Literal["realtime.item"]
    status: Status
    approval_request_id: Required[Id]
    approve: Required[bool]
    reason: str | None


@with_config(STRICT)
class ItemReference(TypedDict):
    """A ``response.input`` entry naming an item already in the conversation."""

    type: Literal["item_reference"]
    id: Id


def _item_type(value):
    """The item kind a dict claims (an item without ``type`` is a message, as OpenAI's)."""
    return value.get("type", "message") if isinstance(value, dict) else None


# the items a client may create
ITEM_TYPES = ("message", "function_call", "function_call_output", "mcp_approval_response")
_ITEMS = (Annotated[MessageItem, Tag("message")] | Annotated[FunctionCallItem, Tag("function_call")]
          | Annotated[FunctionCallOutputItem, Tag("function_call_output")]
          | Annotated[McpApprovalResponseItem, Tag("mcp_approval_response")])
Item = Annotated[_ITEMS, Discriminator(_item_type)]
InputEntry = Annotated[_ITEMS | Annotated[ItemReference, Tag("item_reference")], Discriminator(_item_type)]


# --- client events ---------------------------------------------------------------------------

@with_config(STRICT)
class _Event(TypedDict):
    event_id: NotRequired[str | None]


@with_config(STRICT)
class ResponseOverrides(TypedDict, total=False):
    """``response.create``'s ``response``: types here; values and their defaults from the
    session in ``realtime.session.responses.response_params``."""

    instructions: str
    tools: list[dict[str, Any]]
    tool_choice: str | dict[str, Any]
    output_modalities: list[str]
    modalities: list[str]  # beta
    conversation: str
    input: list[InputEntry]
    metadata: dict[str, Any] | None
    max_output_tokens: int | Literal["inf"]
    audio: dict[str, Any]
    voice: str  # beta
    output_audio_format: str | dict[str, Any]  # beta
    temperature: float | None  # beta; ignored
    prompt: dict[str, Any] | None
    tracing: Any
    reasoning: dict[str, Any] | None
    parallel_tool_calls: bool


class SessionUpdate(_Event):
    type: Literal["session.update"]
    session: dict[str, Any]  # realtime.session_config checks its fields


class InputAudioBufferAppend(_Event):
    type: Literal["input_audio_buffer.append"]
    audio: Annotated[str, StringConstraints(min_length=1)]


class InputAudioBufferCommit(_Event):
    type: Literal["input_audio_buffer.commit"]


class InputAudioBufferClear(_Event):
    type: Literal["input_audio_buffer.clear"]


class ConversationItemCreate(_Event):
    type: Literal["conversation.item.create"]
    item: Item
    previous_item_id: NotRequired[Id | None]


class ConversationItemRetrieve(_Event):
    type: Literal["conversation.item.retrieve"]
    item_id: Id


class ConversationItemTruncate(_Event):
    type: Literal["conversation.item.truncate"]
    item_id: Id
    content_index: int
    audio_end_ms: int


class ConversationItemDelete(_Event):
    type: Literal["conversation.item.delete"]
    item_id: Id


class ResponseCreate(_Event):
    type: Literal["response.create"]
    response: NotRequired[ResponseOverrides | None]


class ResponseCancel(_Event):
    type: Literal["response.cancel"]
    response_id: NotRequired[Id | None]


class OutputAudioBufferClear(_Event):
    type: Literal["output_audio_buffer.clear"]


CLIENT_EVENTS = {shape.__annotations__["type"].__args__[0]: shape for shape in (
    SessionUpdate, InputAudioBufferAppend, InputAudioBufferCommit, InputAudioBufferClear,
    ConversationItemCreate, ConversationItemRetrieve, ConversationItemTruncate, ConversationItemDelete,
    ResponseCreate, ResponseCancel, OutputAudioBufferClear)}
_ADAPTERS = {name: TypeAdapter(shape) for name, shape in CLIENT_EVENTS.items()}
_ITEM = TypeAdapter(Item)

_CODES = {"missing": "missing_required_parameter", "extra_forbidden": "unknown_parameter",
          "literal_error": "invalid_value", "union_tag_invalid": "invalid_value", "string_too_long": "invalid_value",
          "string_too_short": "invalid_value"}


def check(event):
    """Raise ProtocolError unless ``event`` (a dict whose ``type`` is a client event type) has
    the fields of its type, well typed."""
    try:
        _ADAPTERS[event["type"]].validate_python(event)
    except ValidationError as exc:
        raise _protocol_error(exc, event) from None


def check_item(item, param="item"):
    """Raise ProtocolError unless ``item`` is a conversation item a client may send."""
    try:
        _ITEM.validate_python(item)
    except ValidationError as exc:
        raise _protocol_error(exc, item, param) from None


def _protocol_error(exc, value, root=""):
    """The first error of a pydantic ValidationError as a ProtocolError naming its field."""
    error = exc.errors(include_url=False)[0]
    kind = error["type"]
    param = _param(error["loc"], value, root, kind == "missing")
    code = _CODES.get(kind, "invalid_type")
    if code == "missing_required_parameter":
        message = f"Missing required parameter: '{param}'."
    elif code == "unknown_parameter":
        message = f"Unknown parameter: '{param}'."
    elif kind == "union_tag_invalid":  # an item or content part type we do not know
        param = f"{param}.type" if param else "type"
        message = f"Invalid value for '{param}': {error['ctx']['tag']!r}; expected one of {error['ctx']['expected_tags']}."
    elif kind == "union_tag_not_found":
        message = f"Invalid type for '{param}': an object with a 'type' is expected."
    else:
        message = f"Invalid {'type' if code == 'invalid_type' else 'value'} for '{param}': {error['msg']}."
    return ProtocolError(code, message, param=param or None, event_id=_event_id(value))


def _param(loc, value, root, missing):
    """The dotted path (``item.content[0].text``) of a pydantic error location in ``value``.
    Locations also name union members (tags), which are not in the value: those are skipped."""
    path = root
    for step in loc:
        if isinstance(step, int) and isinstance(value, list) and 0 <= step < len(value):
            path, value = f"{path}[{step}]", value[step]
        elif isinstance(step, str) and isinstance(value, dict) and step in value:
            path, value = f"{path}.{step}" if path else step, value[step]
        elif missing and step is loc[-1]:  # the field that is not there
            return f"{path}.{step}" if path else step
    return path


def _event_id(value):
    event_id = value.get("event_id") if isinstance(value, dict) else None
    return event_id if isinstance(event_id, str) else None

"""What this year's SDKs send is understood: every field the pinned ``openai`` SDK's types can put
in a session or a response is accepted (or refused with the reason docs/PROTOCOL.md gives), and
docs/PROTOCOL.md says of each whether it is acted on or only stored. Bumping the SDK pin and
running this names every new field. The behaviour of the fields acted on is tested below on the
scripted backend, and with the real models in ``test_e2e.py``."""

import base64
import copy
import functools
import re
import types
import typing

import pytest
from openai.types.realtime import RealtimeResponseCreateParamsParam, RealtimeSessionCreateRequestParam
from typing_extensions import is_typeddict

from pool.backends.scripted import SCRIPT
from realtime import session_config as sc
from realtime.errors import ProtocolError
from realtime.session.responses import response_params

from .helpers import PIXEL, PROJECT_DIR, image_message, user_text

# Where the walk stops: a tool's fields and a response's input items are checked by their own
# rules (function tools; realtime.schema's items), not field by field here.
OPAQUE = ("session.tools[]", "response.tools[]", "response.input[]")


def _unwrap(hint):
    while typing.get_origin(hint) in (typing.Required, typing.NotRequired, typing.Annotated):
        hint = typing.get_args(hint)[0]
    return hint


def fields(typed_dict, path):
    """``{dotted path: type hint}`` of every field the SDK's ``typed_dict`` can hold, nested."""
    found = {}
    for name, hint in typing.get_type_hints(typed_dict, include_extras=True).items():
        child = f"{path}.{name}"
        found[child] = _unwrap(hint)
        for member in _members(found[child]):
            if is_typeddict(member):
                found.update(fields(member, child))
            elif typing.get_origin(member) in (list, typing.List) or _is_sequence(member):
                (item,) = typing.get_args(member) or (None,)
                if is_typeddict(_unwrap(item)) and f"{child}[]" not in OPAQUE:
                    found.update(fields(_unwrap(item), f"{child}[]"))
    return found


def _members(hint):
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return [_unwrap(a) for a in typing.get_args(hint)]
    return [hint]


def _required(typed_dict):
    """The ``Required`` fields of a TypedDict (its ``__required_keys__`` miss them when the SDK's
    module postpones its annotations)."""
    hints = typing.get_type_hints(typed_dict, include_extras=True)
    return {key: _unwrap(hint) for key, hint in hints.items()
            if key in typed_dict.__required_keys__ or typing.get_origin(hint) is typing.Required}


def _is_sequence(hint):
    return getattr(typing.get_origin(hint), "__name__", "") in ("Iterable", "Sequence", "SequenceNotStr")


def samples(hint):
    """Values of ``hint`` a client could send: each literal, each union member's sample."""
    values = []
    for member in _members(hint):
        if typing.get_origin(member) is typing.Literal:
            values.extend(typing.get_args(member))
        elif member is bool:
            values.append(True)
        elif member is str:
            values.append("alloy")
        elif member in (int, float):
            values.append(None)  # the session's own value: ranges are the server's rules
        elif is_typeddict(member):
            values.append({key: next(iter(samples(hint)), None) for key, hint in _required(member).items()})
        elif typing.get_origin(member) in (list, typing.List, dict, typing.Dict) or _is_sequence(member):
            values.append([] if typing.get_origin(member) is not dict else {})
    return values


SESSION_FIELDS = fields(RealtimeSessionCreateRequestParam, "session")
RESPONSE_FIELDS = fields(RealtimeResponseCreateParamsParam, "response")


def _nest(path, value):
    """``{"audio": {"input": {...: value}}}`` for ``session.audio.input....``."""
    update = value
    for key in reversed(path.split(".")[1:]):
        update = {key: update}
    return update


def _get(config, path):
    node = config
    for key in path.split(".")[1:]:
        node = node.get(key) if isinstance(node, dict) else None
    return node


@functools.cache
def documented():
    """``{field path: what docs/PROTOCOL.md says of it}`` from its table of SDK fields."""
    text = (PROJECT_DIR / "docs" / "PROTOCOL.md").read_text()
    table = text[text.index("## Every field of the SDK"):]
    return dict(re.findall(r"^\| `([a-z_.\[\]]+)` \| (acted on|stored, not acted on|refused)", table, re.M))


@pytest.mark.parametrize("path", sorted(SESSION_FIELDS))
def test_every_session_field_the_sdk_can_send_is_accepted_or_refused_as_documented(path):
    said = documented().get(path)
    assert said is not None, f"docs/PROTOCOL.md does not say what happens to {path}"
    current = sc.default_session("sess_1", "m", "i", "alloy")
    for value in samples(SESSION_FIELDS[path]):
        if value is None:
            value = _get(current, path)
            if value is None:
                continue
        update = _nest(path, copy.deepcopy(value))
        if path.endswith("turn_detection.eagerness"):  # a field of semantic_vad only
            update["audio"]["input"]["turn_detection"]["type"] = "semantic_vad"
        try:
            sc.apply_update(current, update)
        except ProtocolError as error:
            # Never "no such field" or "not that type" for what the SDK can send, unless the docs
            # say why it is refused; a value the server cannot use is an invalid_value.
            assert said == "refused" or error.code == "invalid_value", (path, value, error.code, error.message)
        else:
            assert said != "refused", (path, value)


@pytest.mark.parametrize("path", sorted(RESPONSE_FIELDS))
def test_every_response_field_the_sdk_can_send_is_documented(path):
    assert documented().get(path) is not None, f"docs/PROTOCOL.md does not say what happens to {path}"


def test_the_sdk_walk_finds_this_years_fields():
    assert {"session.reasoning.effort", "session.parallel_tool_calls", "session.audio.output.voice.id",
            "session.audio.input.transcription.prompt", "response.reasoning.effort"} <= set(SESSION_FIELDS) | set(
        RESPONSE_FIELDS)


def test_a_turn_detection_model_version_is_kept_though_the_pinned_sdk_has_none_yet():
    session = sc.apply_update(sc.default_session("sess_1", "m", "i", "alloy"), {
        "audio": {"input": {"turn_detection": {"type": "server_vad", "model_version": "v2"}}}})
    assert session["audio"]["input"]["turn_detection"]["model_version"] == "v2"
    with pytest.raises(ProtocolError) as refused:
        sc.apply_update(session, {"audio": {"input": {"turn_detection": {"model_versoin": "v2"}}}})
    assert refused.value.code == "unknown_parameter"


def test_a_typo_is_still_an_unknown_parameter():
    with pytest.raises(ProtocolError) as refused:
        sc.apply_update(sc.default_session("sess_1", "m", "i", "alloy"), {"reasoning_effort": "low"})
    assert refused.value.code == "unknown_parameter" and refused.value.param == "session.reasoning_effort"


def test_reasoning_voice_ids_and_parallel_tool_calls_are_kept_and_checked():
    session = sc.apply_update(sc.default_session("sess_1", "m", "i", "alloy"), {
        "reasoning": {"effort": "low"}, "parallel_tool_calls": False, "audio": {"output": {"voice": {"id": "voice_1"}}}})
    assert session["reasoning"] == {"effort": "low"} and session["parallel_tool_calls"] is False
    assert session["audio"]["output"]["voice"] == {"id": "voice_1"} and sc.voice_name({"id": "voice_1"}) == "voice_1"
    for bad, param in (({"reasoning": {"effort": "huge"}}, "session.reasoning.effort"),
                       ({"parallel_tool_calls": "no"}, "session.parallel_tool_calls"),
                       ({"audio": {"output": {"voice": {"id": ""}}}}, "session.audio.output.voice")):
        with pytest.raises(ProtocolError) as refused:
            sc.apply_update(session, bad)
        assert refused.value.param == param
    params = response_params(session, {"reasoning": {"effort": "high"}, "audio": {"output": {"voice": "ash"}}},
                             None, 100)
    assert (params["reasoning_effort"], params["voice"], params["parallel_tool_calls"]) == ("high", "ash", False)
    assert response_params(session, {}, None, 100)["voice"] == "voice_1"


def test_the_transcription_prompt_and_keywords_make_the_stt_prompt():
    assert sc.stt_prompt({"prompt": "The ComfyUI folder.", "keywords": ["Kokoro", "Silero"]}) == (
        "The ComfyUI folder. Kokoro, Silero")
    assert sc.stt_prompt({"model": "whisper-1"}) is None and sc.stt_prompt(None) is None


@pytest.mark.usefixtures("scripted_pool")
async def test_a_sessions_transcription_prompt_reaches_the_stt_and_peeks_keep_their_own(connect):
    from .helpers import speech_appends

    client = await connect()
    await client.until("session.created")
    await client.send({"type": "session.update", "session": {"audio": {"input": {"transcription": {
        "model": "whisper-1", "prompt": "The ComfyUI folder."}}}}})
    await client.until("session.updated")
    for append in speech_appends(silence_s=1.0):
        await client.send(append)
    await client.until("conversation.item.input_audio_transcription.completed", timeout=30)
    assert SCRIPT.stt_prompts and set(SCRIPT.stt_prompts) == {"The ComfyUI folder."}
    await client.ws.disconnect()


@pytest.mark.usefixtures("scripted_pool")
async def test_response_create_voice_and_format_apply_to_that_response_only(connect):
    client = await connect()
    await client.until("session.created")
    await client.send(user_text("Hello."))
    await client.send({"type": "response.create", "response": {"audio": {"output": {
        "voice": "ash", "format": {"type": "audio/pcmu"}}}}})
    first = await client.until("response.done")
    voices_first, SCRIPT.tts_voices = list(SCRIPT.tts_voices), []
    await client.send({"type": "response.create"})
    second = await client.until("response.done")

    def delta_bytes(response):
        return [len(base64.b64decode(e["delta"])) for e in client.received
                if e["type"] == "response.output_audio.delta" and e["response_id"] == response["response"]["id"]]

    assert set(voices_first) == {"ash"} and set(SCRIPT.tts_voices) == {"alloy"}  # the session's again
    assert max(delta_bytes(first)) <= 8000 * 2 // 10  # G.711 at 8 kHz: 1 byte a sample, 200 ms a delta
    assert max(delta_bytes(second)) > 8000 * 2 // 10  # the session's PCM16 at 24 kHz again
    await client.ws.disconnect()


async def test_an_image_is_kept_and_a_text_only_model_answers_without_it_with_one_notice(recorded_pool, connect):
    from pool.models import ConversationItem

    client = await connect()
    await client.until("session.created")
    await client.send(image_message())
    added = await client.until("conversation.item.added")
    assert added["item"]["content"][1] == {"type": "input_image", "image_url": PIXEL, "detail": "low"}
    for _ in range(2):
        await client.send({"type": "response.create"})
        assert (await client.until("response.done"))["response"]["status"] == "completed"
    assert "error" not in client.types()
    user = [m for m in SCRIPT.requests[-1].messages if m["role"] == "user"]
    assert user == [{"role": "user", "content": "What is in this picture?"}]  # the scripted LLM reads no images
    await client.ws.disconnect()
    assert recorded_pool.records.flush()
    kinds = [i.kind async for i in ConversationItem.objects.order_by("at_ms", "id")]
    assert kinds.count("notice") == 1
    kept = await ConversationItem.objects.aget(kind="message", role="user")
    assert kept.data["content"][1]["image_url"] == PIXEL


@pytest.mark.usefixtures("scripted_pool")
@pytest.mark.parametrize("url, role, hosts, refused", [
    ("http://images.example/cat.png", "user", [], "item.content[1].image_url"),
    ("http://127.0.0.1:9/cat.png", "user", ["127.0.0.1"], None),
    ("file:///etc/passwd", "user", ["127.0.0.1"], "item.content[1].image_url"),
    ("data:text/html;base64,PGI+", "user", [], "item.content[1].image_url"),
    (PIXEL, "assistant", [], "item.content[1].type"),
])
async def test_image_urls_only_of_allowed_hosts_and_only_from_the_user(connect, settings, url, role, hosts, refused):
    settings.S2S = {**settings.S2S, "IMAGE_URL_HOSTS": hosts}
    client = await connect()
    await client.until("session.created")
    await client.send(image_message(url, role))
    event = await client.until("error" if refused else "conversation.item.added")
    if refused:
        assert (event["error"]["code"], event["error"]["param"]) == ("invalid_value", refused)
    await client.ws.disconnect()


def test_an_image_goes_to_a_model_that_reads_images_and_counts_a_fixed_share_of_the_budget():
    from realtime.session.conversation import IMAGE_COST_CHARS, Conversation

    conversation = Conversation()
    item = {"id": "item_1", "type": "message", "role": "user", "status": "completed",
            "content": image_message()["item"]["content"]}
    conversation.insert(item)
    [_system, message] = conversation.llm_messages("i", None, "auto", 10_000, with_images=True)
    assert message["content"] == [{"type": "text", "text": "What is in this picture?"},
                                  {"type": "image_url", "image_url": {"url": PIXEL, "detail": "low"}}]
    assert conversation.llm_messages("i", None, "auto", 10_000)[1]["content"] == "What is in this picture?"
    big = {**item, "id": "item_2", "content": [{"type": "input_image", "image_url": PIXEL + "A" * 100_000}]}
    conversation.insert(big)
    # A 100 kB image counts IMAGE_COST_CHARS: the earlier message still fits a 3000-character budget.
    assert len(conversation.llm_messages("i", None, "auto", 2 * IMAGE_COST_CHARS + 500, with_images=True)) == 3


@pytest.mark.parametrize("update, param, code", [
    ({"audio": {"input": {"transcription": {"foo": 1}}}}, "session.audio.input.transcription.foo", "unknown_parameter"),
    ({"audio": {"input": {"transcription": {"model": 5}}}}, "session.audio.input.transcription.model", "invalid_type"),
    ({"audio": {"input": {"noise_reduction": {"type": "near_field", "foo": 1}}}},
     "session.audio.input.noise_reduction.foo", "unknown_parameter"),
    ({"audio": {"input": {"turn_detection": {"type": "server_vad", "model_version": {"a": 1}}}}},
     "session.audio.input.turn_detection.model_version", "invalid_type"),
    ({"audio": {"input": {"turn_detection": {"type": "server_vad", "model_version": "v" * 100}}}},
     "session.audio.input.turn_detection.model_version", "invalid_value"),
])
def test_nested_session_objects_are_held_to_their_sdk_fields(update, param, code):
    with pytest.raises(ProtocolError) as refused:
        sc.apply_update(sc.default_session("sess_1", "m", "i", "alloy"), update)
    assert (refused.value.code, refused.value.param) == (code, param)
    off = sc.apply_update(sc.default_session("sess_1", "m", "i", "alloy"),
                          {"audio": {"input": {"transcription": None, "noise_reduction": None}}})
    assert off["audio"]["input"]["transcription"] is None  # null still turns them off


@pytest.mark.parametrize("audio, param, code", [
    ({"output": "x"}, "response.audio.output", "invalid_type"),
    ({"output": [["voice", "ash"]]}, "response.audio.output", "invalid_type"),
    ({"output": {"speed": 2}}, "response.audio.output.speed", "unknown_parameter"),
    ({"input": {}}, "response.audio.input", "unknown_parameter"),
])
def test_a_responses_audio_is_its_voice_and_format_only(audio, param, code):
    session = sc.default_session("sess_1", "m", "i", "alloy")
    with pytest.raises(ProtocolError) as refused:
        response_params(session, {"audio": audio}, None, 100)
    assert (refused.value.code, refused.value.param) == (code, param)

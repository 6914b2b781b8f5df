"""No byte a client sends takes a session down: every bad input gets an ``error`` event with a
code, and a valid turn on the same socket still works afterwards."""

import asyncio
import base64
import json

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from openai.types.realtime import RealtimeServerEvent
from pydantic import TypeAdapter

from pool.backends.scripted import SCRIPT
from pool.conf import get_config
from pool.testing import wait_until
from realtime.errors import ProtocolError
from realtime.events import CLIENT_EVENT_TYPES, parse_client_frame
from realtime.schema import check_item
from realtime.session import RealtimeSession
from realtime.session.conversation import public
from realtime.session_config import session_defaults

pytestmark = pytest.mark.usefixtures("scripted_pool")

HOSTILE = [
    ("{not json", "invalid_json"),
    ("[" * 100_000, "invalid_json"),  # deeper than the JSON decoder goes
    ('{"type": "session.update", "session": {"tools": [{"type": "function", "name": "f", "parameters": '
     + '{"a": ' * 70 + "1" + "}" * 70 + "}]}}", "invalid_json"),  # deeper than MAX_DEPTH
    ('{"type": "session.update", "session": {"audio": {"input": {"turn_detection": '
     '{"type": "semantic_vad", "eagerness": []}}}}}', "invalid_value"),
    ("[1, 2, 3]", "invalid_event"),
    ('"just a string"', "invalid_event"),
    ("12345", "invalid_event"),
    ("null", "invalid_event"),
    ('{"event_id": "x"}', "missing_required_parameter"),
    ('{"type": "session.destroy"}', "unknown_event_type"),
    ('{"type": ["session.update"]}', "invalid_type"),
    ('{"type": "input_audio_buffer.append"}', "missing_required_parameter"),
    ('{"type": "input_audio_buffer.append", "audio": 5}', "invalid_type"),
    ('{"type": "input_audio_buffer.append", "audio": ""}', "invalid_value"),
    ('{"type": "input_audio_buffer.append", "audio": "@@not base64@@"}', "invalid_base64"),
    ('{"type": "input_audio_buffer.append", "audio": "AAA"}', "invalid_base64"),
    ('{"type": "input_audio_buffer.append", "audio": "AAAA"}', "invalid_audio"),
    ('{"type": "input_audio_buffer.commit", "colour": "red"}', "unknown_parameter"),
    ('{"type": "session.update", "session": "all of it"}', "invalid_type"),
    ('{"type": "session.update", "session": {"audio": {"input": {"turn_detection": {"threshold": 42}}}}}',
     "invalid_value"),
    ('{"type": "session.update", "session": {"audio": {"input": {"turn_detection": '
     '{"silence_duration_ms": -100}}}}}', "invalid_value"),
    ('{"type": "session.update", "session": {"instructions": "' + "x" * 40_000 + '"}}', "invalid_value"),
    ('{"type": "session.update", "session": {"output_modalities": "audio"}}', "invalid_value"),
    ('{"type": "conversation.item.create"}', "missing_required_parameter"),
    ('{"type": "conversation.item.create", "previous_item_id": "item_nope", "item": {"type": "message", '
     '"role": "user", "content": [{"type": "input_text", "text": "hi"}]}}', "item_not_found"),
    ('{"type": "conversation.item.create", "item": {"type": "message", "role": "robot", "content": []}}',
     "invalid_value"),
    ('{"type": "conversation.item.retrieve", "item_id": "item_nope"}', "item_not_found"),
    ('{"type": "conversation.item.delete", "item_id": 7}', "invalid_type"),
    ('{"type": "conversation.item.truncate", "item_id": "item_nope", "content_index": 0, "audio_end_ms": 5}',
     "item_not_found"),
    ('{"type": "response.create", "response": {"output_modalities": ["smell"]}}', "invalid_value"),
    ('{"type": "response.create", "response": {"max_output_tokens": -1}}', "invalid_value"),
    ('{"type": "response.create", "response": {"flavour": "mint"}}', "unknown_parameter"),
    ('{"type": "response.cancel"}', "response_cancel_not_active"),
    ('{"type": "output_audio_buffer.clear"}', "unsupported_transport"),
    # Type confusion inside items and references (each once took the consumer down with a
    # TypeError: close 1011, and the unit stayed active until the process restarted).
    ('{"type": "conversation.item.create", "item": {"id": [0], "role": "user", "content": []}}', "invalid_type"),
    ('{"type": "conversation.item.create", "item": {"id": {"a": 1}, "role": "user", "content": []}}',
     "invalid_type"),
    ('{"type": "conversation.item.create", "item": {"role": "user", "content": [{"type": "input_text", '
     '"text": 5}]}}', "invalid_type"),
    ('{"type": "response.create", "response": {"input": [{"type": "item_reference", "id": ["x"]}]}}',
     "invalid_type"),
    ('{"type": "conversation.item.create", "item": {"role": "assistant", "content": [{"type": "output_audio", '
     '"transcript": 12}]}}', "invalid_type"),
    ('{"type": "conversation.item.create", "item": {"role": "user", "content": [], "_audio_ms": "x"}}',
     "unknown_parameter"),
    # Values no column could hold: refused at the edge, naming the field.
    ('{"type": "conversation.item.create", "item": {"id": "' + "i" * 33 + '", "role": "user", "content": []}}',
     "invalid_value"),
    ('{"type": "conversation.item.create", "item": {"status": "' + "s" * 17 + '", "role": "user", "content": []}}',
     "invalid_value"),
    ('{"type": "conversation.item.delete", "item_id": "\\ud800"}', "invalid_value"),
    ('{"type": "conversation.item.create", "item": {"role": "user", "content": [{"type": "input_text", '
     '"text": "a\\u0000b"}]}}', "invalid_value"),
    ('{"type": "session.update", "session": {"instructions": "\\udfff"}}', "invalid_value"),
]


async def assert_still_works(client):
    await client.send({"type": "response.create", "response": {"output_modalities": ["text"]}})
    done = await client.until("response.done")
    assert done["response"]["status"] == "completed"


@pytest.mark.parametrize("frame, code", HOSTILE, ids=[code + str(i) for i, (_, code) in enumerate(HOSTILE)])
async def test_hostile_frame_gets_an_error_and_the_session_goes_on(connect, frame, code):
    client = await connect()
    await client.until("session.created")
    await client.ws.send_to(text_data=frame.replace('"x"}', '"evt_1"}'))
    error = await client.until("error")
    assert error["error"]["code"] == code
    assert isinstance(error["error"]["message"], str) and error["error"]["message"]
    await assert_still_works(client)
    await client.ws.disconnect()


async def test_binary_frame_and_oversize_message(connect, settings):
    settings.S2S = {**settings.S2S, "MAX_MESSAGE_BYTES": 1000}
    client = await connect()
    await client.until("session.created")
    await client.ws.send_to(bytes_data=b"\x00" * 10)
    assert (await client.until("error"))["error"]["code"] == "invalid_frame"
    await client.send({"type": "input_audio_buffer.append", "audio": "A" * 2000})
    assert (await client.until("error"))["error"]["code"] == "message_too_large"
    await assert_still_works(client)
    await client.ws.disconnect()


async def test_error_echoes_the_client_event_id(connect):
    client = await connect()
    await client.until("session.created")
    await client.send({"type": "response.cancel", "event_id": "evt_42"})
    error = await client.until("error")
    assert error["error"]["event_id"] == "evt_42" and error["event_id"] != "evt_42"
    await client.ws.disconnect()


async def test_ten_thousand_tiny_appends_then_a_turn(connect):
    client = await connect()
    await client.until("session.created")
    await client.send({"type": "session.update", "session": {"audio": {"input": {"turn_detection": None}}}})
    await client.until("session.updated")
    tiny = base64.b64encode(b"\x00\x00").decode()
    for _ in range(10_000):
        await client.send({"type": "input_audio_buffer.append", "audio": tiny})
    await client.send({"type": "input_audio_buffer.commit"})  # 10,000 samples = 417 ms
    committed = await client.until("input_audio_buffer.committed", timeout=30)
    assert "error" not in client.types()
    await client.until("conversation.item.input_audio_transcription.completed")
    await client.send({"type": "response.create"})
    assert (await client.until("response.done"))["response"]["status"] == "completed"
    assert committed["item_id"]
    await client.ws.disconnect()


async def test_truncate_beyond_the_audio_is_refused_and_within_it_trims(connect):
    client = await connect()
    await client.until("session.created")
    await client.send({"type": "response.create"})
    done = await client.until("response.done")
    item = done["response"]["output"][0]
    await client.send({"type": "conversation.item.truncate", "item_id": item["id"], "content_index": 0,
                       "audio_end_ms": 10_000_000})
    error = await client.until("error")
    assert error["error"]["code"] == "invalid_value" and error["error"]["param"] == "audio_end_ms"
    await client.send({"type": "conversation.item.truncate", "item_id": item["id"], "content_index": 0,
                       "audio_end_ms": 100})
    truncated = await client.until("conversation.item.truncated")
    assert truncated["audio_end_ms"] == 100
    await client.send({"type": "conversation.item.retrieve", "item_id": item["id"]})
    kept = (await client.until("conversation.item.retrieved"))["item"]["content"][0]["transcript"]
    assert len(kept) < len(SCRIPT.reply)
    await client.ws.disconnect()


# --- fuzzing the protocol layer --------------------------------------------------------------

class RecordingPort:
    """Stands in for a unit: accepts every submission, computes nothing."""

    def __init__(self):
        self.submitted = []

    def submit(self, msg):
        self.submitted.append(msg)
        return True


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4),
    max_leaves=12,
)
field_names = st.sampled_from(["session", "audio", "item", "item_id", "previous_item_id", "content_index",
                               "audio_end_ms", "response", "response_id", "event_id", "extra"])
client_events = st.builds(
    lambda kind, fields: {"type": kind, **fields},
    st.sampled_from(sorted(CLIENT_EVENT_TYPES) + ["nope"]),
    st.dictionaries(field_names, json_values, max_size=3),
)


SERVER_EVENT = TypeAdapter(RealtimeServerEvent)


@hsettings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(client_events, min_size=1, max_size=12))
def test_fuzzed_client_events_never_escape_and_every_reply_is_a_server_event(events):
    sent = []
    session = RealtimeSession("sess_fuzz", RecordingPort(), sent.append,
                              session_defaults(get_config(), {"transcription_languages": ["en"], "voice_languages": ["en"],
                                                              "transcription_model": "whisper"}, "m"))
    session.start()
    for event in events:
        try:
            parsed = parse_client_frame(json.dumps(event))
        except ProtocolError as error:
            session.send_error(error)
            continue
        session.handle_client_event(parsed)
        # state stays consistent after every event: each item is filed under its own id, and is
        # one a client could send back (the shape realtime.schema accepts)
        for key, item in session.items.items():
            assert item["id"] == key
            check_item(public(item))
        assert session.response is None or session.response.id.startswith("resp_")
    for reply in sent:
        # The pinned SDK's own types are the oracle: every reply parses as the event it names.
        assert SERVER_EVENT.validate_python(reply).type == reply["type"]
        assert reply["event_id"].startswith("event_")
        json.dumps(reply)
        if reply["type"] == "error":
            assert isinstance(reply["error"]["code"], str) and isinstance(reply["error"]["message"], str)


# --- whatever a handler raises, the session goes on or the unit comes back ------------------

async def wait_idle(registry, timeout=5.0):
    """Until every unit of ``registry`` is idle again (drained)."""
    await asyncio.to_thread(wait_until, lambda: all(u["state"] == "idle" for u in registry.snapshot()),
                            timeout, "every unit idle", 0.02)


@pytest.mark.parametrize("frame, param", [
    ('{"type": "conversation.item.create", "item": {"id": [0], "role": "user", "content": []}}', "item.id"),
    ('{"type": "conversation.item.create", "item": {"role": "user", "content": [{"type": "input_text", '
     '"text": 5}]}}', "item.content[0].text"),
    ('{"type": "response.create", "response": {"input": [{"type": "item_reference", "id": ["x"]}]}}',
     "response.input[0].id"),
    ('{"type": "conversation.item.delete", "item_id": "\\\\ud800"}', "item_id"),
    ('{"type": "conversation.item.create", "item": {"type": "mcp_call"}}', "item.type"),
])
async def test_a_refused_field_is_named_in_param(connect, frame, param):
    client = await connect()
    await client.until("session.created")
    await client.ws.send_to(text_data=frame)
    assert (await client.until("error"))["error"]["param"] == param
    await client.ws.disconnect()


async def test_a_handler_that_raises_costs_its_event_not_the_session(connect, monkeypatch, caplog):
    def broken(self, event):
        raise RuntimeError("a bug")

    monkeypatch.setattr(RealtimeSession, "_on_conversation_item_retrieve", broken)
    client = await connect()
    await client.until("session.created")
    await client.send({"type": "conversation.item.retrieve", "item_id": "item_1", "event_id": "evt_7"})
    error = (await client.until("error"))["error"]
    assert (error["code"], error["type"], error["event_id"]) == ("server_error", "server_error", "evt_7")
    assert "a bug" in caplog.text  # the operator gets the traceback
    await assert_still_works(client)
    await client.ws.disconnect()


async def test_a_consumer_that_raises_still_releases_its_unit_and_ends_its_row(recorded_pool, connect, monkeypatch):
    """An exception nothing catches (here: in receive itself) ends the socket with 1011, and the
    finally of the consumer still releases the unit and writes the end of the session."""
    from pool.models import Session
    from realtime.consumers import RealtimeConsumer

    async def broken(self, text_data=None, bytes_data=None):
        raise RuntimeError("a bug in receive")

    client = await connect()
    created = await client.until("session.created")
    monkeypatch.setattr(RealtimeConsumer, "receive", broken)
    await client.send({"type": "input_audio_buffer.clear"})
    with pytest.raises(RuntimeError, match="a bug in receive"):
        await client.ws.wait(2)  # the application ended with the exception, as under Daphne
    await wait_idle(recorded_pool)
    recorded_pool.records.flush()
    row = await asyncio.to_thread(Session.objects.get, session_id=created["session"]["id"])
    assert (row.end_reason, row.close_code) == ("error", 1011) and row.ended_at is not None


# Valid client events, one per event type and per item shape and content part: the type
# confusion sweep below replaces each of their fields, one at a time, by values of other types.
_AUDIO = base64.b64encode(b"\x00\x00" * 2400).decode()
VALID_EVENTS = [
    {"type": "session.update", "session": {"type": "realtime", "instructions": "Be brief.", "tools": [
        {"type": "function", "name": "f", "description": "d", "parameters": {"type": "object"}}],
        "audio": {"output": {"voice": "coral", "speed": 1.0}}}},
    {"type": "input_audio_buffer.append", "audio": _AUDIO},
    {"type": "input_audio_buffer.commit"},
    {"type": "input_audio_buffer.clear"},
    {"type": "conversation.item.create", "previous_item_id": "root", "item": {
        "type": "message", "id": "item_a", "object": "realtime.item", "status": "completed", "role": "user",
        "content": [{"type": "input_text", "text": "hi"}, {"type": "input_audio", "audio": _AUDIO, "transcript": "hi"}]}},
    {"type": "conversation.item.create", "item": {"type": "message", "role": "assistant", "content": [
        {"type": "output_text", "text": "hello"}, {"type": "output_audio", "transcript": "hello"}]}},
    {"type": "conversation.item.create", "item": {"type": "message", "role": "system", "content": [
        {"type": "input_text", "text": "Be kind."}]}},
    {"type": "conversation.item.create", "item": {"type": "function_call", "call_id": "call_1", "name": "f",
                                                  "arguments": "{}"}},
    {"type": "conversation.item.create", "item": {"type": "function_call_output", "call_id": "call_1",
                                                  "output": "42"}},
    {"type": "conversation.item.retrieve", "item_id": "item_a"},
    {"type": "conversation.item.truncate", "item_id": "item_a", "content_index": 0, "audio_end_ms": 0},
    {"type": "conversation.item.delete", "item_id": "item_a"},
    {"type": "response.create", "response": {
        "instructions": "Be brief.", "output_modalities": ["text"], "conversation": "none", "max_output_tokens": 5,
        "metadata": {"k": "v"}, "tool_choice": "auto", "tools": [],
        "input": [{"type": "item_reference", "id": "item_a"},
                  {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}]}},
    {"type": "response.cancel", "response_id": "resp_1"},
    {"type": "output_audio_buffer.clear"},
]
OTHER_TYPES = [None, True, 0, -7, 1.5, "", "x", [], [1], {}, {"a": 1}]


def leaves(value, path=()):
    """Every (path, value) inside a JSON value, containers included, the value itself last."""
    if isinstance(value, dict):
        for key, child in value.items():
            yield from leaves(child, (*path, key))
    elif isinstance(value, list):
        for i, child in enumerate(value):
            yield from leaves(child, (*path, i))
    if path:
        yield path, value


def replaced(event, path, value):
    event = json.loads(json.dumps(event))
    target = event
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value
    return event


def confusions():
    for event in VALID_EVENTS:
        for path, original in leaves(event):
            if path == ("type",):
                continue
            for value in OTHER_TYPES:
                if type(value) is not type(original):
                    yield replaced(event, path, value)


async def test_type_confusion_in_every_field_is_an_error_and_every_unit_comes_back(connect, scripted_pool):
    """Every field of every client event and item shape, replaced by a value of another type:
    an ``error`` naming a code (never ``server_error``), or the event carried out; the socket
    stays open; and once the session ends, every unit of the pool is idle again."""
    cases = list(confusions())
    assert len(cases) > 500
    client = await connect()
    await client.until("session.created")
    for i, event in enumerate(cases):
        await client.send({**event, "event_id": f"evt_{i}"})
        # An event id that can never exist: its item_not_found marks the end of the replies.
        await client.send({"type": "conversation.item.retrieve", "item_id": "item_nowhere", "event_id": f"end_{i}"})
        while True:
            reply = await client.recv()
            if reply["type"] == "error":
                assert reply["error"]["code"] != "server_error", (event, reply)
                if reply["error"]["event_id"] == f"end_{i}":
                    break
    await client.send({"type": "session.update", "session": {"output_modalities": ["text"],
                                                             "audio": {"input": {"turn_detection": None}}}})
    await client.until("session.updated")
    await assert_still_works(client)
    await client.ws.disconnect()
    await wait_idle(scripted_pool)

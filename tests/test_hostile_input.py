"""No byte a client sends takes a session down: every bad input gets an ``error`` event with a
code, and a valid turn on the same socket still works afterwards."""

import base64
import json

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from openai.types.realtime import RealtimeServerEvent
from pydantic import TypeAdapter

from pool.backends.scripted import SCRIPT
from realtime.errors import ProtocolError
from realtime.events import CLIENT_EVENT_TYPES, parse_client_frame
from realtime.session import RealtimeSession

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
                              {"model": "m", "instructions": "i", "voice": "alloy", "max_output_tokens": 50,
                               "speaks": {"transcription_languages": ["en"], "voice_languages": ["en"]}})
    session.start()
    for event in events:
        try:
            parsed = parse_client_frame(json.dumps(event))
        except ProtocolError as error:
            session.send_error(error)
            continue
        session.handle_client_event(parsed)
        # state stays consistent after every event
        assert len(set(session.items)) == len(session.items)
        assert all(item["id"] == key and item["type"] in ("message", "function_call", "function_call_output")
                   for key, item in session.items.items())
        assert session.response is None or session.response.id.startswith("resp_")
    for reply in sent:
        # The pinned SDK's own types are the oracle: every reply parses as the event it names.
        assert SERVER_EVENT.validate_python(reply).type == reply["type"]
        assert reply["event_id"].startswith("event_")
        json.dumps(reply)
        if reply["type"] == "error":
            assert isinstance(reply["error"]["code"], str) and isinstance(reply["error"]["message"], str)

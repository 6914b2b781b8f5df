"""The protocol over a WebSocket, on the scripted test backend (real VAD, scripted STT/LLM/TTS)."""

import asyncio
import base64

import pytest

from pool.backends.scripted import SCRIPT
from pool.testing import wait_until

from .helpers import speech_appends, user_text

pytestmark = pytest.mark.usefixtures("scripted_pool")

VOICE_TURN = [
    "input_audio_buffer.speech_started",
    "input_audio_buffer.speech_stopped",
    "input_audio_buffer.committed",
    "conversation.item.added",
    "conversation.item.done",
    "conversation.item.input_audio_transcription.delta",
    "conversation.item.input_audio_transcription.completed",
    "response.created",
    "conversation.item.added",
    "response.output_item.added",
    "response.content_part.added",
    "response.output_audio_transcript.delta",
    "response.output_audio.delta",
]
VOICE_TURN_END = [
    "response.output_audio.done",
    "response.output_audio_transcript.done",
    "response.content_part.done",
    "response.output_item.done",
    "conversation.item.done",
    "response.done",
]


def collapse(types):
    """Event types with consecutive repeats of delta events folded into one."""
    out = []
    for t in types:
        if not (out and out[-1] == t and t.endswith(".delta")):
            out.append(t)
    return out


async def test_session_created_first_then_updated_with_the_whole_session(connect):
    client = await connect(subprotocols=["realtime"])
    assert client.subprotocol == "realtime"
    created = await client.recv()
    assert created["type"] == "session.created"
    assert created["session"]["id"].startswith("sess_")
    await client.send({"type": "session.update", "session": {"instructions": "Be terse.",
                       "audio": {"output": {"voice": "coral"}}}})
    updated = await client.until("session.updated")
    assert updated["session"]["instructions"] == "Be terse."
    assert updated["session"]["audio"]["output"]["voice"] == "coral"
    assert updated["session"]["audio"]["input"]["turn_detection"]["type"] == "server_vad"
    await client.ws.disconnect()


async def test_voice_turn_events_in_protocol_order(connect):
    SCRIPT.transcript = "ask not what your country can do for you"
    client = await connect()
    await client.until("session.created")
    await client.send({"type": "session.update",
                       "session": {"audio": {"input": {"turn_detection": {"silence_duration_ms": 1500}}}}})
    await client.until("session.updated")
    for append in speech_appends():
        await client.send(append)
    done = await client.until("response.done", timeout=30)
    types = collapse(client.types()[2:])
    start = types.index("input_audio_buffer.speech_started")
    assert types[start:start + len(VOICE_TURN)] == VOICE_TURN
    assert types[-len(VOICE_TURN_END):] == VOICE_TURN_END
    assert done["response"]["status"] == "completed"
    deltas = [e["delta"] for e in client.received if e["type"] == "response.output_audio_transcript.delta"]
    final = next(e for e in client.received if e["type"] == "response.output_audio_transcript.done")
    assert "".join(deltas) == final["transcript"] == SCRIPT.reply
    audio = b"".join(base64.b64decode(e["delta"]) for e in client.received
                     if e["type"] == "response.output_audio.delta")
    assert len(audio) % 2 == 0 and len(audio) > 0
    # the user's words reached the LLM, after the instructions
    messages = SCRIPT.requests[-1].messages
    assert messages[0]["role"] == "system"
    assert messages[-1] == {"role": "user", "content": "ask not what your country can do for you"}
    await client.ws.disconnect()


async def test_text_turn_with_text_output(connect):
    client = await connect()
    await client.until("session.created")
    await client.send(user_text("Hi there"))
    await client.until("conversation.item.done")
    await client.send({"type": "response.create", "response": {"output_modalities": ["text"]}})
    done = await client.until("response.done")
    types = client.types()
    assert "response.output_audio.delta" not in types
    text = "".join(e["delta"] for e in client.received if e["type"] == "response.output_text.delta")
    assert text == SCRIPT.reply
    assert done["response"]["output"][0]["content"][0] == {"type": "output_text", "text": SCRIPT.reply}
    await client.ws.disconnect()


async def test_second_response_create_is_one_error_and_the_next_one_works(connect):
    SCRIPT.token_delay = 0.05
    client = await connect()
    await client.until("session.created")
    await client.send({"type": "response.create"})
    await client.send({"type": "response.create", "event_id": "evt_second"})
    error = await client.until("error")
    assert error["error"]["code"] == "conversation_already_has_active_response"
    assert error["error"]["event_id"] == "evt_second"
    await client.until("response.done", timeout=20)
    await client.send({"type": "response.cancel"})
    error = await client.until("error")
    assert error["error"]["code"] == "response_cancel_not_active"
    SCRIPT.token_delay = 0.0
    await client.send({"type": "response.create"})
    done = await client.until("response.done")
    assert done["response"]["status"] == "completed"
    assert client.types().count("error") == 2
    await client.ws.disconnect()


async def test_response_cancel_ends_the_response_as_cancelled(connect):
    SCRIPT.token_delay = 0.05
    client = await connect()
    await client.until("session.created")
    await client.send({"type": "response.create"})
    created = await client.until("response.created")
    await client.send({"type": "response.cancel"})
    done = await client.until("response.done")
    assert done["response"]["id"] == created["response"]["id"]
    assert done["response"]["status"] == "cancelled"
    assert done["response"]["status_details"] == {"type": "cancelled", "reason": "client_cancelled"}
    await asyncio.sleep(0.5)  # nothing of the cancelled response may follow its response.done
    while not await client.ws.receive_nothing(0.2):
        event = await client.recv()
        assert event.get("response_id") != created["response"]["id"]
    await client.ws.disconnect()


async def test_full_pool_sends_session_limit_reached_then_closes_1008(connect, scripted_pool):
    first, second = await connect(), await connect()
    await first.until("session.created")
    await second.until("session.created")
    third = await connect()
    error = await third.recv()
    assert error["type"] == "error"
    assert error["error"]["code"] == "session_limit_reached"
    closed = await third.ws.receive_output(2)
    assert closed == {"type": "websocket.close", "code": 1008}
    await first.ws.disconnect()
    await second.ws.disconnect()


async def test_bad_input_gets_error_events_and_the_session_goes_on(connect):
    client = await connect()
    await client.until("session.created")
    await client.ws.send_to(text_data="{oops")
    await client.ws.send_to(bytes_data=b"\x00\x01")
    await client.send({"type": "input_audio_buffer.append", "audio": "@@@"})
    await client.send({"type": "input_audio_buffer.append", "audio": base64.b64encode(b"abc").decode()})
    await client.send({"type": "input_audio_buffer.commit"})
    await client.send({"type": "session.update", "session": {"audio": {"input": {"format": {
        "type": "audio/pcm", "rate": 16000}}}}})
    await client.send({"type": "output_audio_buffer.clear"})
    codes = [(await client.until("error"))["error"]["code"] for _ in range(7)]
    # The audio's errors come from the unit's VAD thread, the others from the event loop at once.
    assert sorted(codes) == sorted(["invalid_json", "invalid_frame", "invalid_base64", "invalid_audio",
                                    "input_audio_buffer_commit_empty", "invalid_value", "unsupported_transport"])
    await client.send({"type": "response.create"})
    assert (await client.until("response.done"))["response"]["status"] == "completed"
    await client.ws.disconnect()


async def test_released_unit_drains_back_to_idle(connect, scripted_pool):
    SCRIPT.token_delay = 0.05
    client = await connect()
    await client.until("session.created")
    await client.send({"type": "response.create"})
    await client.until("response.output_audio.delta")
    await client.ws.disconnect()
    await asyncio.to_thread(wait_until, lambda: all(u["state"] == "idle" for u in scripted_pool.snapshot()),
                            2, "both units idle")


async def test_wedged_unit_is_quarantined_and_never_claimed(connect, scripted_pool):
    SCRIPT.wedge.set()
    client = await connect()
    await client.until("session.created")
    await client.send({"type": "response.create"})
    await client.until("response.created")
    while not SCRIPT.requests:  # until the LLM stage is inside generate, wedged
        await asyncio.sleep(0.01)
    await client.ws.disconnect()
    await asyncio.to_thread(  # RELEASE_AFTER_SECONDS is 2.0 in the scripted pool
        wait_until, lambda: any(u["state"] == "quarantined" for u in scripted_pool.snapshot()), 5, "a quarantine")
    states = sorted(u["state"] for u in scripted_pool.snapshot())
    assert states == ["idle", "quarantined"]
    index = next(u["index"] for u in scripted_pool.snapshot() if u["state"] == "quarantined")
    SCRIPT.wedge.clear()
    assert scripted_pool.release_quarantined(index)
    assert [u["state"] for u in scripted_pool.snapshot()] == ["idle", "idle"]


async def test_create_response_false_commits_turns_without_answering(connect):
    client = await connect()
    await client.until("session.created")
    await client.send({"type": "session.update", "session": {"audio": {"input": {"turn_detection": {
        "silence_duration_ms": 1500, "create_response": False}}}}})
    await client.until("session.updated")
    for append in speech_appends():
        await client.send(append)
    await client.until("conversation.item.input_audio_transcription.completed", timeout=30)
    assert await client.ws.receive_nothing(1.0)
    assert "response.created" not in client.types()
    await client.send({"type": "response.create"})  # the client answers when it wants
    assert (await client.until("response.done"))["response"]["status"] == "completed"
    await client.ws.disconnect()


async def test_manual_turns_with_turn_detection_null(connect):
    client = await connect()
    await client.until("session.created")
    await client.send({"type": "session.update", "session": {"audio": {"input": {"turn_detection": None}}}})
    await client.until("session.updated")
    for append in speech_appends(silence_s=0.5):
        await client.send(append)
    assert await client.ws.receive_nothing(0.5)  # no VAD events without server VAD
    await client.send({"type": "input_audio_buffer.commit"})
    committed = await client.until("input_audio_buffer.committed")
    transcribed = await client.until("conversation.item.input_audio_transcription.completed")
    assert transcribed["item_id"] == committed["item_id"]
    assert "input_audio_buffer.speech_started" not in client.types()
    await client.send({"type": "response.create"})
    assert (await client.until("response.done"))["response"]["status"] == "completed"
    await client.ws.disconnect()


async def test_response_overrides_and_out_of_band_responses(connect):
    client = await connect()
    await client.until("session.created")
    await client.send(user_text("hello"))
    await client.until("conversation.item.done")
    await client.send({"type": "response.create", "response": {
        "conversation": "none", "instructions": "Classify the mood.", "max_output_tokens": 2,
        "output_modalities": ["text"], "metadata": {"purpose": "mood"}}})
    done = await client.until("response.done")
    request = SCRIPT.requests[-1]
    assert request.messages[0]["content"] == "Classify the mood." and request.max_output_tokens == 2
    assert done["response"]["metadata"] == {"purpose": "mood"} and done["response"]["conversation_id"] is None
    item = done["response"]["output"][0]
    assert item["content"][0]["text"] == " ".join(SCRIPT.reply.split(" ")[:2])
    added = [e for e in client.received if e["type"] == "conversation.item.added"]
    assert all(e["item"]["id"] != item["id"] for e in added)  # not in the conversation
    await client.send({"type": "conversation.item.retrieve", "item_id": item["id"]})
    assert (await client.until("error"))["error"]["code"] == "item_not_found"
    await client.ws.disconnect()


async def test_g711_in_and_out(connect):
    from realtime.audio import InputAudioDecoder, OutputAudioEncoder
    from realtime.client import load_audio

    from .helpers import JFK

    client = await connect()
    await client.until("session.created")
    await client.send({"type": "session.update", "session": {"audio": {
        "input": {"format": {"type": "audio/pcmu"}, "turn_detection": {"silence_duration_ms": 1500}},
        "output": {"format": {"type": "audio/pcma"}}}}})
    updated = (await client.until("session.updated"))["session"]
    assert updated["audio"]["input"]["format"] == {"type": "audio/pcmu"}
    import numpy as np

    speech = np.concatenate([load_audio(JFK), np.zeros(48_000, np.float32)])
    mulaw = OutputAudioEncoder({"type": "audio/pcmu"}).encode(speech, last=True)  # 8 kHz, 1 byte a sample
    for i in range(0, len(mulaw), 320):  # 40 ms
        await client.send({"type": "input_audio_buffer.append", "audio": base64.b64encode(mulaw[i:i + 320]).decode()})
    done = await client.until("response.done", timeout=30)
    assert done["response"]["status"] == "completed"
    alaw = b"".join(base64.b64decode(e["delta"]) for e in client.received if e["type"] == "response.output_audio.delta")
    seconds = len(SCRIPT.reply) * SCRIPT.seconds_per_char  # what the scripted TTS spoke, at 24 kHz
    assert abs(len(alaw) - seconds * 8000) < 0.05 * seconds * 8000  # A-law: 8,000 bytes a second
    tone = InputAudioDecoder({"type": "audio/pcma"}).decode(base64.b64encode(alaw).decode())[1600:]  # as A-law, 16 kHz
    peak_hz = np.argmax(np.abs(np.fft.rfft(tone))) * 16_000 / len(tone)
    assert abs(peak_hz - 220) < 5  # the scripted TTS's 220 Hz tone, intact through G.711
    await client.ws.disconnect()


async def test_a_long_conversation_sends_a_bounded_context_to_the_llm(connect, settings):
    settings.S2S = {**settings.S2S, "LLM_CONTEXT_CHARS": 600}
    client = await connect()
    await client.until("session.created")
    for i in range(40):
        await client.send({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": f"message {i} " * 5}]}})
    await client.send({"type": "response.create"})
    await client.until("response.done")
    sent = SCRIPT.requests[-1].messages
    assert sent[0]["role"] == "system" and sent[-1]["content"].startswith("message 39")
    assert 2 < len(sent) < 15 and sum(len(m["content"]) for m in sent[1:]) <= 600
    await client.send({"type": "session.update", "session": {"truncation": "disabled"}})
    await client.until("session.updated")
    await client.send({"type": "response.create"})
    await client.until("response.done")
    assert len(SCRIPT.requests[-1].messages) == 1 + 40 + 1  # every item, and the first reply
    await client.ws.disconnect()


async def test_a_language_the_models_cannot_hear_or_speak_is_refused_not_ignored(connect, scripted_pool):
    """The scripted STT transcribes en and de, its voices speak en: 'fr' and a Spanish Kokoro
    voice are errors that name the field, the session keeps its values and goes on."""
    client = await connect()
    await client.until("session.created")
    for update, param in [
        ({"audio": {"input": {"transcription": {"model": "whisper-1", "language": "fr"}}}},
         "session.audio.input.transcription.language"),
        ({"audio": {"output": {"voice": "ef_dora"}}}, "session.audio.output.voice"),
    ]:
        await client.send({"type": "session.update", "session": update})
        error = (await client.until("error"))["error"]
        assert (error["code"], error["param"]) == ("unsupported_language", param)
    await client.send({"type": "session.update", "session": {
        "audio": {"input": {"transcription": {"language": "de"}}, "output": {"voice": "bm_george"}}}})
    session = (await client.until("session.updated"))["session"]
    assert session["audio"]["input"]["transcription"]["language"] == "de"
    assert session["audio"]["output"]["voice"] == "bm_george"
    assert "session.updated" not in client.types()[:-1]  # the refused updates changed nothing
    await client.send({"type": "response.create"})
    assert (await client.until("response.done"))["response"]["status"] == "completed"
    await client.ws.disconnect()
    assert scripted_pool.speaks["transcription_languages"] == ["de", "en"]


async def test_the_language_of_a_turn_goes_with_its_transcript_and_reply_and_never_to_the_next_session(
        connect, scripted_pool):
    """The scripted STT "detects" SCRIPT.language when the session sets none. A turn's language
    is in its transcript event (our field) and told to the LLM; a language one session set is not
    the next session's, on the same unit."""
    SCRIPT.language = "de"
    client = await connect()
    await client.until("session.created")
    for append in speech_appends():
        await client.send(append)
    completed = await client.until("conversation.item.input_audio_transcription.completed", timeout=30)
    assert completed["language"] == "de"
    await client.until("response.done", timeout=30)
    assert SCRIPT.requests[-1].messages[0]["content"].endswith("The user speaks German. Answer in German.")
    await client.send({"type": "session.update", "session": {
        "audio": {"input": {"transcription": {"language": "de"}}}}})
    await client.until("session.updated")
    await client.ws.disconnect()
    await asyncio.to_thread(scripted_pool.wait_settled, 10)

    SCRIPT.language, SCRIPT.stt_languages[:] = "en", []
    client = await connect()  # the same unit: the other one was never used
    await client.until("session.created")
    for append in speech_appends():
        await client.send(append)
    completed = await client.until("conversation.item.input_audio_transcription.completed", timeout=30)
    assert completed["language"] == "en" and set(SCRIPT.stt_languages) == {None}
    await client.until("response.done", timeout=30)
    assert SCRIPT.requests[-1].messages[0]["content"].endswith("Answer in English.")
    await client.ws.disconnect()

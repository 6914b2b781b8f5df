"""End to end: a live Daphne server (``manage.py runpool``) with the real default models, driven by
the official ``openai`` SDK and a plain ``websockets`` client, with real speech."""

import asyncio
import base64
import contextlib
import json
import os
import time
import urllib.request

import numpy as np
import pytest
import websockets

from pool.testing import LiveServer, wait_until
from realtime.client import talk

from .helpers import HOTWORDS, JFK, JFK_WORDS, normalise

SESSION = {"type": "realtime", "audio": {"input": {"turn_detection": {"silence_duration_ms": 1500}}}}


async def _wait_idle(port, timeout=10):
    def idle():
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as reply:
            health = json.load(reply)
        return health["idle"] == health["pool_size"]

    await asyncio.to_thread(wait_until, idle, timeout, "the pool back to idle")


async def test_spoken_question_gets_a_spoken_answer_over_the_openai_sdk(server, whisper):
    received = []
    result = await talk(server.base_url, JFK, session=SESSION, on_event=received.append,
                        timeout_s=180)
    types = [e.type for e in received]

    def first(kind):
        assert kind in types, f"no {kind} in {types}"
        return types.index(kind)

    order = [first("session.created"), first("session.updated"),
             first("input_audio_buffer.speech_started"), first("input_audio_buffer.speech_stopped"),
             first("input_audio_buffer.committed"),
             first("conversation.item.input_audio_transcription.completed"),
             first("response.created"), first("response.output_audio.delta"),
             first("response.output_audio_transcript.done"), first("response.done")]
    assert order == sorted(order)
    assert JFK_WORDS in normalise(result.user_transcript)
    assert result.status == "completed"
    assert len(result.audio) >= 0.5 * 24_000 * 2  # at least 0.5 s of 24 kHz PCM16
    assert result.assistant_transcript.strip()
    done = next(e for e in received if e.type == "response.output_audio_transcript.done")
    assert done.transcript == result.assistant_transcript
    # The reply is speech: our own STT hears words in it.
    reply = np.frombuffer(result.audio, dtype="<i2").astype(np.float32) / 32768
    import soxr

    heard = whisper.transcribe(soxr.resample(reply, 24_000, 16_000), "en")
    assert len(normalise(heard).split()) >= 2, heard
    await _wait_idle(server.port)


async def test_pool_of_one_refuses_a_second_client_with_1008_then_serves_the_next(server):
    from openai import AsyncOpenAI

    await _wait_idle(server.port)
    client = AsyncOpenAI(api_key="local", websocket_base_url=server.base_url)
    async with client.realtime.connect(model="s2s-default") as holder:
        assert (await holder.recv()).type == "session.created"
        async with websockets.connect(f"{server.base_url}/realtime", subprotocols=["realtime"]) as ws:
            error = json.loads(await ws.recv())
            assert error["type"] == "error"
            assert error["error"]["code"] == "session_limit_reached"
            with pytest.raises(websockets.ConnectionClosed):
                await ws.recv()
            assert ws.close_code == 1008
    await _wait_idle(server.port)
    result = await talk(server.base_url, HOTWORDS, session=SESSION, timeout_s=180)
    assert result.status == "completed"
    assert "folder" in normalise(result.user_transcript)
    assert len(result.audio) > 0


async def test_settings_of_one_session_never_reach_the_next_on_the_unit(server):
    from openai import AsyncOpenAI

    await _wait_idle(server.port)
    client = AsyncOpenAI(api_key="local", websocket_base_url=server.base_url)
    async with client.realtime.connect(model="s2s-default") as conn:
        defaults = (await conn.recv()).session
        await conn.session.update(session={
            "type": "realtime", "instructions": "Answer only in French.",
            "audio": {"input": {"turn_detection": {"threshold": 0.95, "silence_duration_ms": 200}},
                      "output": {"voice": "echo"}}})
        updated = (await conn.recv()).session
        assert updated.audio.input.turn_detection.threshold == 0.95
    await _wait_idle(server.port)
    received = []
    result = await talk(server.base_url, JFK, session=SESSION, on_event=received.append, timeout_s=180)
    fresh = received[0].session
    assert fresh.instructions == defaults.instructions
    assert fresh.audio.input.turn_detection.threshold == 0.5
    assert fresh.audio.output.voice == defaults.audio.output.voice
    # One turn for the whole sentence: the 200 ms silence of the last session would have cut it.
    assert [e.type for e in received].count("input_audio_buffer.committed") == 1
    assert JFK_WORDS in normalise(result.user_transcript)
    assert result.status == "completed" and len(result.audio) > 0


async def test_a_language_whisper_tiny_en_cannot_hear_is_an_error_and_the_session_goes_on(server):
    from openai import AsyncOpenAI

    await _wait_idle(server.port)
    client = AsyncOpenAI(api_key="local", websocket_base_url=server.base_url)
    async with client.realtime.connect(model="s2s-default") as conn:
        await conn.recv()
        await conn.session.update(session={"type": "realtime", "audio": {"input": {
            "transcription": {"model": "whisper-1", "language": "de"}}}})
        error = await conn.recv()
        assert (error.type, error.error.code) == ("error", "unsupported_language")
        assert error.error.param == "session.audio.input.transcription.language"
        await conn.session.update(session={"type": "realtime", "audio": {"input": {
            "transcription": {"model": "whisper-1", "language": "en"}}}})
        updated = await conn.recv()
        assert updated.type == "session.updated"
        assert updated.session.audio.input.transcription.language == "en"


async def test_this_years_session_fields_through_the_sdk_and_a_prompt_that_spells_a_name(server):
    """What an app sets through today's SDK is accepted and acted on: reasoning and
    parallel_tool_calls (kept; local models ignore them), a custom voice id (the default voice
    speaks), and a transcription prompt, which makes Whisper spell "ComfyUI" as the prompt does
    ("comfy UI" without it)."""
    async def converse(transcription):
        events = []
        session = {"type": "realtime", "reasoning": {"effort": "low"}, "parallel_tool_calls": False,
                   "audio": {"input": {"transcription": transcription}, "output": {"voice": {"id": "voice_1234"}}}}
        await _wait_idle(server.port)
        result = await talk(server.base_url, HOTWORDS, session=session, timeout_s=180,
                            on_event=lambda e: events.append(e.to_dict()))
        return result, events

    plain, _ = await converse({"model": "whisper-1"})
    prompted, events = await converse({"model": "whisper-1", "prompt": "The ComfyUI folder."})
    updated = next(e["session"] for e in events if e["type"] == "session.updated")
    assert updated["reasoning"] == {"effort": "low"} and updated["parallel_tool_calls"] is False
    assert updated["audio"]["output"]["voice"] == {"id": "voice_1234"}
    assert [e for e in events if e["type"] == "error"] == []
    assert "ComfyUI" in prompted.user_transcript and "ComfyUI" not in plain.user_transcript
    assert prompted.status == "completed" and len(prompted.audio) > 0  # the default voice spoke


async def test_disconnect_mid_audio_and_reconnect_at_once_gets_a_clean_unit(server):
    from openai import AsyncOpenAI

    from realtime.client import load_audio, pcm16_chunks

    await _wait_idle(server.port)
    client = AsyncOpenAI(api_key="local", websocket_base_url=server.base_url)
    speech = np.concatenate([load_audio(HOTWORDS), np.zeros(48_000, np.float32)])
    async with client.realtime.connect(model="s2s-default") as conn:
        await conn.session.update(session=SESSION)
        for chunk in pcm16_chunks(speech):
            await conn.input_audio_buffer.append(audio=base64.b64encode(chunk).decode())
        async for event in conn:
            if event.type == "response.output_audio.delta":
                old_response = event.response_id
                break
    left = time.monotonic()
    async with client.realtime.connect(model="s2s-default") as conn:
        created = await conn.recv()
        assert created.type == "session.created"
        assert created.session.audio.input.transcription.model == "whisper-tiny.en"  # the model loaded
        assert time.monotonic() - left < 1.5  # the unit drained and was claimed again
        await conn.conversation.item.create(item={
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Say hello."}]})
        await conn.response.create()
        events = []
        async for event in conn:
            events.append(event)
            if event.type == "response.done":
                break
    carried = [e.type for e in events if old_response in json.dumps(e.to_dict())]
    assert carried == []
    assert events[-1].response.status == "completed"


@pytest.mark.live
async def test_a_stop_closes_sessions_with_1001_and_records_their_end(tmp_path):
    """LiveServer.stop: SIGTERM (the process drains; this session does not end by itself), then
    SIGINT, which stops it at once (tests/test_faults.py has the grace period itself)."""
    live = LiveServer(tmp_path, env={"S2S_BACKEND": "scripted"})
    async with websockets.connect(f"{live.base_url}/realtime") as ws:
        created = json.loads(await ws.recv())
        assert created["type"] == "session.created"
        code = await asyncio.to_thread(live.stop)
        with pytest.raises(websockets.ConnectionClosed):
            while True:
                await ws.recv()
        assert ws.close_code == 1001
    assert code == 0
    rows = live.query("select end_reason, close_code, ended_at is not null from pool_session")
    assert rows == [("shutdown", 1001, 1)]
    assert live.query("select state from pool_serverprocess") == [("stopped",)]


async def test_oversize_message_over_daphne_is_an_error_not_a_dead_socket(scripted_server):
    async with websockets.connect(f"{scripted_server.base_url}/realtime", max_size=None) as ws:
        assert json.loads(await ws.recv())["type"] == "session.created"
        huge = base64.b64encode(b"\x00" * (12 * 1024 * 1024)).decode()  # 16 MiB of base64
        await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": huge}))
        error = json.loads(await ws.recv())
        assert error["type"] == "error" and error["error"]["code"] == "message_too_large"
        await ws.send(json.dumps({"type": "response.create"}))
        while (event := json.loads(await ws.recv()))["type"] != "response.done":
            pass
        assert event["response"]["status"] == "completed"


def _frame(opcode, payload):
    """One masked client WebSocket frame (RFC 6455 5.2), payload under 126 bytes."""
    mask = os.urandom(4)
    return bytes([0x80 | opcode, 0x80 | len(payload)]) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


async def test_frames_after_the_close_frame_are_ignored(scripted_server):
    reader, writer = await asyncio.open_connection("127.0.0.1", scripted_server.port)
    key = base64.b64encode(os.urandom(16)).decode()
    writer.write((f"GET /v1/realtime HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
                  f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
    assert b"101" in await reader.readline()
    await asyncio.sleep(0.3)
    writer.write(_frame(0x8, (1000).to_bytes(2, "big")))  # close
    writer.write(_frame(0x1, b'{"type": "response.create"}'))  # after close: must be ignored
    writer.write(_frame(0x1, b"{broken"))
    rest = b""
    # The server answers the close and hangs up; a fast one does so before the frames after it
    # have been read, and the connection is then reset (what it sent before is lost to the
    # reader, but a server that ran response.create would have sent it before its close).
    with contextlib.suppress(ConnectionResetError):
        await writer.drain()
        rest = await asyncio.wait_for(reader.read(), 10)
    assert b"response.created" not in rest
    writer.close()
    await _wait_idle(scripted_server.port)
    async with websockets.connect(f"{scripted_server.base_url}/realtime") as ws:  # the server is fine
        assert json.loads(await ws.recv())["type"] == "session.created"


@pytest.mark.chromium
def test_admin_pool_page_in_headless_chromium_with_a_session_active(scripted_server):
    from .browser import admin_login, browser, screenshot_path

    async def hold_session(ready, release):
        async with websockets.connect(f"{scripted_server.base_url}/realtime") as ws:
            await ws.recv()
            ready.set()
            await asyncio.to_thread(release.wait, 60)

    import threading

    ready, release = threading.Event(), threading.Event()
    holder = threading.Thread(target=lambda: asyncio.run(hold_session(ready, release)))
    holder.start()
    try:
        assert ready.wait(30)
        time.sleep(0.5)  # the recorder writes the unit row
        with browser() as chromium:
            page = chromium.new_page(viewport={"width": 1400, "height": 700})
            admin_login(page, scripted_server, "/admin/pool/unit/")
            text = page.inner_text("#result_list")
            page.screenshot(path=str(screenshot_path("admin-pool-units.png")), full_page=True)
        assert "active" in text and "idle" in text
    finally:
        release.set()
        holder.join(30)


async def test_a_client_that_reconnects_right_after_closing_is_served_every_time(server):
    # The close handshake completes before the server application handles the disconnect, so
    # a reconnect can race it on a pool of one (found by bench/soak.py).
    await _wait_idle(server.port)
    silence = base64.b64encode(bytes(9600)).decode()
    for _ in range(50):
        async with websockets.connect(f"{server.base_url}/realtime") as ws:
            first = json.loads(await ws.recv())
            assert first["type"] == "session.created", first
            await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": silence}))

"""End to end: a live Daphne server (``manage.py runpool``) with the real default models, driven by
the official ``openai`` SDK and a plain ``websockets`` client, with real speech."""

import asyncio
import base64
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import websockets

from realtime.client import talk

from .helpers import HOTWORDS, JFK, JFK_WORDS, normalise

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[1]
SESSION = {"type": "realtime", "audio": {"input": {"turn_detection": {"silence_duration_ms": 1500}}}}


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """``runpool --pool-size 1`` in a subprocess; yields its base URL once /healthz answers."""
    port = _free_port()
    log_path = tmp_path_factory.mktemp("server") / "server.log"
    env = {**os.environ, "S2S_SQLITE_PATH": str(log_path.parent / "db.sqlite3")}
    subprocess.run([sys.executable, "manage.py", "migrate", "--noinput", "-v0"], cwd=ROOT, env=env, check=True)
    with open(log_path, "w") as log:
        process = subprocess.Popen([sys.executable, "manage.py", "runpool", "--port", str(port),
                                    "--pool-size", "1"], cwd=ROOT, env=env, stdout=log, stderr=log)
    deadline = time.monotonic() + 300
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as reply:
                if reply.status == 200:
                    break
        except OSError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"runpool did not start:\n{log_path.read_text()[-3000:]}")
        time.sleep(0.5)
    yield {"base_url": f"ws://127.0.0.1:{port}/v1", "port": port, "log": log_path}
    process.terminate()
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
        pytest.fail("runpool did not stop on SIGTERM within 30 s")


async def _wait_idle(port, timeout=10):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        health = await asyncio.to_thread(
            lambda: json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2)))
        if health["idle"] == health["pool_size"]:
            return
        await asyncio.sleep(0.1)
    raise AssertionError("the pool did not return to idle")


@pytest.fixture(scope="module")
def stt():
    from pool.backends.stt import WhisperSTT
    from pool.conf import get_config
    from pool.prepare import default_paths

    return WhisperSTT(default_paths(get_config()["MODEL_CACHE_DIR"])["stt"])


async def test_spoken_question_gets_a_spoken_answer_over_the_openai_sdk(server, stt):
    received = []
    result = await talk(server["base_url"], JFK, session=SESSION, on_event=received.append,
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

    heard = stt.transcribe(soxr.resample(reply, 24_000, 16_000), "en")
    assert len(normalise(heard).split()) >= 2, heard
    await _wait_idle(server["port"])


async def test_pool_of_one_refuses_a_second_client_with_1008_then_serves_the_next(server):
    from openai import AsyncOpenAI

    await _wait_idle(server["port"])
    client = AsyncOpenAI(api_key="local", websocket_base_url=server["base_url"])
    async with client.realtime.connect(model="s2s-default") as holder:
        assert (await holder.recv()).type == "session.created"
        async with websockets.connect(f"{server['base_url']}/realtime", subprotocols=["realtime"]) as ws:
            error = json.loads(await ws.recv())
            assert error["type"] == "error"
            assert error["error"]["code"] == "session_limit_reached"
            with pytest.raises(websockets.ConnectionClosed):
                await ws.recv()
            assert ws.close_code == 1008
    await _wait_idle(server["port"])
    result = await talk(server["base_url"], HOTWORDS, session=SESSION, timeout_s=180)
    assert result.status == "completed"
    assert "folder" in normalise(result.user_transcript)
    assert len(result.audio) > 0

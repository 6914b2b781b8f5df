"""The OpenAI-compatible endpoint path for real: llama.cpp's own server (the xllamacpp wheel)
serving the packaged GGUF over HTTP on loopback, in a process of its own, behind LLM_BASE_URL of
a live server with the real STT and TTS, driven by the openai SDK. And endpoints that fail: one
that answers 500, one that accepts the connection and never answers; the response fails with
``model_error`` and the session goes on."""

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from bench.common import llama_endpoint
from pool.testing import LiveServer

pytestmark = [pytest.mark.live, pytest.mark.models]

@pytest.fixture(scope="module")
def endpoint():
    """``http://127.0.0.1:PORT/v1`` of llama.cpp's server on the packaged SmolLM2 GGUF."""
    from pool.backends.cache import default_paths
    from pool.conf import get_config

    with llama_endpoint(default_paths(get_config()["MODEL_CACHE_DIR"])["llm"]) as url:
        yield url


def serve(tmp_path, base_url, **settings):
    env = {"S2S_JSON": json.dumps({"LLM_BASE_URL": base_url, "LLM_API_MODEL": "smollm2", **settings})}
    return LiveServer(tmp_path / "server", env=env)


async def ask(client, text, response=None):
    """A text question; the response's events until response.done."""
    async with client.realtime.connect(model="s2s") as connection:
        await connection.session.update(session={"type": "realtime", "instructions": "Answer in one short sentence."})
        await connection.conversation.item.create(item={"type": "message", "role": "user",
                                                       "content": [{"type": "input_text", "text": text}]})
        await connection.response.create(response=response or {})
        events = []
        async for event in connection:
            events.append(event)
            if event.type == "response.done":
                return events


@pytest.fixture
def client_of():
    from openai import AsyncOpenAI

    return lambda server: AsyncOpenAI(api_key="local", websocket_base_url=server.base_url)


async def test_a_spoken_reply_streams_from_a_real_endpoint(endpoint, tmp_path, client_of):
    with serve(tmp_path, endpoint) as server:
        events = await ask(client_of(server), "Which planet do we live on?")
    done = events[-1].response
    audio = [e for e in events if e.type == "response.output_audio.delta"]
    transcript = "".join(e.delta for e in events if e.type == "response.output_audio_transcript.delta")
    assert done.status == "completed" and len(audio) > 1 and transcript.strip()
    assert done.usage.output_tokens > 0  # the endpoint's own count


async def test_max_output_tokens_and_a_cancel_mid_reply_reach_the_endpoint(endpoint, tmp_path, client_of):
    with serve(tmp_path, endpoint) as server:
        short = await ask(client_of(server), "Tell me a long story about a dragon.", {"max_output_tokens": 5})
        assert short[-1].response.usage.output_tokens <= 5
        async with client_of(server).realtime.connect(model="s2s") as connection:
            await connection.conversation.item.create(item={"type": "message", "role": "user", "content": [
                {"type": "input_text", "text": "Tell me a long story about a dragon and a knight."}]})
            await connection.response.create()
            async for event in connection:
                if event.type == "response.output_audio.delta":
                    await connection.response.cancel()
                    break
            async for event in connection:
                if event.type == "response.done":
                    assert event.response.status == "cancelled"
                    break
            await connection.response.create()  # the session goes on: the next reply completes
            async for event in connection:
                if event.type == "response.done":
                    assert event.response.status == "completed"
                    break


async def test_tools_offered_to_a_model_whose_template_has_none_get_a_spoken_answer(endpoint, tmp_path, client_of):
    """llama.cpp's server calls tools only for a GGUF whose chat template has them (Qwen2.5, Llama
    3.x); SmolLM2-135M's has none, and the server answers in words even for a named tool_choice
    (seen here). The user still gets a spoken answer, and the session goes on."""
    tool = {"type": "function", "name": "get_weather", "description": "The weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
    with serve(tmp_path, endpoint) as server:
        events = await ask(client_of(server), "What is the weather in Paris?",
                           {"tools": [tool], "tool_choice": {"type": "function", "name": "get_weather"}})
    done = events[-1].response
    transcript = "".join(e.delta for e in events if e.type == "response.output_audio_transcript.delta")
    assert done.status == "completed" and transcript.strip()
    assert [item.type for item in done.output] == ["message"]


class Failing(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 - http.server's name
        self.send_response(500)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"error": {"message": "the model crashed"}}')

    def log_message(self, *args):
        pass


@pytest.fixture
def failing_endpoint():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Failing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/v1"
    server.shutdown()


@pytest.fixture
def silent_endpoint():
    """Accepts connections and never answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    held = []
    stop = threading.Event()

    def accept():
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except TimeoutError:
                pass

    acceptor = threading.Thread(target=accept, daemon=True)
    acceptor.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}/v1"
    stop.set()
    acceptor.join(5)  # out of accept() before the listener closes under it (EBADF otherwise)
    for connection in held:
        connection.close()
    listener.close()


@pytest.mark.parametrize("which", ["failing_endpoint", "silent_endpoint"])
async def test_an_endpoint_that_fails_or_hangs_fails_the_response_and_the_session_goes_on(
        which, request, tmp_path, client_of):
    base_url = request.getfixturevalue(which)
    with serve(tmp_path, base_url, LLM_TIMEOUT_SECONDS=3) as server:
        async with client_of(server).realtime.connect(model="s2s") as connection:
            for attempt in range(2):  # the session goes on after the first failure
                await connection.conversation.item.create(item={"type": "message", "role": "user", "content": [
                    {"type": "input_text", "text": f"Hello number {attempt}"}]})
                await connection.response.create()
                async for event in connection:
                    if event.type == "response.done":
                        break
                assert event.response.status == "failed"
                assert event.response.status_details.error.code == "model_error"

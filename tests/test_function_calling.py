"""Function calling: the wire events, the round trip, and the OpenAI-compatible LLM backend
pointed at a scripted local chat-completions server."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from channels.testing import WebsocketCommunicator

from pool.backends.base import Backends, LLMRequest
from pool.backends.cache import default_paths
from pool.backends.llm import OpenAICompatibleLLM, _ToolCallCatcher
from pool.backends.scripted import ScriptedSTT, ScriptedTTS
from pool.backends.vad import SileroVAD
from pool.history.recorder import NoRecords
from pool.pipeline.registry import PoolRegistry
from pool.process import set_registry

from .helpers import PIXEL, Client, image_message, user_text

WEATHER = {"type": "function", "name": "get_weather", "description": "Weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}


async def ask(client, text):
    await client.send(user_text(text))
    await client.until("conversation.item.done")
    await client.send({"type": "response.create"})
    return await client.until("response.done")


async def round_trip(client):
    """A question that calls get_weather, its output, and the follow-up answer."""
    await client.until("session.created")
    await client.send({"type": "session.update", "session": {"tools": [WEATHER], "output_modalities": ["text"]}})
    await client.until("session.updated")
    done = await ask(client, "Weather in Paris?")
    call = done["response"]["output"][0]
    added = next(e for e in client.received if e["type"] == "response.output_item.added")
    assert added["item"]["type"] == "function_call" and added["item"]["call_id"] == call["call_id"]
    args_done = next(e for e in client.received if e["type"] == "response.function_call_arguments.done")
    deltas = "".join(e["delta"] for e in client.received if e["type"] == "response.function_call_arguments.delta")
    assert args_done["call_id"] == call["call_id"] and args_done["name"] == "get_weather"
    assert deltas == args_done["arguments"] == call["arguments"]
    assert json.loads(call["arguments"]) == {"city": "Paris"}
    assert done["response"]["status"] == "completed"
    await client.send({"type": "conversation.item.create", "item": {
        "type": "function_call_output", "call_id": call["call_id"], "output": '{"temp_c": 21}'}})
    await client.until("conversation.item.done")
    await client.send({"type": "response.create"})
    answer = await client.until("response.done")
    return answer["response"]["output"][0]["content"][0]["text"]


@pytest.mark.usefixtures("scripted_pool")
async def test_scripted_llm_function_call_round_trip(connect):
    client = await connect()
    text = await round_trip(client)
    assert text == 'The function returned {"temp_c": 21}.'
    await client.ws.disconnect()


@pytest.mark.usefixtures("scripted_pool")
async def test_tool_choice_none_answers_in_words(connect):
    client = await connect()
    await client.until("session.created")
    await client.send({"type": "session.update", "session": {"tools": [WEATHER], "tool_choice": "none"}})
    await client.until("session.updated")
    done = await ask(client, "Weather in Paris?")
    assert done["response"]["output"][0]["type"] == "message"
    await client.ws.disconnect()


class ScriptedChatCompletions(BaseHTTPRequestHandler):
    """A scripted chat-completions server: streams a tool call when tools are offered and the user
    spoke last, and a sentence about the function result after a tool message."""

    requests = []
    replies = None  # content chunks to stream instead, whatever was asked

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append(body)
        last = body["messages"][-1]
        if self.replies is not None:
            chunks = [{"content": part} for part in self.replies]
        elif body.get("tools") and last["role"] == "user":
            chunks = [{"tool_calls": [{"index": 0, "id": "call_abc", "type": "function",
                                       "function": {"name": "get_weather", "arguments": ""}}]},
                      {"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]},
                      {"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]}]
        else:
            said = last["content"] if last["role"] == "tool" else "nothing"
            chunks = [{"content": "It is "}, {"content": f"{said} outside."}]
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for delta in chunks:
            event = {"id": "c1", "object": "chat.completion.chunk", "created": 0, "model": "m",
                     "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
            self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
        usage = {"id": "c1", "object": "chat.completion.chunk", "created": 0, "model": "m", "choices": [],
                 "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10,
                           "prompt_tokens_details": {"cached_tokens": 5}}}
        self.wfile.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())

    def log_message(self, *args):
        pass


@pytest.fixture
def chat_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), ScriptedChatCompletions)
    ScriptedChatCompletions.requests, ScriptedChatCompletions.replies = [], None
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()


def test_openai_compatible_backend_streams_text_and_assembles_tool_calls(chat_server):
    llm = OpenAICompatibleLLM(chat_server, "key", "some-model")
    calls, text = [], []
    request = LLMRequest([{"role": "system", "content": "s"}, {"role": "user", "content": "Weather?"}], 50,
                         [WEATHER], "auto")
    usage = llm.generate(request, text.append, lambda: False, lambda *call: calls.append(call))
    assert calls == [("get_weather", '{"city": "Paris"}', "call_abc")] and text == []
    assert usage == {"input_tokens": 7, "output_tokens": 3, "cached_tokens": 5}
    sent = ScriptedChatCompletions.requests[-1]
    assert sent["tools"][0]["function"]["name"] == "get_weather" and sent["model"] == "some-model"


@pytest.mark.parametrize("written", [
    ["```json\n", '{"name": "get_weather", ', '"arguments": {"city": "Paris"}}\n```'],  # Qwen2.5-Coder's
    ['{"name": "get_weather", "arguments": {"city": "Paris"}}'],
    ['<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'],
])
def test_a_call_the_endpoints_model_writes_as_text_is_a_call_not_speech(chat_server, written):
    """llama.cpp's server streams a call it does not parse as content (Qwen2.5-Coder-1.5B's
    fenced calls, bench.answers: spoken as "name set_timer arguments minutes 5")."""
    ScriptedChatCompletions.replies = written
    llm = OpenAICompatibleLLM(chat_server, "key", "some-model")
    calls, text = [], []
    request = LLMRequest([{"role": "user", "content": "Weather?"}], 50, [WEATHER], "auto")
    llm.generate(request, text.append, lambda: False, lambda *call: calls.append(call))
    assert calls == [("get_weather", '{"city": "Paris"}')] and text == []


@pytest.mark.parametrize("written, tools", [
    (['{"name": "get_time", "arguments": {}}'], [WEATHER]),  # a tool that was not offered
    (["{curly} ", "is a word here."], [WEATHER]),
    (['{"name": "get_weather", "arguments": {"city": "Paris"}}'], []),  # no tools offered: text
])
def test_text_that_only_looks_like_a_call_is_said(chat_server, written, tools):
    ScriptedChatCompletions.replies = written
    llm = OpenAICompatibleLLM(chat_server, "key", "some-model")
    calls, text = [], []
    llm.generate(LLMRequest([{"role": "user", "content": "Hi"}], 50, tools, "auto"), text.append,
                 lambda: False, lambda *call: calls.append(call))
    assert calls == [] and "".join(text) == "".join(written)


@pytest.fixture
def endpoint_pool(chat_server, settings, transactional_db):
    """A pool of one unit whose LLM is the scripted chat-completions server (real Silero VAD,
    scripted STT and TTS), installed as the process's pool."""
    settings.S2S = {"BACKEND": "scripted", "ALLOW_ANONYMOUS": True}
    vad = SileroVAD(default_paths("/nonexistent")["vad"])
    registry = PoolRegistry(Backends(vad, ScriptedSTT(), OpenAICompatibleLLM(chat_server, "", "m"),
                                     ScriptedTTS()), 1, 1.0, NoRecords())
    previous = set_registry(registry)
    yield registry
    registry.shutdown()
    set_registry(previous)


async def endpoint_client():
    from s2s_project.asgi import application

    communicator = WebsocketCommunicator(application, "/v1/realtime")
    assert (await communicator.connect())[0]
    return Client(communicator)


@pytest.mark.usefixtures("endpoint_pool")
async def test_openai_compatible_backend_through_the_protocol():
    client = await endpoint_client()
    text = await round_trip(client)
    assert text == 'It is {"temp_c": 21} outside.'
    follow_up = ScriptedChatCompletions.requests[-1]["messages"]
    assert follow_up[-2]["tool_calls"][0]["id"] == "call_abc"
    assert follow_up[-1] == {"role": "tool", "tool_call_id": "call_abc", "content": '{"temp_c": 21}'}
    await client.ws.disconnect()


@pytest.mark.parametrize("pieces, spoken, calls", [
    (["<tool", "_call>", '{"name": "f", "arguments": {"a": 1}}', "</tool_call>"], [], [("f", '{"a": 1}')]),
    (["Hello", " there"], ["Hello", " there"], []),
    (["<to", "day is fine"], ["<today is fine"], []),
    (["<tool_call>", "not json"], ["<tool_call>not json"], []),
    # Qwen2.5's <tool_call> is a special token: llama.cpp streams the call without it (and the
    # model may go on with more).
    (['{"name"', ': "f", "arguments": {"a": 1}}\n{"name": "f"'], [], [("f", '{"a": 1}')]),
    (['{"name": "f", "arguments": "{\\"a\\": 2}"}'], [], [("f", '{"a": 2}')]),
    (["```", "json", "\n{\n", '  "name": "f",\n  "arguments": {"a": 3}\n}\n```'], [], [("f", '{"a": 3}')]),  # Qwen2.5-Coder
    (["```python\nprint(1)\n```"], ["```python\nprint(1)\n```"], []),  # code, not a call: words
    (['{"name": "launch", "arguments": {}}'], ['{"name": "launch", "arguments": {}}'], []),  # not offered: words
    (['{"a": 1}'], ['{"a": 1}'], []),
])
def test_a_tool_call_is_read_in_either_form_and_only_for_a_tool_offered(pieces, spoken, calls):
    said, called = [], []
    catcher = _ToolCallCatcher(said.append, lambda *c: called.append(c), ["f"])
    for piece in pieces:
        catcher.text(piece)
    catcher.finish()
    assert "".join(said) == "".join(spoken) and [(n, json.dumps(json.loads(a))) for n, a in called] == calls


def test_text_that_opens_as_anything_but_a_call_is_spoken_as_it_streams():
    said = []
    catcher = _ToolCallCatcher(said.append, None, ["f"])
    catcher.text(" It is")
    assert said == [" It is"]  # not held to the end


@pytest.mark.usefixtures("endpoint_pool")
async def test_reasoning_and_parallel_tool_calls_reach_an_openai_compatible_endpoint():
    client = await endpoint_client()
    await client.until("session.created")
    await client.send({"type": "session.update", "session": {
        "tools": [WEATHER], "output_modalities": ["text"], "reasoning": {"effort": "low"},
        "parallel_tool_calls": False}})
    updated = await client.until("session.updated")
    assert updated["session"]["reasoning"] == {"effort": "low"} and updated["session"]["parallel_tool_calls"] is False
    await client.send(image_message())
    await client.until("conversation.item.done")
    await ask(client, "Weather in Paris?")
    sent = ScriptedChatCompletions.requests[-1]
    assert (sent["reasoning_effort"], sent["parallel_tool_calls"]) == ("low", False)
    pictured = sent["messages"][1]["content"]  # an endpoint reads images: they go as image_url parts
    assert pictured[1] == {"type": "image_url", "image_url": {"url": PIXEL, "detail": "low"}}
    await client.send({"type": "response.create", "response": {"reasoning": {"effort": "high"}, "tools": []}})
    await client.until("response.done")
    sent = ScriptedChatCompletions.requests[-1]
    assert sent["reasoning_effort"] == "high" and "parallel_tool_calls" not in sent  # no tools offered
    assert "error" not in client.types()
    await client.ws.disconnect()

"""MCP tools run by the server: a real MCP server (the ``mcp`` package's, streamable HTTP) on a
loopback port, listed at ``session.update``, called when the scripted LLM calls its tool, its
result spoken; approvals, failures, timeouts, cancellation and the host allow-list."""

import asyncio
import json
import socket
import threading
import time

import pytest
import uvicorn
from mcp.server.mcpserver import MCPServer

from pool.backends.scripted import SCRIPT
from pool.conf import get_config
from pool.process import build_registry

from .conftest import SCRIPTED, installed
from .helpers import user_text
from .test_function_calling import WEATHER


class McpTestServer:
    """An MCP server on 127.0.0.1 in a thread of its own: ``forecast(city)`` answers, ``broken()``
    raises, ``slow()`` takes 5 s. ``calls``: (tool, arguments) received; ``headers``: each
    request's headers."""

    def __init__(self):
        self.calls, self.headers = [], []
        mcp = MCPServer("weather")

        @mcp.tool()
        def forecast(city: str) -> str:
            """The weather forecast for a city."""
            self.calls.append(("forecast", {"city": city}))
            return f"Sunny and 21 degrees in {city}"

        @mcp.tool()
        def broken() -> str:
            """A tool that fails."""
            self.calls.append(("broken", {}))
            raise RuntimeError("the sensor is offline")

        @mcp.tool()
        async def slow() -> str:
            """A tool that takes 5 seconds."""
            self.calls.append(("slow", {}))
            await asyncio.sleep(5)
            return "late"

        app = mcp.streamable_http_app()

        async def recording(scope, receive, send):
            if scope["type"] == "http":
                self.headers.append({k.decode(): v.decode() for k, v in scope["headers"]})
            await app(scope, receive, send)

        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self._server = uvicorn.Server(uvicorn.Config(recording, host="127.0.0.1", port=self.port,
                                                     log_level="warning", lifespan="on"))
        self._thread = threading.Thread(target=self._server.run, daemon=True)

    def __enter__(self):
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            assert time.monotonic() < deadline, "the MCP test server did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc):
        self._server.should_exit = True
        self._thread.join(10)


@pytest.fixture(scope="module")
def mcp_server():
    with McpTestServer() as server:
        yield server


@pytest.fixture
def mcp_pool(settings, transactional_db, mcp_server):
    """The scripted pool, MCP calls timing out after 1 s."""
    settings.S2S = {**SCRIPTED, "MCP_TIMEOUT_SECONDS": 1.0}
    mcp_server.calls.clear()
    mcp_server.headers.clear()
    yield from installed(build_registry(get_config(), record=False))


def mcp_tool(server, **fields):
    return {"type": "mcp", "server_label": "weather", "server_url": server.url, "require_approval": "never",
            **fields}


async def configured(client, tools, **session):
    """The session has ``tools``; returns the ``mcp_list_tools`` item once listed (or failed)."""
    await client.until("session.created")
    await client.send({"type": "session.update", "session": {"tools": tools, **session}})
    await client.until("session.updated")
    added = await client.until("conversation.item.added")
    assert added["item"]["type"] == "mcp_list_tools" and added["item"]["server_label"] == "weather"
    progress = await client.until("mcp_list_tools.in_progress")
    assert progress["item_id"] == added["item"]["id"]
    while True:
        event = await client.recv(timeout=10)
        if event["type"] in ("mcp_list_tools.completed", "mcp_list_tools.failed"):
            assert event["item_id"] == added["item"]["id"]
            return event["type"], added["item"]


async def ask(client, text, **response):
    await client.send(user_text(text))
    await client.until("conversation.item.done")
    await client.send({"type": "response.create", "response": response})
    return await client.until("response.done", timeout=15)


def events_of(client, *types):
    return [event for event in client.received if event["type"] in types]


@pytest.mark.usefixtures("mcp_pool")
async def test_the_server_lists_calls_and_answers_with_an_mcp_tool(connect, mcp_server):
    client = await connect()
    status, _ = await configured(client, [mcp_tool(mcp_server, allowed_tools=["forecast"],
                                                   headers={"X-Tenant": "t1"}, authorization="tok")])
    assert status == "mcp_list_tools.completed"
    done_item = (await client.until("conversation.item.done"))["item"]
    assert [tool["name"] for tool in done_item["tools"]] == ["forecast", "broken", "slow"]
    assert done_item["tools"][0]["input_schema"]["properties"]["city"]["type"] == "string"

    done = await ask(client, "What is the weather in Paris?")
    assert done["response"]["status"] == "completed"
    call, answer = done["response"]["output"]
    assert (call["type"], call["server_label"], call["name"]) == ("mcp_call", "weather", "forecast")
    assert json.loads(call["arguments"]) == {"city": "Paris"}
    assert call["output"] == "Sunny and 21 degrees in Paris" and call["error"] is None
    assert answer["content"][0]["transcript"] == "The function returned Sunny and twenty-one degrees in Paris."
    assert mcp_server.calls == [("forecast", {"city": "Paris"})]
    assert all(h.get("authorization") == "Bearer tok" and h.get("x-tenant") == "t1" for h in mcp_server.headers)
    order = [e["type"] for e in client.received if e["type"].startswith("response.mcp_call")]
    assert order == ["response.mcp_call_arguments.delta", "response.mcp_call_arguments.done",
                     "response.mcp_call.in_progress", "response.mcp_call.completed"]
    # The call and its result are the conversation's: the next reply's LLM sees them.
    retrieved_ids = [e["item"]["id"] for e in events_of(client, "conversation.item.added")]
    assert call["id"] in retrieved_ids
    await client.ws.disconnect()


@pytest.mark.usefixtures("mcp_pool")
async def test_a_function_tool_beside_an_mcp_tool_still_reaches_the_client(connect, mcp_server):
    client = await connect()
    status, _ = await configured(client, [WEATHER, mcp_tool(mcp_server)])
    assert status == "mcp_list_tools.completed"
    done = await ask(client, "Weather in Paris?")
    assert [item["type"] for item in done["response"]["output"]] == ["function_call"]
    assert mcp_server.calls == []
    await client.ws.disconnect()


@pytest.mark.usefixtures("mcp_pool")
async def test_a_name_a_function_tool_and_an_mcp_tool_share_is_the_function_tools(connect, mcp_server):
    client = await connect()
    await configured(client, [{**WEATHER, "name": "forecast"}, mcp_tool(mcp_server)])
    done = await ask(client, "Weather in Paris?")
    assert [(item["type"], item["name"]) for item in done["response"]["output"]] == [("function_call", "forecast")]
    assert mcp_server.calls == []
    await client.ws.disconnect()


@pytest.mark.usefixtures("mcp_pool")
async def test_an_unreachable_mcp_server_fails_its_listing_and_the_session_goes_on(connect):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    client = await connect()
    tool = {"type": "mcp", "server_label": "weather", "server_url": f"http://127.0.0.1:{closed}/mcp"}
    status, _ = await configured(client, [WEATHER, tool])
    assert status == "mcp_list_tools.failed"
    error = await client.until("error")
    assert error["error"]["code"] == "mcp_list_tools_failed" and "could not be reached" in error["error"]["message"]
    done = await ask(client, "Weather in Paris?")
    assert [item["type"] for item in done["response"]["output"]] == ["function_call"]
    await client.ws.disconnect()


@pytest.mark.usefixtures("mcp_pool")
async def test_a_call_that_needs_approval_runs_once_the_client_approves(connect, mcp_server):
    client = await connect()
    await configured(client, [mcp_tool(mcp_server, require_approval="always")])
    done = await ask(client, "Weather in Paris?")
    (request,) = done["response"]["output"]
    assert request["type"] == "mcp_approval_request" and request["name"] == "forecast"
    assert mcp_server.calls == []

    await client.send({"type": "conversation.item.create", "item": {
        "type": "mcp_approval_response", "approval_request_id": request["id"], "approve": True}})
    answered = await client.until("response.done", timeout=15)
    call, answer = answered["response"]["output"]
    assert call["type"] == "mcp_call" and call["approval_request_id"] == request["id"]
    assert call["output"] == "Sunny and 21 degrees in Paris"
    assert answer["content"][0]["transcript"] == "The function returned Sunny and twenty-one degrees in Paris."
    assert mcp_server.calls == [("forecast", {"city": "Paris"})]

    await client.send({"type": "conversation.item.create", "item": {
        "type": "mcp_approval_response", "approval_request_id": request["id"], "approve": True}})
    error = await client.until("error")
    assert (error["error"]["code"], error["error"]["param"]) == ("invalid_value", "item.approval_request_id")
    await client.ws.disconnect()


@pytest.mark.usefixtures("mcp_pool")
async def test_a_refused_approval_runs_nothing(connect, mcp_server):
    client = await connect()
    await configured(client, [mcp_tool(mcp_server, require_approval={"always": {"tool_names": ["forecast"]}})])
    done = await ask(client, "Weather in Paris?")
    (request,) = done["response"]["output"]
    await client.send({"type": "conversation.item.create", "item": {
        "type": "mcp_approval_response", "approval_request_id": request["id"], "approve": False}})
    await client.until("conversation.item.done")
    await asyncio.sleep(0.3)
    assert not events_of(client, "response.mcp_call.in_progress") and mcp_server.calls == []
    await client.ws.disconnect()


@pytest.mark.usefixtures("mcp_pool")
@pytest.mark.parametrize("tool, kind", [("broken", "tool_execution_error"), ("slow", "http_error")])
async def test_a_failing_or_slow_tool_fails_its_call_and_the_reply_goes_on(connect, mcp_server, tool, kind):
    SCRIPT.tool_arguments = "{}"
    client = await connect()
    await configured(client, [mcp_tool(mcp_server, allowed_tools=[tool])])
    done = await ask(client, "Check it.")
    call, answer = done["response"]["output"]
    assert call["output"] is None and call["error"]["type"] == kind
    assert events_of(client, "response.mcp_call.failed")[0]["item_id"] == call["id"]
    assert answer["content"][0]["transcript"].startswith("The function returned Error:")
    await client.ws.disconnect()


@pytest.mark.usefixtures("mcp_pool")
async def test_cancelling_a_reply_stops_its_call(connect, mcp_server):
    SCRIPT.tool_arguments = "{}"
    client = await connect()
    await configured(client, [mcp_tool(mcp_server, allowed_tools=["slow"])])
    await client.send(user_text("Check it."))
    await client.until("conversation.item.done")
    await client.send({"type": "response.create"})
    await client.until("response.mcp_call.in_progress")
    await client.send({"type": "response.cancel"})
    done = await client.until("response.done")
    assert done["response"]["status"] == "cancelled"
    (call,) = done["response"]["output"]
    assert call["status"] == "incomplete" and call["output"] is None
    await asyncio.sleep(1.5)  # past the call's timeout: nothing more comes of it
    assert not events_of(client, "response.created")[1:]
    await client.ws.disconnect()


@pytest.mark.usefixtures("mcp_pool")
@pytest.mark.parametrize("tool, param", [
    ({"server_url": "http://10.0.0.1/mcp"}, "session.tools[0].server_url"),
    ({"server_url": "file:///etc/passwd"}, "session.tools[0].server_url"),
    ({"server_label": "a b"}, "session.tools[0].server_label"),
    ({"connector_id": "connector_gmail"}, "session.tools[0].connector_id"),
    ({"require_approval": "sometimes"}, "session.tools[0].require_approval"),
])
async def test_mcp_servers_only_where_the_operator_allows_and_of_the_sdks_shape(connect, mcp_server, tool, param):
    client = await connect()
    await client.until("session.created")
    await client.send({"type": "session.update", "session": {"tools": [{**mcp_tool(mcp_server), **tool}]}})
    error = await client.until("error")
    assert (error["error"]["code"], error["error"]["param"]) == ("invalid_value", param)
    assert mcp_server.headers == []  # no request went anywhere
    await client.send({"type": "session.update", "session": {"instructions": "Be brief."}})
    assert (await client.until("session.updated"))["session"]["tools"] == []
    await client.ws.disconnect()


@pytest.mark.usefixtures("mcp_pool")
async def test_a_response_cannot_bring_its_own_mcp_server(connect, mcp_server):
    client = await connect()
    await client.until("session.created")
    await client.send({"type": "response.create", "response": {"tools": [mcp_tool(mcp_server)]}})
    error = await client.until("error")
    assert (error["error"]["code"], error["error"]["param"]) == ("invalid_value", "response.tools[0]")
    await client.ws.disconnect()


async def test_the_stock_sdk_sees_the_mcp_events_as_its_own_types(scripted_server, mcp_server):
    """Against a live runpool (scripted LLM, real VAD): the SDK parses every MCP event into its
    own pydantic types, and the reply uses the tool's answer."""
    from openai import AsyncOpenAI
    from openai.types.realtime import (
        McpListToolsCompleted,
        RealtimeMcpListTools,
        RealtimeMcpToolCall,
        ResponseMcpCallCompleted,
    )

    mcp_server.calls.clear()
    client = AsyncOpenAI(api_key="local", websocket_base_url=scripted_server.base_url)
    async with client.realtime.connect(model="s2s-default") as conn:
        await conn.recv()
        await conn.session.update(session={"type": "realtime", "tools": [mcp_tool(mcp_server)]})
        seen = {}
        async for event in conn:
            seen.setdefault(event.type, event)
            if event.type == "conversation.item.done" and event.item.type == "mcp_list_tools":
                break
        assert isinstance(seen["mcp_list_tools.completed"], McpListToolsCompleted)
        listed = seen["conversation.item.done"].item
        assert isinstance(listed, RealtimeMcpListTools) and listed.tools[0].name == "forecast"

        await conn.conversation.item.create(item={"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "What is the weather in Paris?"}]})
        await conn.response.create()
        async for event in conn:
            seen.setdefault(event.type, event)
            if event.type == "response.done":
                break
    assert isinstance(seen["response.mcp_call.completed"], ResponseMcpCallCompleted)
    call, answer = seen["response.done"].response.output
    assert isinstance(call, RealtimeMcpToolCall) and call.output == "Sunny and 21 degrees in Paris"
    assert answer.content[0].transcript == "The function returned Sunny and twenty-one degrees in Paris."
    assert mcp_server.calls == [("forecast", {"city": "Paris"})]

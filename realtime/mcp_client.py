"""Calls to a remote MCP server (Model Context Protocol, streamable HTTP) for the session's
``mcp`` tools: list its tools, call one. The ``mcp`` package speaks the protocol; this module
is the only one that imports it.

Each list or call opens its own connection (an MCP session: initialize, one request, close),
so that nothing is held between the turns of a voice call and a server that restarted costs
nothing. Measured on loopback: list and call together about 0.1 s, against a second or more
for the LLM round the result feeds. Whether the server's host is allowed is the session configuration's
rule (``MCP_SERVER_HOSTS``, ``realtime.session_config.check_mcp_hosts``); redirects are followed
only within the same origin (the ``mcp`` package's rule).
"""

import asyncio
import json
from dataclasses import dataclass

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError


@dataclass
class McpCallError(Exception):
    """A list or call that failed, as the Realtime ``mcp_call`` item's ``error`` says it:
    ``kind`` "protocol_error" (the server answered with a JSON-RPC error, ``code`` its code),
    "http_error" (an HTTP status, or 0 when unreachable or timed out) or "tool_execution_error"
    (the tool ran and reported an error; no code)."""

    kind: str
    message: str
    code: int | None = None

    def as_error(self):
        """The ``error`` object of an ``mcp_call`` item."""
        error = {"type": self.kind, "message": self.message}
        if self.kind != "tool_execution_error":
            error["code"] = self.code or 0
        return error


def _headers(server):
    """The HTTP headers of requests to ``server`` (an ``mcp`` tool of the session): its
    ``headers``, and its ``authorization`` as a bearer token."""
    headers = dict(server.get("headers") or {})
    if server.get("authorization"):
        headers["Authorization"] = f"Bearer {server['authorization']}"
    return headers


async def _with_client(server, timeout, work):
    """Run ``await work(client)`` on a fresh connection to ``server``, within ``timeout``
    seconds. Raises McpCallError."""
    try:
        async with asyncio.timeout(timeout):
            async with httpx2.AsyncClient(headers=_headers(server), timeout=timeout) as http:
                async with Client(streamable_http_client(server["server_url"], http_client=http)) as client:
                    return await work(client)
    except TimeoutError:
        raise McpCallError("http_error", f"The MCP server did not answer within {timeout:g} s.") from None
    except MCPError as exc:
        raise McpCallError("protocol_error", str(exc), getattr(exc, "code", 0)) from None
    except httpx2.HTTPStatusError as exc:
        raise McpCallError("http_error", f"The MCP server answered HTTP {exc.response.status_code}.",
                         exc.response.status_code) from None
    except Exception as exc:  # noqa: BLE001 - unreachable, refused, a broken stream: all one failure to the client
        raise McpCallError("http_error", f"The MCP server could not be reached: {_reason(exc)}") from None


def _reason(exc):
    """The first leaf of an exception group (anyio wraps a connection failure in one)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}"[:300]


async def list_tools(server, timeout):
    """The tools of ``server`` (an ``mcp`` tool: ``server_url``, ``headers``, ``authorization``)
    as the Realtime ``mcp_list_tools`` item lists them: ``[{"name", "description",
    "input_schema", "annotations"}]``, every page. Raises McpCallError."""

    async def work(client):
        tools, cursor = [], None
        while True:
            page = await client.list_tools(cursor=cursor)
            tools += [{"name": tool.name, "description": tool.description or "", "input_schema": tool.input_schema,
                       "annotations": tool.annotations.model_dump(exclude_none=True) if tool.annotations else None}
                      for tool in page.tools]
            cursor = page.next_cursor
            if not cursor:
                return tools

    return await _with_client(server, timeout, work)


async def call_tool(server, name, arguments, timeout):
    """Call tool ``name`` of ``server`` with ``arguments`` (a dict). Returns its output as text:
    its text contents joined, else its structured content as JSON. Raises McpCallError
    ("tool_execution_error" when the tool reports an error)."""

    async def work(client):
        return await client.call_tool(name, arguments)

    result = await _with_client(server, timeout, work)
    texts = [part.text for part in result.content if getattr(part, "type", None) == "text"]
    output = "\n".join(texts) if texts else ("" if result.structured_content is None else json.dumps(result.structured_content))
    if result.is_error:
        raise McpCallError("tool_execution_error", output or "The tool reported an error.")
    return output


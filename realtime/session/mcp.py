"""A session's MCP servers (its ``mcp`` tools): their tools listed when the session names them,
offered to the LLM beside the function tools, and the rules of which tools may run without the
client's approval.

``McpServers`` is owned by the session. When a ``session.update`` names a new server (or
changes its URL, headers or token) it lists the server's tools, announcing it as OpenAI does:
an ``mcp_list_tools`` item added to the conversation, ``mcp_list_tools.in_progress``, then
``.completed`` (the item done, with its tools) or ``.failed`` (with an ``error`` saying why).
The calls themselves run within a response: ``realtime.session.session`` starts them and
``realtime.session.output`` shapes their items and events. The network is
``realtime.mcp_client``'s.
"""

import asyncio
import json
import logging
from dataclasses import dataclass, field

from realtime import mcp_client
from realtime.errors import ProtocolError
from realtime.mcp_client import McpCallError
from realtime.session import conversation as conv

log = logging.getLogger(__name__)


@dataclass
class McpServer:
    """One ``mcp`` tool of the session: ``tool`` its configuration (``server_label``,
    ``server_url``, ``headers``, ``allowed_tools``, ``require_approval``, ...), ``item`` its
    ``mcp_list_tools`` item, ``tools`` what it listed (None while listing, [] when it failed)."""

    tool: dict
    item: dict
    tools: list | None = None
    task: asyncio.Task | None = field(default=None, repr=False)

    @property
    def label(self):
        return self.tool["server_label"]

    def allows(self, tool):
        """Whether the session's ``allowed_tools`` lets the model see ``tool`` (a listed tool)."""
        allowed = self.tool.get("allowed_tools")
        if allowed is None:
            return True
        return tool["name"] in allowed if isinstance(allowed, list) else _matches(allowed, tool)

    def needs_approval(self, name):
        """Whether a call of tool ``name`` waits for the client's ``mcp_approval_response``: as
        OpenAI's, unless ``require_approval`` is "never" or its ``never`` filter matches the tool."""
        rule = self.tool.get("require_approval")
        if rule == "never":
            return False
        if isinstance(rule, dict) and "never" in rule:
            tool = next((t for t in self.tools or () if t["name"] == name), {"name": name})
            return not _matches(rule["never"], tool)
        return True


def _matches(tool_filter, tool):
    """An MCP tool filter (``tool_names``, ``read_only``) matches ``tool``: by its name, or by the
    server's ``readOnlyHint`` annotation."""
    if tool["name"] in tool_filter.get("tool_names", ()):
        return True
    return bool(tool_filter.get("read_only")) and bool((tool.get("annotations") or {}).get("readOnlyHint"))


def _connection(tool):
    """What reaching a server depends on: a change of any of these lists it again."""
    return tool["server_url"], json.dumps(tool.get("headers") or {}, sort_keys=True), tool.get("authorization")


class McpServers:
    """The MCP servers of one session. ``send(type, **fields)`` and ``send_error(ProtocolError)``:
    the session's; ``events``: its ``ConversationEvents`` (the list items join the
    conversation); ``history``: its ``SessionHistory``; ``timeout``: seconds for each list or
    call (MCP_TIMEOUT_SECONDS)."""

    def __init__(self, send, send_error, events, history, timeout):
        self._send, self._send_error, self._events, self._history = send, send_error, events, history
        self.timeout = timeout
        self._servers = {}  # server_label -> McpServer

    def configure(self, tools):
        """The session's ``tools`` after an update: servers no longer named are dropped, new (or
        re-addressed) ones listed; a changed filter applies at once. Call on the event loop."""
        wanted = {tool["server_label"]: tool for tool in tools if tool.get("type") == "mcp"}
        for label, server in list(self._servers.items()):
            tool = wanted.get(label)
            if tool is None or _connection(tool) != _connection(server.tool):
                if server.task is not None:
                    server.task.cancel()
                del self._servers[label]
            else:
                server.tool = tool
        for label, tool in wanted.items():
            if label not in self._servers:
                self._list(McpServer(tool, conv.mcp_list_tools(label)))

    def _list(self, server):
        self._servers[server.label] = server
        self._events.insert(server.item)
        self._send("mcp_list_tools.in_progress", item_id=server.item["id"])
        server.task = asyncio.get_running_loop().create_task(self._listed(server))

    async def _listed(self, server):
        item = server.item
        try:
            tools = await mcp_client.list_tools(server.tool, self.timeout)
        except McpCallError as failure:
            server.tools = []
            item["status"] = "incomplete"
            log.warning("MCP server %s (%s): listing its tools failed: %s", server.label,
                        server.tool["server_url"], failure.message)
            self._send("mcp_list_tools.failed", item_id=item["id"])
            self._send_error(ProtocolError("mcp_list_tools_failed", f"The tools of MCP server '{server.label}' "
                                           f"could not be listed: {failure.message}", type="server_error"))
        else:
            server.tools = item["tools"] = tools
            item["status"] = "completed"
            self._send("mcp_list_tools.completed", item_id=item["id"])
            self._send("conversation.item.done", item=conv.public(item))
        finally:
            server.task = None
        self._history.item(item)

    def offered(self, besides=()):
        """The listed tools the model may call, as function tools (their ``input_schema`` as
        ``parameters``), server by server; a name two servers share is the first one's, a name
        in ``besides`` (the function tools') is not offered."""
        offered, names = [], set(besides)
        for server in self._servers.values():
            for tool in server.tools or ():
                if server.allows(tool) and tool["name"] not in names:
                    names.add(tool["name"])
                    offered.append({"type": "function", "name": tool["name"], "description": tool["description"],
                                    "parameters": tool["input_schema"] or {"type": "object"}})
        return offered

    def find(self, name):
        """The server whose tool the model called by ``name`` (None: none lists it)."""
        return next((server for server in self._servers.values()
                     if any(t["name"] == name and server.allows(t) for t in server.tools or ())), None)

    def by_label(self, label):
        return self._servers.get(label)

    async def call(self, server, name, arguments):
        """Run tool ``name`` of ``server`` with ``arguments`` (the model's JSON text). Returns its
        output text; raises McpCallError."""
        try:
            parsed = json.loads(arguments or "{}")
        except ValueError:
            parsed = None
        if not isinstance(parsed, dict):
            raise McpCallError("tool_execution_error", "The arguments are not a JSON object.")
        return await mcp_client.call_tool(server.tool, name, parsed, self.timeout)

    def close(self):
        """The session ended: stop the listings under way."""
        for server in self._servers.values():
            if server.task is not None:
                server.task.cancel()
        self._servers.clear()

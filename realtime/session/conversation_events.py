"""The client's ``conversation.item.*`` events (but truncate, which concerns what the user heard of
a response: ``RealtimeSession``) and the announcement of every item the conversation gains.

``ConversationEvents`` is owned by the session; it works on the session's ``Conversation``
(``realtime.session.conversation``, where the items themselves are shaped), sends through the
session's ``send`` and keeps each item in its history.
"""

from realtime.errors import ProtocolError
from realtime.session import conversation as conv


class ConversationEvents:
    """``conversation.item.create``, ``.retrieve`` and ``.delete`` on ``conversation``;
    ``send(type, **fields)``: the session's; ``history``: its ``SessionHistory``;
    ``image_hosts``: IMAGE_URL_HOSTS (``conversation.check_images``). Each raises ProtocolError
    for an event it cannot carry out."""

    def __init__(self, conversation, send, history, image_hosts=()):
        self._conversation, self._send, self._history = conversation, send, history
        self._image_hosts = tuple(image_hosts)

    def create(self, event):
        """Add the client's item; returns it, as the conversation holds it."""
        items = self._conversation.items
        item, previous = event["item"], event.get("previous_item_id")
        if previous is not None and previous != "root" and previous not in items:
            raise ProtocolError("item_not_found", f"Item with id '{previous}' not found.",
                                param="previous_item_id")
        conv.check_images(item, self._image_hosts)
        item = conv.normalise_item(item)
        if item["id"] in items:
            raise ProtocolError("item_already_exists", f"Item '{item['id']}' already exists.",
                                param="item.id")
        if item["type"] == "function_call_output" and not self._conversation.has_call(item["call_id"]):
            raise ProtocolError("invalid_tool_call_id", f"No function call with call_id "
                                f"'{item['call_id'][:100]}' in the conversation.", param="item.call_id")
        if item["type"] == "mcp_approval_response":
            self._check_approval(item)
        self.insert(item, previous)
        self._history.item(item)
        return item

    def _check_approval(self, item):
        """An ``mcp_approval_response`` answers an ``mcp_approval_request`` of the conversation,
        once."""
        request_id = item["approval_request_id"]
        request = self._conversation.items.get(request_id)
        if request is None or request["type"] != "mcp_approval_request":
            raise ProtocolError("item_not_found", f"No MCP approval request '{request_id}' in the conversation.",
                                param="item.approval_request_id")
        if any(other["type"] == "mcp_approval_response" and other["approval_request_id"] == request_id
               for other in self._conversation.items.values()):
            raise ProtocolError("invalid_value", f"The MCP approval request '{request_id}' is answered already.",
                                param="item.approval_request_id")

    def retrieve(self, event):
        item = self._conversation.get(event["item_id"])
        self._send("conversation.item.retrieved", item=conv.public(item))

    def delete(self, event):
        item_id = event["item_id"]
        self._conversation.delete(item_id)
        self._send("conversation.item.deleted", item_id=item_id)

    def insert(self, item, previous_item_id=None):
        """Add an item (see ``Conversation.insert``) and announce it."""
        before = self._conversation.insert(item, previous_item_id)
        public = conv.public(item)
        self._send("conversation.item.added", previous_item_id=before, item=public)
        if item.get("status") == "completed":
            self._send("conversation.item.done", previous_item_id=before, item=public)

"""The client's ``conversation.item.*`` events (but truncate: ``realtime.session.output``), a part of
``realtime.session.RealtimeSession`` (a mixin: it uses the session's ``conversation``, ``send``
and ``history``). The items themselves are ``realtime.session.conversation``'s."""

from realtime.errors import ProtocolError
from realtime.session import conversation as conv


class ConversationEvents:
    """``conversation.item.create``, ``.retrieve`` and ``.delete`` (mixed into ``RealtimeSession``)."""

    def _on_conversation_item_create(self, event):
        item, previous = event["item"], event.get("previous_item_id")
        if previous is not None and previous != "root" and previous not in self.items:
            raise ProtocolError("item_not_found", f"Item with id '{previous}' not found.",
                                param="previous_item_id")
        item = conv.normalise_item(item)
        if item["id"] in self.items:
            raise ProtocolError("item_already_exists", f"Item '{item['id']}' already exists.",
                                param="item.id")
        if item["type"] == "function_call_output" and not self.conversation.has_call(item["call_id"]):
            raise ProtocolError("invalid_tool_call_id", f"No function call with call_id "
                                f"'{item['call_id'][:100]}' in the conversation.", param="item.call_id")
        self._insert_item(item, previous)
        self.history.item(item)

    def _on_conversation_item_retrieve(self, event):
        item = self.conversation.get(event["item_id"])
        self.send("conversation.item.retrieved", item=conv.public(item))

    def _on_conversation_item_delete(self, event):
        item_id = event["item_id"]
        self.conversation.delete(item_id)
        self.send("conversation.item.deleted", item_id=item_id)

    def _insert_item(self, item, previous_item_id=None):
        """Add an item (see ``Conversation.insert``) and announce it."""
        before = self.conversation.insert(item, previous_item_id)
        public = conv.public(item)
        self.send("conversation.item.added", previous_item_id=before, item=public)
        if item.get("status") == "completed":
            self.send("conversation.item.done", previous_item_id=before, item=public)

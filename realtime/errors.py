"""The error model of the protocol: one exception type, turned into one ``error`` event shape.

Wire shape (OpenAI Realtime GA)::

    {"type": "error", "event_id": "event_...",
     "error": {"type": "invalid_request_error", "code": "...", "message": "...",
               "param": "session.audio.input.format.rate" | None, "event_id": <client's> | None}}

Every code this server sends is in the README's "Errors" table (a test keeps it complete).
"""

from pool.ids import new_id


class ProtocolError(Exception):
    """A client event that cannot be carried out. The session goes on after it.

    ``code`` is the machine-readable error code, ``param`` the dotted path of the offending field
    (or None), ``event_id`` the id of the client event that caused it (or None).
    """

    def __init__(self, code, message, *, param=None, event_id=None, type="invalid_request_error"):
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param
        self.event_id = event_id
        self.type = type

    def to_error(self):
        """The inner ``error`` object of an ``error`` server event."""
        return {
            "type": self.type,
            "code": self.code,
            "message": self.message,
            "param": self.param,
            "event_id": self.event_id,
        }

    def to_event(self):
        """The whole ``error`` server event, under a new event id."""
        return {"type": "error", "event_id": new_id("event"), "error": self.to_error()}

"""The session: one client's protocol state, whatever transport carries it.

``RealtimeSession`` (``session``) holds the configuration and the dispatch of client and pipeline
events; its parts are the conversation's items (``conversation``, ``conversation_events``), a
response's parameters and output (``responses``, ``output``), turn-taking (``turns``) and what
the session hands to the history (``history``). ``lifecycle`` is a session's life on a unit,
shared by every transport: admission (``pool.access.connect``), the session row, the watchdog,
back-pressure and the release. It may import the pipeline's messages, the backends' base types
(never a model runtime), ``pool.access`` and ``pool.history``; nothing of a transport and no ORM
model.
"""

from realtime.session.session import RealtimeSession

__all__ = ["RealtimeSession"]

"""The session: one client's protocol state, whatever transport carries it.

``RealtimeSession`` (``session``) holds the configuration and the dispatch of client and pipeline
events; its parts are the conversation's items (``conversation``, ``conversation_events``), a
response's parameters and output (``responses``, ``output``), turn-taking (``turns``) and what
the session hands to the history (``history``). It may import the pipeline's messages and the
backends' base types (never a model runtime), and nothing of a transport.
"""

from realtime.session.session import RealtimeSession

__all__ = ["RealtimeSession"]

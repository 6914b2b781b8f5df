"""Let Daphne send the standard WebSocket close codes a server needs (1001, 1008, 1011...).

Daphne closes sockets through autobahn's ``sendClose``, which follows the browser API and refuses
every code but 1000 and 3000-4999 - so ``close(code=1008)`` from a consumer raises inside Daphne
and the client sees 1011 instead. The OpenAI Realtime protocol ends a full pool or a refused key
with 1008 (policy violation), and SDKs rely on it. RFC 6455 section 7.4.1 defines these codes for
endpoints; autobahn's own ``sendCloseFrame`` (what ``sendClose`` calls after its check) sends them.
Upstream: crossbario/autobahn-python#1642, django/daphne#374.
"""

# RFC 6455 7.4.1 / IANA registry: codes an endpoint may send in a close frame.
SERVER_CLOSE_CODES = frozenset({1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011, 1012, 1013})


def install():
    """Patch ``daphne.ws_protocol.WebSocketProtocol.serverClose`` once; no-op without Daphne."""
    try:
        from daphne.ws_protocol import WebSocketProtocol
    except ImportError:
        return
    original = WebSocketProtocol.serverClose
    if getattr(original, "s2s_close_codes", False):
        return

    def serverClose(self, code=None):  # noqa: N802 - Daphne's name
        if code in SERVER_CLOSE_CODES:
            self.sendCloseFrame(code=code, isReply=False)
        else:
            original(self, code)

    serverClose.s2s_close_codes = True
    WebSocketProtocol.serverClose = serverClose

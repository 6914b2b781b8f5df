"""Whether the client reads what the server sends: Twisted's flow control, reached through Daphne.

ASGI has no back-pressure: Daphne's ``websocket.send`` returns at once and Twisted keeps whatever
the client does not read in the connection's write buffer, without bound. A client that stops
reading (a frozen tab, a half-open socket) would hold the audio of every reply in server memory.

Twisted does track it: a TCP transport with a streaming producer (Daphne's HTTP channel registers
itself as one, and the WebSocket keeps that transport after the upgrade) sets ``producerPaused``
when its write buffer passes ``bufferSize`` (64 KiB) and clears it once the buffer has drained
(``twisted.internet.abstract.FileDescriptor``). The consumer's send loop waits while it is set,
so unsent events stay in its own outbox, and a client that reads nothing for
``SLOW_CLIENT_SECONDS`` is closed. Under another server (channels' test communicator, another
ASGI server) there is no transport to look at, and the flow never pauses.
"""

import asyncio
import time

POLL_SECONDS = 0.02  # while paused only: Twisted has no hook for "resumed" that is not taken


class WriteFlow:
    """``base_send``: the connection's ASGI ``send``. Daphne passes
    ``functools.partial(server.handle_reply, protocol)``; the protocol holds the transport."""

    def __init__(self, base_send):
        protocol = next(iter(getattr(base_send, "args", ())), None)
        self._transport = getattr(protocol, "transport", None)

    def paused(self):
        """True while more than Twisted's buffer size of written data waits for the client."""
        return bool(getattr(self._transport, "producerPaused", False))

    async def wait_writable(self, timeout):
        """True once the client reads again (at once when it does); False after ``timeout``
        seconds of a full buffer."""
        deadline = time.monotonic() + timeout
        while self.paused():
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(POLL_SECONDS)
        return True

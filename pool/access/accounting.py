"""What this process counts of its own sessions, without the database: the sessions each API key
holds here, and the rate of new sessions per client address.

Both live on the event loop (every connect and end runs there), so a check and its count are one
step and need no lock. Across processes, what a key holds elsewhere is read from the database at
connect (``pool.access.auth.key_holds``) and added to this process's count.
"""

import collections
import ipaddress
import time

from pool.conf import get_config


class KeySessions:
    """Open sessions per API key id in this process."""

    def __init__(self):
        self._open = collections.Counter()

    def admit(self, api_key):
        """Count one more session of ``api_key`` (an ``APIKey`` from ``auth.check_key``, with
        ``open_elsewhere``) unless its ``max_sessions`` is reached; True when counted."""
        if api_key.max_sessions is not None and api_key.open_elsewhere + self._open[api_key.pk] >= api_key.max_sessions:
            return False
        self._open[api_key.pk] += 1
        return True

    def add(self, api_key_id):
        """Count a session whose key's limit was applied elsewhere (a client secret, at issue)."""
        self._open[api_key_id] += 1

    def release(self, api_key_id):
        """A counted session of ``api_key_id`` has ended (or was refused after counting)."""
        self._open[api_key_id] -= 1
        if self._open[api_key_id] <= 0:
            del self._open[api_key_id]

    def __getitem__(self, api_key_id):
        return self._open[api_key_id]


class ConnectRate:
    """At most ``CONNECTS_PER_MINUTE`` new sessions per client address in any 60 s, in this
    process (a sliding window of session starts). Refused connects do not count, so clients
    without a key cannot use up the budget of keyed clients behind the same address. Memory is
    bounded by the addresses seen in the last minute: older ones are dropped as the table is
    swept, and an address is a normalised IP (``client_address``), never header text."""

    WINDOW = 60.0  # seconds

    def __init__(self):
        self._times = {}  # address -> deque of monotonic connect times, oldest first
        self._next_sweep = 0.0

    def allow(self, address, now=None):
        """Count a new session from ``address``; False when it is over the limit (not counted).
        An IPv6 address counts as its /64: one client usually holds a whole /64 to rotate in."""
        limit = get_config()["CONNECTS_PER_MINUTE"]
        if limit is None or address is None:
            return True
        if ":" in address:
            address = str(ipaddress.ip_network(f"{address}/64", strict=False))
        now = time.monotonic() if now is None else now
        if now >= self._next_sweep:
            self._sweep(now)
        times = self._times.setdefault(address, collections.deque())
        while times and times[0] <= now - self.WINDOW:
            times.popleft()
        if len(times) >= limit:
            return False
        times.append(now)
        return True

    def _sweep(self, now):
        self._times = {a: t for a, t in self._times.items() if t and t[-1] > now - self.WINDOW}
        self._next_sweep = now + self.WINDOW


KEY_SESSIONS = KeySessions()
CONNECT_RATE = ConnectRate()

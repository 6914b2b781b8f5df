"""History: what is kept of the pool and of each session, and how it is written.

The recorder (``recorder``) is the one thread that writes rows, from a queue, and retries through
outages; ``rows`` are the writes of session, unit and history rows, ``processes`` the process's own
row (registration, heartbeat, lost processes, draining); ``storable`` makes every text fit every
database; ``recordings`` are the opt-in audio files; ``timeline`` draws a session's rows on one
time axis, and the first audio of the last hour, for the admin. What a session hands over is built by the
session (``realtime.session.history``). It may import the ORM and the pipeline; nothing of
``realtime`` but its wire audio conversions.
"""

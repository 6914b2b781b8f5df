"""The realtime app: the OpenAI Realtime protocol over the pool.

``session/`` is one client's session whatever transport carries it (its state machine, its
parts, and its lifecycle on a unit). At this root: the transports and endpoints (``consumers``
for WebSocket, ``routing``, ``client_secrets``, ``views`` and ``urls`` for the browser page),
the wire vocabulary (``events`` and ``schema`` for client events, ``session_config`` for the
session object, ``audio`` for formats and PCM16, ``errors`` for the error event), Daphne
adaptations (``flow``, ``daphne_close_codes``) and a client (``client``, ``manage.py talk``).

It may import the pool's rooms (``pool.access`` to admit, ``pool.history`` to record, the
pipeline's messages and the backends' base types); the pool imports nothing of it but the wire
audio conversions (``realtime.audio``), and ``runpool`` what it serves and closes. The wire
vocabulary imports no model runtime.
"""

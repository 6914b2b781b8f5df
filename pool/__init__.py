"""The pool app: the units that serve sessions, the models behind them, who may use them, what is
kept of them, and how operators run them.

Rooms, each a package whose docstring says what it holds and may import:

- ``pipeline``: the registry of units and what runs inside one (stages, messages, pacing,
  timings). Computes; no ORM, nothing of ``realtime``.
- ``backends``: the models (VAD, STT, LLM, TTS, end of turn), their Protocols (``base``), voice
  and language tables (``voices``) and the model cache (``cache``).
- ``access``: who may open a session and on which unit (keys, auth, admission, the one
  ``connect.admit``, this process's accounting, the connect-time database calls).
- ``history``: the recorder thread and the rows it writes, the process's own row, recordings.

At the root, where Django users look: ``apps``, ``models``, ``admin``, ``urls``, ``views``,
``checks``, ``signals``, ``management/``, ``migrations/``; and the process's operations: ``conf``
(the settings), ``process`` (this process's pool), ``control`` (operator commands across
processes), ``metrics``, ``asgi`` (the health fast path), ``states``, ``ids``, ``testing`` (live
servers and databases for any project's tests). The root modules may import any room; the rooms
import the root's ``conf``, ``states``, ``ids`` and ``metrics`` only (``models`` too, where
their docstring says so).
"""

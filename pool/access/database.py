"""Database work of a connect (a key check, a claim, a reservation), on threads of its own.

Live calls never wait for the database: their events touch no table (the recorder thread writes
their rows, ``pool.history.recorder``). A connect must read and write a few rows, and those calls run
here, not on Django's one thread-sensitive database thread that every consumer shares: a
locked table then delays the connects that need it, never another session's events.

Each call is bounded three times: SQLite's busy timeout and PostgreSQL's ``lock_timeout`` and
``statement_timeout`` on these threads' connections, and a wall-clock deadline around the whole
call (a database that does not answer at all). A call that runs out raises ``DatabaseBusyError``,
which the caller turns into a clear refusal (``server_busy``, close 1013) or a fallback.
"""

import asyncio
import functools
import logging
import threading
from concurrent.futures import ThreadPoolExecutor

from django.db import DatabaseError, close_old_connections
from django.db.backends.signals import connection_created
from django.dispatch import receiver

log = logging.getLogger(__name__)

THREADS = 2  # connects are short; more threads would only queue more waits on a lock
THREAD_PREFIX = "s2s-connect-db"
LOCK_TIMEOUT_MS = 1000  # waiting for a row or table lock (SQLite: for the database's lock)
STATEMENT_TIMEOUT_MS = 2000  # one statement (PostgreSQL)
CALL_TIMEOUT_SECONDS = 5.0  # one call, whatever it waits for (a server that never answers)

_executor = ThreadPoolExecutor(THREADS, thread_name_prefix=THREAD_PREFIX)


class DatabaseBusyError(DatabaseError):
    """The database did not answer a connect's call in time: a lock held elsewhere, a statement
    over its timeout, or no answer at all. Temporary: the client may try again."""


async def call(fn, *args):
    """``fn(*args)`` (sync, using Django's ORM) on a connect thread; returns its result.

    Raises DatabaseBusyError when it waited too long, and any other DatabaseError it raised (the
    database is down)."""
    future = asyncio.get_running_loop().run_in_executor(_executor, functools.partial(_run, fn, *args))
    try:
        return await asyncio.wait_for(future, CALL_TIMEOUT_SECONDS)
    except TimeoutError:
        raise DatabaseBusyError(f"no answer from the database within {CALL_TIMEOUT_SECONDS:g} s") from None


def _run(fn, *args):
    close_old_connections()  # a connection broken by an outage is not reused; CONN_MAX_AGE holds
    try:
        return fn(*args)
    except DatabaseError as exc:
        if is_busy(exc):
            raise DatabaseBusyError(str(exc).strip()) from exc
        raise


def is_busy(exc):
    """True for a DatabaseError that says "try again": SQLite's locked database, PostgreSQL's
    lock or statement timeout."""
    cause = exc.__cause__
    if type(cause).__name__ in ("LockNotAvailable", "QueryCanceled"):  # psycopg's errors
        return True
    return "database is locked" in str(exc) or "database table is locked" in str(exc)


@receiver(connection_created)
def _bound_waits(sender, connection, **kwargs):
    """The timeouts of a connection opened on a connect thread (and only there: the recorder
    may wait as long as it must)."""
    if not threading.current_thread().name.startswith(THREAD_PREFIX):
        return
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute(f"PRAGMA busy_timeout = {LOCK_TIMEOUT_MS}")
        elif connection.vendor == "postgresql":
            cursor.execute(f"SET lock_timeout = {LOCK_TIMEOUT_MS}; SET statement_timeout = {STATEMENT_TIMEOUT_MS}")

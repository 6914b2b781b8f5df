"""A locked database delays records and the connects that need it, never a live call: with a
SQLite write lock or a PostgreSQL table lock held by another client, an open session's events
are answered, a keyed connect is refused clearly (``server_busy``, close 1013) and an anonymous
one is served, all before the lock is released. Live servers on the scripted backend."""

import asyncio
import contextlib
import json
import sqlite3

import psycopg
import pytest
import websockets

from pool.testing import LiveServer, postgres_database, wait_until

pytestmark = pytest.mark.live


@contextlib.contextmanager
def sqlite_lock(server):
    """An exclusive lock on the server's SQLite file (no reader or writer gets in), as a
    ``sqlite3`` shell with ``BEGIN EXCLUSIVE`` holds it."""
    db = sqlite3.connect(server.db, timeout=10, isolation_level=None)
    db.execute("BEGIN EXCLUSIVE")
    db.execute("UPDATE pool_apikey SET name = name")
    try:
        yield
    finally:
        db.execute("ROLLBACK")
        db.close()


@contextlib.contextmanager
def postgres_lock(url):
    """``LOCK TABLE ... IN ACCESS EXCLUSIVE MODE`` on the tables a connect reads (units, keys),
    held by another client."""
    with psycopg.connect(url) as db:
        db.execute("LOCK TABLE pool_unit, pool_apikey IN ACCESS EXCLUSIVE MODE")
        yield
        db.rollback()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def locked_server(request, tmp_path):
    """``(server, API key, lock, query)``: a pool of 2 on SQLite or PostgreSQL, a context manager
    that holds a lock on its database, and ``query(sql)`` on that database."""
    with contextlib.ExitStack() as stack:
        env = {"S2S_BACKEND": "scripted"}
        if request.param == "postgres":
            env["DATABASE_URL"] = url = stack.enter_context(postgres_database())
        server = stack.enter_context(LiveServer(tmp_path, pool_size=2, env=env))
        key = server.manage("apikey", "create", "locked").strip()
        if request.param == "postgres":
            def query(sql):
                with psycopg.connect(url) as db:
                    return db.execute(sql).fetchall()

            yield server, key, lambda: postgres_lock(url), query
        else:
            yield server, key, lambda: sqlite_lock(server), server.query


async def _first_event(ws):
    return json.loads(await ws.recv())


async def _answered(ws):
    await ws.send(json.dumps({"type": "response.create", "response": {"output_modalities": ["text"]}}))
    while (event := json.loads(await ws.recv()))["type"] != "response.done":
        pass
    return event["response"]["status"]


async def test_a_locked_database_never_holds_a_live_call(locked_server):
    server, key, lock, query = locked_server
    url = f"{server.base_url}/realtime"
    async with websockets.connect(url) as live:
        await _first_event(live)
        with lock():
            keyed = await websockets.connect(url, additional_headers={"Authorization": f"Bearer {key}"})
            refusal = asyncio.ensure_future(_first_event(keyed))  # its key check waits on the lock
            await asyncio.sleep(0.3)
            # Every await below has a timeout: none may wait for the lock to be released.
            assert await asyncio.wait_for(_answered(live), 10) == "completed"
            error = await asyncio.wait_for(refusal, 10)
            assert error["error"]["code"] == "server_busy"
            with pytest.raises(websockets.ConnectionClosed):
                await asyncio.wait_for(keyed.recv(), 5)
            assert keyed.close_code == 1013
            # A connect without a key claims a unit without the reservations (logged), at once.
            async with websockets.connect(url) as anonymous:
                assert (await asyncio.wait_for(_first_event(anonymous), 10))["type"] == "session.created"
                assert await asyncio.wait_for(_answered(anonymous), 10) == "completed"
        # The lock is gone: the records catch up, and the key works again.
        async with websockets.connect(url, additional_headers={"Authorization": f"Bearer {key}"}) as again:
            assert (await _first_event(again))["type"] == "session.created"
    log = server.log.read_text()
    assert "the database is busy" in log and "Traceback" not in log
    ended = "select count(*) from pool_session where ended_at is not null"
    await asyncio.to_thread(wait_until, lambda: query(ended) == [(3,)], 30, "every session's row is written")

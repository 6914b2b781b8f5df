"""Faults, each with calls going on around it: does a fault cost only what it must?

For every fault, live servers on the scripted test backend (the models are not what is measured)
and a few bystanders: clients in a call, one text turn after another, from before the fault until
after it. Per fault:

- calls that kept working: bystanders whose every turn was answered while the fault lasted;
- units lost: units not idle again once every client has gone (must be 0);
- records lost: sessions opened whose row never ended, or ended wrong (must be 0);
- time to recover: from the end of the fault to the first new session that is answered.

    python -m bench.faults [--faults malformed_frames,sqlite_lock,...] [--bystanders 2] [--seconds 6]

Needs root for the full disks (a mount namespace of the server's own) and PostgreSQL's server
binaries and redis-server for the outages of those.
"""

import argparse
import asyncio
import contextlib
import json
import signal
import sqlite3
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import psycopg
import websockets

from pool.testing import (
    LiveServer,
    PrivatePostgres,
    RedisServer,
    fill,
    full_filesystem_at,
    postgres_database,
    wait_until,
)
from tests.helpers import PROJECT_DIR

from .common import emit

PROJECT = {"dir": PROJECT_DIR}  # the checkout whose manage.py runs the servers (--project-dir)
TURN_TIMEOUT = 10.0  # seconds a bystander's turn may take before it counts as failed
SETTINGS = {"CONNECTS_PER_MINUTE": None, "HEARTBEAT_SECONDS": 0.5, "LOST_AFTER_SECONDS": 3}


def _folder(name):
    return Path(tempfile.mkdtemp(prefix=f"s2s-faults-{name}-"))


async def _session(url, headers=None):
    ws = await websockets.connect(url, additional_headers=headers or {}, max_size=None)
    first = json.loads(await ws.recv())
    if first["type"] != "session.created":
        await ws.close()
        raise ConnectionError(first.get("error", {}).get("code"))
    return ws, first["session"]["id"]


async def _turn(ws):
    await ws.send(json.dumps({"type": "conversation.item.create", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hello?"}]}}))
    await ws.send(json.dumps({"type": "response.create"}))
    while (event := json.loads(await asyncio.wait_for(ws.recv(), TURN_TIMEOUT)))["type"] != "response.done":
        pass
    return event["response"]["status"] == "completed"


class Bystanders:
    """``count`` clients in a call on ``urls`` (round robin), one turn after another until
    ``stop``; ``kept`` says how many had every turn answered."""

    def __init__(self, urls, count):
        self.urls, self.count = urls, count
        self.sessions, self.failed, self.turns = [], set(), 0
        self._stopping = asyncio.Event()

    async def __aenter__(self):
        self.tasks = [asyncio.ensure_future(self._call(i)) for i in range(self.count)]
        await asyncio.sleep(1.0)
        return self

    async def _call(self, i):
        try:
            ws, session_id = await _session(self.urls[i % len(self.urls)])
        except (OSError, ConnectionError, websockets.WebSocketException):
            self.failed.add(i)
            return
        self.sessions.append(session_id)
        try:
            while not self._stopping.is_set():
                if not await _turn(ws):
                    self.failed.add(i)
                self.turns += 1
                await asyncio.sleep(0.2)
        except (TimeoutError, websockets.WebSocketException):
            self.failed.add(i)
        finally:
            await ws.close()

    async def __aexit__(self, *exc):
        self._stopping.set()
        await asyncio.gather(*self.tasks)

    @property
    def kept(self):
        return self.count - len(self.failed)


async def _recover(url, since, timeout=60.0):
    """Seconds from ``since`` (time.monotonic) until a new session on ``url`` is answered."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            ws, _ = await _session(url)
            try:
                if await _turn(ws):
                    return round(time.monotonic() - since, 2)
            finally:
                await ws.close()
        except (OSError, ConnectionError, TimeoutError, websockets.WebSocketException):
            pass
        await asyncio.sleep(0.1)
    return None


def _idle(server):
    try:
        with urllib.request.urlopen(f"{server.http_url}/healthz", timeout=5) as reply:
            return json.loads(reply.read())["idle"]
    except urllib.error.HTTPError as error:
        return json.loads(error.read())["idle"]


def _units_lost(servers, pool_size):
    """Units not idle again within 10 s, over ``servers``."""
    lost = 0
    for server in servers:
        with contextlib.suppress(AssertionError):
            wait_until(lambda server=server: _idle(server) == pool_size, 10, "idle", 0.1)
        lost += pool_size - _idle(server)
    return lost


def _records_lost(query, session_ids, allowed=("client_close",)):
    """Sessions in ``session_ids`` whose row is missing, not ended, or ended for another reason
    than ``allowed``, once the recorders had 15 s to write."""
    def missing():
        rows = dict(query("select session_id, end_reason from pool_session where ended_at is not null"))
        return [s for s in session_ids if rows.get(s) not in allowed]

    with contextlib.suppress(AssertionError):
        wait_until(lambda: not missing(), 15, "rows", 0.2)
    return len(missing())


async def _attack_frames(url, frames):
    """Each frame on a session of its own, then a turn on it. Returns, for each, whether it got
    an error and still answered its turn; and the ids of the sessions."""
    answered, opened = [], []
    for frame in frames:
        try:
            ws, session_id = await _session(url)
            opened.append(session_id)
        except (ConnectionError, websockets.WebSocketException):  # refused: the pool is full
            answered.append(False)
            continue
        try:
            await ws.send(frame)
            error = json.loads(await asyncio.wait_for(ws.recv(), 5))
            answered.append(error["type"] == "error" and await _turn(ws))
        except (TimeoutError, websockets.WebSocketException):  # the socket died with the session
            answered.append(False)
        finally:
            await ws.close()
    return answered, opened


MALFORMED = [
    '{"type": "conversation.item.create", "item": {"id": [0], "role": "user", "content": []}}',
    '{"type": "conversation.item.create", "item": {"id": {"a": 1}, "role": "user", "content": []}}',
    '{"type": "conversation.item.create", "item": {"role": "user", "content": [{"type": "input_text", "text": 5}]}}',
    '{"type": "response.create", "response": {"input": [{"type": "item_reference", "id": ["x"]}]}}',
    '{"type": "conversation.item.create", "item": {"role": "assistant", "content": [{"type": "output_audio", '
    '"transcript": 1}]}}',
]
UNSTORABLE = [
    '{"type": "conversation.item.delete", "item_id": "\\ud800"}',
    '{"type": "conversation.item.delete", "item_id": "\\u0000"}',
    '{"type": "conversation.item.create", "item": {"role": "user", "content": [{"type": "input_text", '
    '"text": "a\\u0000b"}]}}',
    '{"type": "conversation.item.create", "item": {"id": "' + "i" * 70 + '", "role": "user", "content": []}}',
    '{"type": "session.update", "session": {"audio": {"output": {"voice": "' + "v" * 70 + '"}}}}',
]


# --- the faults: each an async function of its settings that returns a result row -----------------

async def _one_server(name, bystanders, seconds, fault, env=None, pool_extra=2, prefix=(), args=("--allow-anonymous",)):
    """One server (pool of bystanders + ``pool_extra``); ``fault(server, url)`` runs while the
    bystanders call and returns ``(what happened, the session ids it opened)``."""
    pool_size = bystanders + pool_extra
    env = {"S2S_BACKEND": "scripted", "S2S_JSON": json.dumps(SETTINGS), **(env or {})}
    with LiveServer(_folder(name), pool_size=pool_size, env=env, command_prefix=prefix, args=args,
                    project_dir=PROJECT["dir"]) as server:
        url = f"{server.base_url}/realtime"
        async with Bystanders([url], bystanders) as calls:
            happened, opened = await fault(server, url)
            recover = await _recover(url, time.monotonic())
            await asyncio.sleep(min(seconds, 2.0))
        units = await asyncio.to_thread(_units_lost, [server], pool_size)
        records = await asyncio.to_thread(_records_lost, _query(env, server), calls.sessions + opened)
        assert server.stop() == 0
    return {"fault": name, "happened": happened, "calls_kept": f"{calls.kept}/{calls.count}",
            "turns": calls.turns, "units_lost": units, "records_lost": records, "recover_s": recover}


def _query(env, server):
    """``query(sql)`` on the database of ``env`` (PostgreSQL, a shared SQLite file, or the
    server's own SQLite file)."""
    def query(sql):
        if "DATABASE_URL" in env:
            with psycopg.connect(env["DATABASE_URL"]) as db:
                return db.execute(sql).fetchall()
        with sqlite3.connect(env.get("S2S_SQLITE_PATH", server.db)) as db:
            return db.execute(sql).fetchall()
    return query


async def malformed_frames(bystanders, seconds):
    async def fault(server, url):
        answered, opened = await _attack_frames(url, MALFORMED * 2)
        return f"{sum(answered)}/{len(answered)} type-confused sessions answered an error, then a turn", opened
    return await _one_server("malformed_frames", bystanders, seconds, fault)


async def unstorable_text(bystanders, seconds):
    with postgres_database() as database:
        async def fault(server, url):
            answered, opened = await _attack_frames(url, UNSTORABLE * 2)
            return f"{sum(answered)}/{len(answered)} sessions with NUL, lone surrogates, long ids (PostgreSQL)", opened
        return await _one_server("unstorable_text", bystanders, seconds, fault, {"DATABASE_URL": database})


async def _database_lock(name, bystanders, seconds, env, hold):
    """``hold(server)``: a context manager holding the lock, ``seconds`` long."""
    async def fault(server, url):
        key = server.manage("apikey", "create", "locked").strip()
        with hold(server):
            started = time.monotonic()
            codes, opened = [], []
            while time.monotonic() - started < seconds:
                try:
                    ws, session_id = await asyncio.wait_for(
                        _session(url, {"Authorization": f"Bearer {key}"}), seconds + 10)
                    opened.append(session_id)
                    codes.append("session.created")
                    await ws.close()
                except ConnectionError as refused:
                    codes.append(str(refused))
                except (TimeoutError, websockets.WebSocketException) as failed:
                    codes.append(type(failed).__name__)
                await asyncio.sleep(1.0)
        counted = {code: codes.count(code) for code in sorted(set(codes))}
        return f"{seconds:g} s lock; key connects meanwhile: {counted}", opened
    return await _one_server(name, bystanders, seconds, fault, env)


async def sqlite_lock(bystanders, seconds):
    @contextlib.contextmanager
    def hold(server):
        db = sqlite3.connect(server.db, timeout=10, isolation_level=None)
        db.execute("BEGIN EXCLUSIVE")
        try:
            yield
        finally:
            db.execute("ROLLBACK")
            db.close()
    return await _database_lock("sqlite_lock", bystanders, seconds, {}, hold)


async def postgres_lock(bystanders, seconds):
    with postgres_database() as database:
        @contextlib.contextmanager
        def hold(server):
            with psycopg.connect(database) as db:
                db.execute("LOCK TABLE pool_unit, pool_apikey IN ACCESS EXCLUSIVE MODE")
                yield
                db.rollback()
        return await _database_lock("postgres_lock", bystanders, seconds, {"DATABASE_URL": database}, hold)


async def postgres_down(bystanders, seconds):
    postgres = PrivatePostgres()
    try:
        async def fault(server, url):
            await asyncio.to_thread(postgres.stop)
            opened = []
            for _ in range(2):  # new anonymous sessions meanwhile
                ws, session_id = await _session(url)
                opened.append(session_id)
                await _turn(ws)
                await ws.close()
            await asyncio.sleep(seconds)
            await asyncio.to_thread(postgres.start)
            return f"PostgreSQL stopped {seconds:g} s; 2 new sessions during it", opened
        return await _one_server("postgres_down", bystanders, seconds, fault, {"DATABASE_URL": postgres.url})
    finally:
        postgres.remove()


async def _two_processes(name, bystanders, seconds, fault, shared):
    """Processes A and B sharing ``shared`` (env: a database, maybe Redis); bystanders on both."""
    pool_size = bystanders + 1
    env = {"S2S_BACKEND": "scripted", "S2S_JSON": json.dumps(SETTINGS), **shared}
    servers = {n: LiveServer(_folder(f"{name}-{n}"), pool_size=pool_size, env=env, project_dir=PROJECT["dir"])
               for n in "ab"}
    try:
        urls = [f"{s.base_url}/realtime" for s in servers.values()]
        async with Bystanders(urls, bystanders) as calls:
            happened, allowed = await fault(servers, env)
            recover = await _recover(f"{servers['a'].base_url}/realtime", time.monotonic())
            await asyncio.sleep(min(seconds, 2.0))
        units = await asyncio.to_thread(_units_lost, list(servers.values()), pool_size)
        records = await asyncio.to_thread(_records_lost, _query(env, servers["a"]), calls.sessions, allowed)
    finally:
        for server in servers.values():
            if server.process.poll() is None:
                server.stop()
    return {"fault": name, "happened": happened, "calls_kept": f"{calls.kept}/{calls.count}", "turns": calls.turns,
            "units_lost": units, "records_lost": records, "recover_s": recover}


async def redis_down(bystanders, seconds):
    with contextlib.ExitStack() as stack:
        database = stack.enter_context(postgres_database())
        redis = stack.enter_context(RedisServer())

        async def fault(servers, env):
            redis.stop()
            await asyncio.sleep(seconds)
            redis.start()
            return f"Redis stopped {seconds:g} s under two processes", ("client_close",)
        return await _two_processes("redis_down", bystanders, seconds, fault,
                                    {"DATABASE_URL": database, "REDIS_URL": redis.url})


async def process_killed(bystanders, seconds):
    """SIGKILL of process A mid-call, restarted at once: A's calls are lost (ended at A's last
    heartbeat), B's go on; "calls kept" counts B's."""
    folder = _folder("process_killed")

    async def fault(servers, env):
        servers["a"].process.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        servers["a"].process.wait()
        servers["a"] = await asyncio.to_thread(LiveServer, _folder("process_killed-a2"), pool_size=bystanders + 1,
                                               env=env, project_dir=PROJECT["dir"])
        return (f"A killed with SIGKILL mid-call, serving again {time.monotonic() - killed:.1f} s later",
                ("client_close", "lost"))

    result = await _two_processes("process_killed", bystanders, seconds, fault,
                                  {"S2S_SQLITE_PATH": str(folder / "shared.sqlite3")})
    result["calls_kept"] += " (A's calls end with A)"
    return result


async def _full_disk(name, bystanders, seconds, variable, used):
    folder = _folder(name)
    prefix = full_filesystem_at(folder, 16384 if used else 1 << 20)
    settings = {**SETTINGS, "RECORD_AUDIO": True}

    async def fault(server, url):
        if not used:  # the temporary folder fills up while the server runs
            await asyncio.to_thread(fill, Path(f"/proc/{server.process.pid}/root") / folder.relative_to("/"))
        opened, answered = [], 0
        for _ in range(3):
            ws, session_id = await _session(url)
            opened.append(session_id)
            try:
                answered += await _turn(ws)
            except TimeoutError:
                pass
            await ws.close()
        await asyncio.sleep(1.0)  # the recordings are stored once the units have drained
        media = (Path(f"/proc/{server.process.pid}/root") / folder.relative_to("/")) if used else server.media
        kept = {n for row in _query(env, server)("select user_audio, assistant_audio from pool_session") for n in row if n}
        orphans = [p for p in media.rglob("*") if p.is_file() and p.name != "filler"
                   and str(p.relative_to(media)) not in kept]
        return f"{variable} full, recordings on: {answered}/3 new sessions answered, {len(orphans)} orphan files", opened

    env = {"S2S_JSON": json.dumps(settings), variable: str(folder)}
    return await _one_server(name, bystanders, seconds, fault, env, prefix=prefix)


async def temp_folder_full(bystanders, seconds):
    return await _full_disk("temp_folder_full", bystanders, seconds, "TMPDIR", 0)


async def media_full(bystanders, seconds):
    return await _full_disk("media_full", bystanders, seconds, "DJANGO_MEDIA_ROOT", 16384)


async def bad_http(bystanders, seconds):
    def post(server, token, body):
        request = urllib.request.Request(f"{server.http_url}/v1/realtime/client_secrets", data=body.encode(),
                                         method="POST", headers={"Authorization": f"Bearer {token}",
                                                                 "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=10) as reply:
                return reply.status
        except urllib.error.HTTPError as error:
            return error.code
        except OSError:
            return "no answer"

    async def fault(server, url):
        key = server.manage("apikey", "create", "edge").strip()
        answers = {}
        for path in ("/v2/realtime", "/v1/realtime/x"):
            try:
                await websockets.connect(f"ws://127.0.0.1:{server.port}{path}")
            except websockets.InvalidStatus as refused:
                answers[f"ws {path}"] = refused.response.status_code
        answers["20 kB bearer token"] = await asyncio.to_thread(post, server, "s2s_" + "x" * 20_000, "{}")
        answers["NUL in instructions"] = await asyncio.to_thread(
            post, server, key, '{"session": {"instructions": "a\\u0000b"}}')
        return json.dumps(answers), []

    return await _one_server("bad_http", bystanders, seconds, fault)


FAULTS = {f.__name__: f for f in (malformed_frames, unstorable_text, sqlite_lock, postgres_lock, postgres_down,
                                  redis_down, process_killed, temp_folder_full, media_full, bad_http)}


async def run(names, bystanders, seconds):
    return [await FAULTS[name](bystanders, seconds) for name in names]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--faults", default=",".join(FAULTS))
    parser.add_argument("--bystanders", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=6.0, help="how long each outage or lock lasts")
    parser.add_argument("--project-dir", type=Path, default=PROJECT_DIR,
                        help="the checkout that serves (e.g. a git worktree of an older commit: before/after)")
    options = parser.parse_args()
    PROJECT["dir"] = options.project_dir
    rows = asyncio.run(run(options.faults.split(","), options.bystanders, options.seconds))
    emit("faults", {"bystanders": options.bystanders, "seconds": options.seconds, "rows": rows})


if __name__ == "__main__":
    main()

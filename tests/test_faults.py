"""Faults a production server meets, over real Daphne servers on the scripted test backend (the
models are not the point): a process killed with SIGKILL, PostgreSQL down during live sessions, a
stage that hangs, a client that stops reading."""

import asyncio
import json
import signal
import sqlite3
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import psycopg
import pytest
import websockets

from bench import misbehave
from pool.testing import LiveServer, PrivatePostgres, fill, full_filesystem_at, wait_until

pytestmark = pytest.mark.live

SCRIPTED = {"S2S_BACKEND": "scripted"}


def _query(db, sql):
    with sqlite3.connect(db) as connection:
        return connection.execute(sql).fetchall()


async def _session(server):
    ws = await websockets.connect(f"{server.base_url}/realtime")
    created = json.loads(await ws.recv())
    assert created["type"] == "session.created"
    return ws, created["session"]["id"]


async def _answered(ws):
    await ws.send(json.dumps({"type": "response.create"}))
    while (event := json.loads(await ws.recv()))["type"] != "response.done":
        pass
    return event["response"]["status"] == "completed"


async def test_a_killed_process_is_lost_with_its_sessions_and_no_other_process_is_touched(tmp_path):
    db = tmp_path / "shared.sqlite3"
    env = {**SCRIPTED, "S2S_SQLITE_PATH": str(db),
           "S2S_JSON": json.dumps({"HEARTBEAT_SECONDS": 0.5, "LOST_AFTER_SECONDS": 3})}
    servers = {}
    for name in "abc":
        (tmp_path / name).mkdir()
    servers["a"] = await asyncio.to_thread(LiveServer, tmp_path / "a", env=env)
    servers["b"] = await asyncio.to_thread(LiveServer, tmp_path / "b", env=env)
    try:
        a, b = servers["a"], servers["b"]
        ws_a, session_a = await _session(a)
        ws_b, session_b = await _session(b)
        row_a = f"select count(*) from pool_session where session_id = '{session_a}'"
        await asyncio.to_thread(wait_until, lambda: _query(db, row_a) == [(1,)], 10, "the recorder wrote the row")
        a.process.kill()  # SIGKILL: no drain, no last write
        process = f"select state from pool_serverprocess where pid = {a.process.pid}"
        await asyncio.to_thread(wait_until, lambda: _query(db, process) == [("lost",)], 3 + 10,
                                "the killed process is lost")
        assert _query(db, f"select state, end_reason from pool_session where session_id = '{session_a}'") == [
            ("lost", "lost")]
        # The pool page lists units of running processes only: the killed one's are gone from it.
        live_units = ("select p.pid, u.state from pool_unit u join pool_serverprocess p on u.process_id = p.id "
                      "where p.state = 'running'")
        assert _query(db, live_units) == [(b.process.pid, "active")]
        assert _query(db, f"select state, ended_at from pool_session where session_id = '{session_b}'") == [
            ("active", None)]
        assert await _answered(ws_b)  # the other process's session goes on
        await ws_b.close()
        await ws_a.close()
        # A new process on the same host and database starts cleanly and serves.
        servers["c"] = await asyncio.to_thread(LiveServer, tmp_path / "c", env=env)
        ws_c, _ = await _session(servers["c"])
        assert await _answered(ws_c)
        await ws_c.close()
        states = dict(_query(db, "select pid, state from pool_serverprocess"))
        assert states == {a.process.pid: "lost", b.process.pid: "running", servers["c"].process.pid: "running"}
    finally:
        for name in "bc":
            if name in servers:
                assert servers[name].stop() == 0


async def test_a_hanging_stage_quarantines_its_unit_and_the_other_unit_keeps_serving(tmp_path):
    env = {**SCRIPTED, "S2S_JSON": json.dumps({"RELEASE_AFTER_SECONDS": 1.0})}
    server = await asyncio.to_thread(LiveServer, tmp_path, pool_size=2, env=env)
    try:
        stuck, stuck_id = await _session(server)
        await stuck.send(json.dumps({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": "__wedge__"}]}}))
        await stuck.send(json.dumps({"type": "response.create"}))
        while json.loads(await stuck.recv())["type"] != "response.created":
            pass
        await stuck.close()  # mid-response: the LLM stage is stuck inside generate
        row = f"select state from pool_session where session_id = '{stuck_id}'"
        await asyncio.to_thread(wait_until, lambda: server.query(row) == [("quarantined",)], 10,
                                "the hanging unit is quarantined")
        for _ in range(3):
            ws, _ = await _session(server)
            assert await _answered(ws)
            await ws.close()
        def health():
            return json.loads(urllib.request.urlopen(f"{server.http_url}/healthz", timeout=5).read())

        await asyncio.to_thread(wait_until, lambda: health()["idle"] == 1, 10, "the serving unit is idle")
        assert health()["pool_size"] == 2  # and the quarantined one stays out of service
    finally:
        assert server.stop() == 0


async def test_a_client_that_stops_reading_is_closed_and_its_unit_freed(tmp_path):
    """A client that never reads: the server's writes back up to Twisted's buffer, the session
    is closed after SLOW_CLIENT_SECONDS with client_too_slow, and the unit serves again."""
    env = {**SCRIPTED, "S2S_JSON": json.dumps({"SLOW_CLIENT_SECONDS": 2})}
    server = await asyncio.to_thread(LiveServer, tmp_path, env=env)
    try:
        ws = await misbehave.stuck_reader(server)
        for _ in range(100):
            await ws.send(misbehave.BIG_ITEM)
        ended = "select end_reason, close_code from pool_session"
        await asyncio.to_thread(wait_until, lambda: server.query(ended) == [("client_too_slow", 1008)], 60,
                                "the session of the client that stopped reading ends")
        ws.transport.abort()
        ws, _ = await _session(server)
        assert await _answered(ws)
        await ws.close()
    finally:
        assert server.stop() == 0


async def test_a_client_that_stops_reading_cannot_hold_up_a_shutdown(tmp_path):
    env = {**SCRIPTED, "S2S_JSON": json.dumps({"SLOW_CLIENT_SECONDS": 2})}
    server = await asyncio.to_thread(LiveServer, tmp_path, env=env)
    ws = await misbehave.stuck_reader(server)
    for _ in range(60):
        await ws.send(misbehave.BIG_ITEM)
    await asyncio.sleep(0.5)  # the server's writes to it are paused now
    # It stops by itself about 4 s after SIGTERM (SLOW_CLIENT_SECONDS, then the close), well
    # before the 30 s grace a stuck client would hold it for; no second signal before 15 s (at 5
    # s, a loaded machine sent it while the process was exiting: exit code -2).
    assert await asyncio.to_thread(server.stop, 30, 15) == 0
    assert server.query("select count(*) from pool_session where ended_at is not null") == [(1,)]
    ws.transport.abort()


@pytest.mark.postgres
async def test_sessions_go_on_through_a_postgresql_outage_and_no_record_is_lost(tmp_path):
    postgres = await asyncio.to_thread(PrivatePostgres)
    env = {**SCRIPTED, "DATABASE_URL": postgres.url, "S2S_JSON": json.dumps({"HEARTBEAT_SECONDS": 0.5})}
    server = None
    try:
        server = await asyncio.to_thread(LiveServer, tmp_path, pool_size=2, env=env)
        key = (await asyncio.to_thread(server.manage, "apikey", "create", "outage")).strip()
        first, first_id = await _session(server)
        outage = time.monotonic()
        await asyncio.to_thread(postgres.stop)
        # A key cannot be checked without the database: a clear, temporary refusal.
        async with websockets.connect(f"{server.base_url}/realtime",
                                      additional_headers={"Authorization": f"Bearer {key}"}) as keyed:
            error = json.loads(await keyed.recv())
            assert error["error"]["code"] == "database_unavailable"
            with pytest.raises(websockets.ConnectionClosed):
                await keyed.recv()
            assert keyed.close_code == 1013
        assert await _answered(first)  # sessions go on: nothing on their path waits for the database
        await first.close()
        second, second_id = await _session(server)
        assert await _answered(second)
        await second.close()
        third, third_id = await _session(server)
        await asyncio.sleep(max(0.0, 10 - (time.monotonic() - outage)))
        await asyncio.to_thread(postgres.start)

        def rows():
            with psycopg.connect(postgres.url) as db:
                return dict((r[0], r[1:]) for r in db.execute(
                    "select session_id, state, end_reason from pool_session").fetchall())

        expected = {first_id: ("ended", "client_close"), second_id: ("ended", "client_close"),
                    third_id: ("active", "")}  # the keyed client was refused: it had no session
        await asyncio.to_thread(wait_until, lambda: rows() == expected, 30, "every session row is written")
        assert await _answered(third)
        await third.close()
        async with websockets.connect(f"{server.base_url}/realtime",
                                      additional_headers={"Authorization": f"Bearer {key}"}) as keyed:
            assert json.loads(await keyed.recv())["type"] == "session.created"
        with psycopg.connect(postgres.url) as db:
            gap, state = db.execute("select longest_heartbeat_gap, state from pool_serverprocess").fetchone()
        assert state == "running" and gap >= 10  # the admin shows the outage as a heartbeat gap
        log = server.log.read_text()
        assert log.count("the database refused a write") == 1 and log.count("the database is back") == 1
    finally:
        if server is not None:
            assert server.stop() == 0
        await asyncio.to_thread(postgres.remove)



def test_clients_that_misbehave_at_random_leave_fds_and_memory_flat():
    """Sessions that end well, abruptly (a TCP reset mid-audio), half-open (a handshake never
    finished), or never read (closed after SLOW_CLIENT_SECONDS): after each round of them, the
    server holds the same file descriptors and no more memory (bench/misbehave.py runs 1,000)."""
    server = misbehave.start()
    try:
        result = misbehave.run(server, 160, 4)
    finally:
        assert server.stop() == 0
    rounds = [(r["fds"], r["rss_mb"]) for r in result["rounds"]]
    # The first two rounds warm up (lazily made objects, allocator pools); then it is flat.
    assert all(fds <= rounds[1][0] + 2 for fds, _ in rounds[2:]), rounds
    assert rounds[-1][1] - rounds[1][1] < 12, rounds  # MiB over the last 80 sessions
    reasons = result["end_reasons"]
    assert reasons.get("client_too_slow", 0) > 0 and sum(reasons.values()) > 100, reasons


def test_memory_levels_off_over_a_call_of_200_turns():
    """One session of 200 turns through the whole pipeline (real Silero VAD and Smart Turn,
    scripted STT, LLM and TTS; each turn a user message, a spoken reply, its audio read): after
    the first 100 turns, resident memory grows by less than 5 MB over the next 100 (a slope, not
    a time; bench/soak.py has the real models' 60-minute figure)."""
    server = misbehave.start(pool_size=1)

    async def call():
        rss = []
        ws, _ = await _session(server)
        for turn in range(200):
            await ws.send(json.dumps({"type": "conversation.item.create", "item": {
                "type": "message", "role": "user", "content": [{"type": "input_text", "text": f"Turn {turn}."}]}}))
            assert await _answered(ws)
            if turn % 20 == 19:
                rss.append(misbehave.fds_and_rss(server.process.pid)[1])
        await ws.close()
        return rss

    try:
        rss = asyncio.run(call())
    finally:
        assert server.stop() == 0
    assert rss[-1] - rss[4] < 5, rss  # MiB from turn 100 to turn 200


async def _voice_turn(server):
    """A spoken question (jfk.flac, then silence) on a new session: returns the session's id and
    the server events it got, once its reply is done."""
    from .helpers import appends, jfk_segment, silence

    ws, session_id = await _session(server)
    for append in appends(np.concatenate([jfk_segment(0.0, 2.6), silence(1.5)])):
        await ws.send(json.dumps(append))
    events = []
    while (event := json.loads(await asyncio.wait_for(ws.recv(), 30)))["type"] != "response.done":
        events.append(event)
    events.append(event)
    await ws.close()
    return session_id, events


@pytest.mark.parametrize("full", ["temporary folder", "media storage"])
async def test_a_full_disk_costs_the_recording_only_and_leaves_no_file(tmp_path, full):
    """Recordings on, and the temporary folder (where a recording is buffered) or the media
    storage (where it is kept) full: every turn is detected and answered, session after session;
    each recording stops with one log line; no file is left that no row points to."""
    folder = tmp_path / "full"
    folder.mkdir()
    (tmp_path / "server").mkdir()
    env = {**SCRIPTED, "S2S_JSON": json.dumps({"RECORD_AUDIO": True})}
    if full == "temporary folder":
        env["TMPDIR"], prefix = str(folder), full_filesystem_at(folder, 1 << 20)
    else:
        env["DJANGO_MEDIA_ROOT"], prefix = str(folder), full_filesystem_at(folder, 16384)
    server = await asyncio.to_thread(LiveServer, tmp_path / "server", env=env, command_prefix=prefix)
    seen = Path(f"/proc/{server.process.pid}/root") / folder.relative_to("/")  # the server's own view
    rows = "select user_audio, assistant_audio from pool_session where ended_at is not null order by id"
    try:
        if full == "temporary folder":
            # The folder fills up while the server runs: the first recording is kept, then none.
            await _voice_turn(server)
            await asyncio.to_thread(wait_until, lambda: any(user for user, _ in server.query(rows)), 10,
                                    "the first recording stored")
            await asyncio.to_thread(fill, seen)
        stopped = len(server.query(rows))
        for _ in range(2):
            session_id, events = await _voice_turn(server)
            assert events[-1]["response"]["status"] == "completed"
            assert "input_audio_buffer.committed" in [e["type"] for e in events]
            assert [e for e in events if e["type"] == "error"] == []
        await asyncio.to_thread(wait_until, lambda: len(server.query(rows)) == stopped + 2, 10, "the sessions ended")
        await asyncio.to_thread(wait_until, lambda: server.log.read_text().count("its recording stopped") == 2, 10,
                                "each recording's stop is logged")
        assert server.query(rows)[stopped:] == [("", ""), ("", "")]
        stored = {name for row in server.query(rows) for name in row if name}
        media = server.media if full == "temporary folder" else seen
        files = {str(p.relative_to(media)) for p in media.rglob("*") if p.is_file() and p.name != "filler"}
        assert files == stored  # every file kept is a recording a row points to
        assert "Traceback" not in server.log.read_text()
    finally:
        assert server.stop() == 0


def _health(server):
    try:
        with urllib.request.urlopen(f"{server.http_url}/healthz", timeout=5) as reply:
            return reply.status, json.loads(reply.read())["status"]
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())["status"]


async def test_sigterm_drains_live_calls_finish_and_new_ones_are_refused(tmp_path):
    """As a container platform stops a process: SIGTERM, then it waits. The health check says
    503 draining, a new client is refused (server_shutting_down, 1001), the live call goes on to
    its end, and then the process exits 0 without waiting out the grace period."""
    env = {**SCRIPTED, "S2S_JSON": json.dumps({"SHUTDOWN_GRACE_SECONDS": 60})}
    server = await asyncio.to_thread(LiveServer, tmp_path, pool_size=2, env=env)
    try:
        live, session_id = await _session(server)
        assert await asyncio.to_thread(_health, server) == (200, "ok")
        server.process.send_signal(signal.SIGTERM)
        await asyncio.to_thread(wait_until, lambda: _health(server) == (503, "draining"), 10, "health says draining")
        async with websockets.connect(f"{server.base_url}/realtime") as late:
            assert json.loads(await late.recv())["error"]["code"] == "server_shutting_down"
            with pytest.raises(websockets.ConnectionClosed):
                await late.recv()
            assert late.close_code == 1001
        assert await _answered(live)  # the live call goes on
        assert await _answered(live)
        await live.close()
        code = await asyncio.to_thread(server.process.wait, 20)  # well before the 60 s grace
        assert code == 0
        row = f"select end_reason, close_code from pool_session where session_id = '{session_id}'"
        assert server.query(row) == [("client_close", 1000)]
    finally:
        if server.process.poll() is None:
            server.process.kill()


async def test_sigterm_closes_what_is_still_live_after_the_grace_and_a_second_signal_stops_at_once(tmp_path):
    env = {**SCRIPTED, "S2S_JSON": json.dumps({"SHUTDOWN_GRACE_SECONDS": 1})}
    server = await asyncio.to_thread(LiveServer, tmp_path, env=env)
    live, session_id = await _session(server)
    server.process.send_signal(signal.SIGTERM)
    with pytest.raises(websockets.ConnectionClosed):
        while True:
            await asyncio.wait_for(live.recv(), 15)
    assert live.close_code == 1001
    assert await asyncio.to_thread(server.process.wait, 15) == 0
    assert server.query(f"select end_reason from pool_session where session_id = '{session_id}'") == [("shutdown",)]

    env = {**SCRIPTED, "S2S_JSON": json.dumps({"SHUTDOWN_GRACE_SECONDS": 600})}
    (tmp_path / "again").mkdir()
    server = await asyncio.to_thread(LiveServer, tmp_path / "again", env=env)
    live, _ = await _session(server)
    server.process.send_signal(signal.SIGTERM)
    await asyncio.to_thread(wait_until, lambda: _health(server)[0] == 503, 10, "draining")
    server.process.send_signal(signal.SIGINT)
    assert await asyncio.to_thread(server.process.wait, 15) == 0  # not 600 s
    assert "SIGINT again: stopping now" in server.log.read_text()

"""Two runpool processes on one PostgreSQL database and one Redis channel layer: one console for
both, operator commands that cross processes, and a Redis outage that sessions do not notice."""

import asyncio
import json
import re
import urllib.parse
import urllib.request
from contextlib import ExitStack
from http.cookiejar import CookieJar

import psycopg
import pytest
import websockets

from pool.testing import LiveServer, shared_services, wait_until


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with ExitStack() as stack:
        env, database, redis = shared_services(stack, RELEASE_AFTER_SECONDS=1.0, ALLOW_ANONYMOUS=True)
        a = stack.enter_context(LiveServer(tmp_path_factory.mktemp("a"), pool_size=1, env=env))
        b = stack.enter_context(LiveServer(tmp_path_factory.mktemp("b"), pool_size=1, env=env))
        a.create_admin()
        yield {"a": a, "b": b, "redis": redis, "db": database}


def query(cluster, sql, *args):
    with psycopg.connect(cluster["db"]) as db:
        return db.execute(sql, args).fetchall()


async def wedge_a_session(server):
    """A session whose LLM stage gets stuck; then the client leaves: the unit must quarantine."""
    async with websockets.connect(f"{server.base_url}/realtime") as ws:
        await ws.recv()
        await ws.send(json.dumps({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": "__wedge__"}]}}))
        await ws.send(json.dumps({"type": "response.create"}))
        while json.loads(await ws.recv())["type"] != "response.created":
            pass
        await asyncio.sleep(0.3)  # the LLM stage is inside generate


async def turn(server):
    async with websockets.connect(f"{server.base_url}/realtime") as ws:
        first = json.loads(await ws.recv())
        assert first["type"] == "session.created", first
        await ws.send(json.dumps({"type": "response.create"}))
        while (event := json.loads(await ws.recv()))["type"] != "response.done":
            pass
        return event["response"]["status"]


async def wait_unit_state(cluster, pid, state, timeout=10):
    rows = await asyncio.to_thread(wait_until, lambda: query(
        cluster, "SELECT u.id FROM pool_unit u JOIN pool_serverprocess p ON p.id = u.process_id "
                 "WHERE p.pid = %s AND u.state = %s", pid, state), timeout, f"a {state} unit of pid {pid}")
    return rows[0][0]


def admin_messages(page):
    return re.findall(r'<li class="(?:success|error|warning|info)">(.*?)</li>', page, re.S)


def release_through_admin(server, unit_pk):
    """Log into ``server``'s admin and post the Release action for ``unit_pk``; returns the page."""
    browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(CookieJar()))

    def get(path):
        return browser.open(server.http_url + path, timeout=30).read().decode()

    def post(path, data, page):
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
        body = urllib.parse.urlencode({"csrfmiddlewaretoken": token, **data}).encode()
        request = urllib.request.Request(server.http_url + path, data=body,
                                         headers={"Referer": server.http_url + path})
        return browser.open(request, timeout=30).read().decode()

    post("/admin/login/?next=/admin/", {"username": "admin", "password": "admin-pw", "next": "/admin/"},
         get("/admin/login/"))
    return post("/admin/pool/quarantinedunit/", {"action": "release_units", "_selected_action": str(unit_pk)},
                get("/admin/pool/quarantinedunit/"))


async def test_admin_of_process_a_releases_a_quarantined_unit_of_process_b(cluster):
    a, b = cluster["a"], cluster["b"]
    processes = query(cluster, "SELECT pid, state, control_channel FROM pool_serverprocess ORDER BY id")
    assert {p[0] for p in processes} == {a.process.pid, b.process.pid} and {p[1] for p in processes} == {"running"}
    async with websockets.connect(f"{a.base_url}/realtime") as holder:  # A's pool is full
        await holder.recv()
        await wedge_a_session(b)
        unit_pk = await wait_unit_state(cluster, b.process.pid, "quarantined")
        async with websockets.connect(f"{b.base_url}/realtime") as refused:  # B's pool is full too
            assert json.loads(await refused.recv())["error"]["code"] == "session_limit_reached"
        page = await asyncio.to_thread(release_through_admin, a, unit_pk)
        assert any("released by its process" in m for m in admin_messages(page)), admin_messages(page)
        assert await turn(b) == "completed"  # a client claims the released unit on B
    released = query(cluster, "SELECT s.state, u.username FROM pool_session s JOIN auth_user u "
                              "ON u.id = s.released_by_id")
    assert released == [("released", "admin")]


async def test_sessions_survive_a_redis_outage_and_commands_resume(cluster):
    a, b, redis = cluster["a"], cluster["b"], cluster["redis"]
    async with websockets.connect(f"{a.base_url}/realtime") as ws:
        await ws.recv()
        redis.stop()
        await ws.send(json.dumps({"type": "response.create"}))  # the session goes on without Redis
        while (event := json.loads(await ws.recv()))["type"] != "response.done":
            pass
        assert event["response"]["status"] == "completed"
        await asyncio.sleep(2)
        redis.start()
    await asyncio.sleep(2)  # B's control loop reconnects
    await wedge_a_session(b)
    unit_pk = await wait_unit_state(cluster, b.process.pid, "quarantined")
    page = await asyncio.to_thread(release_through_admin, a, unit_pk)
    assert any("released by its process" in m for m in admin_messages(page)), admin_messages(page)
    assert await turn(b) == "completed"

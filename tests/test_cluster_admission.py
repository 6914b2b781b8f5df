"""Cluster-wide admission with client secrets: two runpool processes (A with one unit, B with two)
on one PostgreSQL database and one Redis channel layer, as docs and deploy/compose.yaml run them.
Secrets are issued through A's HTTP endpoint and used at the process that holds their unit."""

import asyncio
import json
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack

import psycopg
import pytest
import websockets
from openai import AsyncOpenAI, RateLimitError

from pool.testing import LiveServer, free_port, shared_services, wait_until

pytestmark = [pytest.mark.live, pytest.mark.postgres, pytest.mark.redis]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with ExitStack() as stack:
        # The settings of deploy/compose.yaml: keys required, a shared database and layer.
        env, database, _redis = shared_services(stack, RELEASE_AFTER_SECONDS=2.0, CONNECTS_PER_MINUTE=None,
                                                HEARTBEAT_SECONDS=1.0)
        a, b = (stack.enter_context(LiveServer(tmp_path_factory.mktemp(name), pool_size=size, env=env, port=port,
                                               args=("--public-url", f"ws://127.0.0.1:{port}")))
                for name, size, port in (("a", 1, free_port()), ("b", 2, free_port())))
        key = a.manage("apikey", "create", "backend").strip()
        yield {"a": a, "b": b, "db": database, "key": key}


def query(cluster, sql, *args):
    with psycopg.connect(cluster["db"], autocommit=True) as db:
        cursor = db.execute(sql, args)
        return cursor.fetchall() if cursor.description else None


@pytest.fixture(autouse=True)
def no_reservations(cluster):
    """Each test starts with every unit idle and free (a test's secrets may outlive it)."""
    wait_until(lambda: not query(cluster, "SELECT 1 FROM pool_unit u JOIN pool_serverprocess p ON "
                                          "p.id = u.process_id WHERE p.state = 'running' AND u.state <> 'idle'"),
               10, "every unit idle")
    expire_secrets(cluster)


def expire_secrets(cluster):
    """Expire every unused secret, as if its time had run out."""
    query(cluster, "UPDATE pool_clientsecret SET expires_at = now() WHERE used_at IS NULL")
    query(cluster, "UPDATE pool_unit SET reserved_until = NULL")


def issue(cluster, server="a", **body):
    """POST /v1/realtime/client_secrets at ``server``; returns (status, body, headers)."""
    import urllib.error
    import urllib.request

    request = urllib.request.Request(f"{cluster[server].http_url}/v1/realtime/client_secrets",
                                     data=json.dumps(body).encode(), method="POST",
                                     headers={"Authorization": f"Bearer {cluster['key']}",
                                              "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, json.load(reply), dict(reply.headers)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error), dict(error.headers)


def process_of(cluster, url):
    """"a" or "b": the server whose port ``url`` names."""
    return next(name for name in ("a", "b") if f":{cluster[name].port}/" in url)


def reserved(cluster):
    """(pid, unit index) of every reserved unit."""
    return sorted(query(cluster, "SELECT p.pid, u.index FROM pool_unit u JOIN pool_serverprocess p ON "
                                 "p.id = u.process_id WHERE u.reserved_until > now()"))


async def open_session(url, secret):
    ws = await websockets.connect(url, additional_headers={"Authorization": f"Bearer {secret}"})
    first = json.loads(await ws.recv())
    return ws, first


async def turn(ws):
    await ws.send(json.dumps({"type": "response.create"}))
    while (event := json.loads(await ws.recv()))["type"] != "response.done":
        pass
    return event["response"]["status"]


async def test_three_secrets_reserve_every_unit_and_each_opens_its_own(cluster):
    a, b = cluster["a"], cluster["b"]
    grants = [await asyncio.to_thread(issue, cluster, session={"instructions": f"Secret {i}."}) for i in range(3)]
    assert [status for status, _, _ in grants] == [200] * 3, grants
    assert reserved(cluster) == sorted([(a.process.pid, 0), (b.process.pid, 0), (b.process.pid, 1)])
    status, body, headers = await asyncio.to_thread(issue, cluster)
    assert status == 429 and body["error"]["code"] == "session_limit_reached" and int(headers["Retry-After"]) > 0

    at_b = next(body for _, body, _ in grants if process_of(cluster, body["connect_url"]) == "b")
    wrong = at_b["connect_url"].replace(f":{b.port}/", f":{a.port}/")
    ws, refused = await open_session(wrong, at_b["value"])  # another process's secret
    assert refused["error"]["code"] == "invalid_api_key" and f":{b.port}" in refused["error"]["message"]
    await ws.close()

    sessions = []
    for i, (_, body, _) in enumerate(grants):
        ws, created = await open_session(body["connect_url"], body["value"])
        assert created["type"] == "session.created" and created["session"]["instructions"] == f"Secret {i}."
        assert await turn(ws) == "completed"
        sessions.append((process_of(cluster, body["connect_url"]), ws))
    assert reserved(cluster) == []  # used: the reservations became sessions
    assert (await asyncio.to_thread(issue, cluster))[0] == 429  # every unit busy

    name, ws = next(s for s in sessions if s[0] == "a")
    await ws.close()  # A's unit drains, then a new secret gets it
    status, body, _ = await asyncio.to_thread(
        wait_until, lambda: (grant := issue(cluster))[0] == 200 and grant, 10, "a secret for the freed unit")
    assert process_of(cluster, body["connect_url"]) == "a"
    for _, ws in sessions:
        await ws.close()


async def test_fifty_concurrent_requests_against_three_free_units_get_exactly_three(cluster):
    with ThreadPoolExecutor(50) as threads:  # half at each process: two issuers race on the database
        replies = await asyncio.to_thread(
            lambda: list(threads.map(lambda i: issue(cluster, "ab"[i % 2]), range(50))))
    statuses = sorted(status for status, _, _ in replies)
    assert statuses == [200] * 3 + [429] * 47
    units = query(cluster, "SELECT process_id, unit_index FROM pool_clientsecret "
                           "WHERE used_at IS NULL AND expires_at > now()")
    assert len(units) == len(set(units)) == 3  # no unit reserved twice
    assert len(reserved(cluster)) == 3


async def test_an_expired_secret_frees_its_unit(cluster):
    grants = [await asyncio.to_thread(issue, cluster, expires_after={"seconds": 2}) for _ in range(3)]
    assert [g[0] for g in grants] == [200] * 3
    assert (await asyncio.to_thread(issue, cluster))[0] == 429
    await asyncio.sleep(2.5)
    assert reserved(cluster) == []
    status, body, _ = await asyncio.to_thread(issue, cluster)
    assert status == 200
    ws, expired = await open_session(grants[0][1]["connect_url"], grants[0][1]["value"])
    assert expired["error"]["code"] == "invalid_api_key"
    await ws.close()


async def test_the_openai_sdk_creates_a_secret_and_connects_with_it(cluster):
    backend = AsyncOpenAI(api_key=cluster["key"], base_url=f"{cluster['a'].http_url}/v1")
    secret = await backend.realtime.client_secrets.create(
        session={"type": "realtime", "instructions": "You are a ship's cat."},
        expires_after={"anchor": "created_at", "seconds": 60})
    assert secret.value.startswith("ek_") and secret.session.instructions == "You are a ship's cat."
    connect_url = secret.model_extra["connect_url"]
    browser = AsyncOpenAI(api_key=secret.value, websocket_base_url=connect_url.removesuffix("/realtime"))
    async with browser.realtime.connect(model="s2s-default") as connection:
        created = await connection.recv()
        assert created.type == "session.created" and created.session.instructions == "You are a ship's cat."
        await connection.response.create()
        async for event in connection:
            if event.type == "response.done":
                assert event.response.status == "completed"
                break
    for _ in range(3):  # the SDK raises its own RateLimitError for our 429
        await backend.realtime.client_secrets.create()
    with pytest.raises(RateLimitError):
        await backend.realtime.client_secrets.create()


def test_a_process_joins_the_cluster_only_once_it_listens(cluster):
    """Other processes hand out a process's units (client secrets) from the moment its row is
    live. A row written while the process still loaded sent clients to a port nobody answered,
    and each unused secret then held the unit until it expired (test_proxy's rolling restart
    failed so once in CI). A process that cannot listen at all (its port is taken) never joins,
    and exits non-zero, saying why: a supervisor restarts a failure, not a clean stop."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = subprocess.Popen(
            [sys.executable, "manage.py", "runpool", "--port", str(port), "--pool-size", "1",
             "--public-url", f"ws://127.0.0.1:{port}"], env=cluster["a"].env,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        output, _ = server.communicate(timeout=300)
    assert server.returncode == 1, output
    assert "Address already in use" in output and f"could not listen on 127.0.0.1:{port}" in output
    assert query(cluster, "SELECT count(*) FROM pool_serverprocess WHERE pid = %s", server.pid) == [(0,)]
    status, body, _ = issue(cluster)  # and the cluster goes on as before
    assert status == 200 and process_of(cluster, body["connect_url"]) in ("a", "b")


async def test_a_drained_process_gets_no_reservations_and_stops_when_its_session_ends(cluster):
    """Last in this module: B stops."""
    a, b = cluster["a"], cluster["b"]
    status, body, _ = await asyncio.to_thread(issue, cluster)
    while status == 200 and process_of(cluster, body["connect_url"]) != "b":
        status, body, _ = await asyncio.to_thread(issue, cluster)
    ws, created = await open_session(body["connect_url"], body["value"])  # a session on B
    assert created["type"] == "session.created"
    expire_secrets(cluster)
    b_id = query(cluster, "SELECT id FROM pool_serverprocess WHERE pid = %s", b.process.pid)[0][0]
    out = await asyncio.to_thread(a.manage, "drain_process", str(b_id))
    assert "is draining" in out
    grants = [await asyncio.to_thread(issue, cluster) for _ in range(2)]  # B has a free unit, but drains
    assert [g[0] for g in grants] == [200, 429]
    assert process_of(cluster, grants[0][1]["connect_url"]) == "a"
    # B learns it drains through the channel layer (or its next heartbeat); its health check says so.
    await asyncio.to_thread(wait_until, lambda: _health_status(b) == 503, 10, "B says it drains")
    plain = await websockets.connect(f"{b.base_url}/realtime",
                                     additional_headers={"Authorization": f"Bearer {cluster['key']}"})
    assert json.loads(await plain.recv())["error"]["code"] == "server_shutting_down"
    assert await turn(ws) == "completed"  # its live session goes on
    assert b.process.poll() is None
    await ws.close()
    assert await asyncio.to_thread(b.process.wait, 30) == 0  # and then it stops by itself
    assert query(cluster, "SELECT state FROM pool_serverprocess WHERE id = %s", b_id) == [("stopped",)]


def _health_status(server):
    try:
        with urllib.request.urlopen(f"{server.http_url}/healthz", timeout=5) as reply:
            return reply.status
    except urllib.error.HTTPError as error:
        return error.code

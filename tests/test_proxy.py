"""The deployment for real: Debian's Caddy running the shipped ``deploy/Caddyfile``
(``tests/proxy.py``) in front of two ``runpool`` processes on PostgreSQL and Redis, as
``deploy/compose.yaml`` runs them (A with one unit at ``/a``, B with two at ``/b``, keys
required, the proxy trusted for ``X-Forwarded-For``), driven through the proxy by the stock SDK."""

import asyncio
import json
import signal
import time
import urllib.error
import urllib.request
from contextlib import ExitStack

import psycopg
import pytest
import websockets
from openai import AsyncOpenAI

from pool.testing import LiveServer, free_port, shared_services, wait_until

from .helpers import speech_appends
from .proxy import Caddy
from .webrtc_client import WebRTCClient

pytestmark = [pytest.mark.live, pytest.mark.postgres, pytest.mark.redis, pytest.mark.proxy]

CLIENT, FORGER = "127.0.0.5", "127.0.0.6"  # loopback addresses the test's clients connect from


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    with ExitStack() as stack:
        # Caddy connects to the processes from 127.0.0.1: the one proxy they trust.
        env, database, _redis = shared_services(stack, RELEASE_AFTER_SECONDS=2.0, CONNECTS_PER_MINUTE=None,
                                                HEARTBEAT_SECONDS=1.0, TRUSTED_PROXIES=["127.0.0.1"])
        ports = {"a": free_port(), "b": free_port()}
        proxy = stack.enter_context(Caddy(tmp_path_factory.mktemp("caddy"), {
            "a:8000": f"127.0.0.1:{ports['a']}", "b:8000": f"127.0.0.1:{ports['b']}"}))
        servers = {name: stack.enter_context(LiveServer(
            tmp_path_factory.mktemp(name), pool_size=size, env=env, port=ports[name],
            args=("--public-url", f"{proxy.ws_url}/{name}"))) for name, size in (("a", 1), ("b", 2))}
        key = servers["a"].manage("apikey", "create", "backend").strip()
        # Until Caddy's active health check has seen both processes up.
        wait_until(lambda: {_get(f"{proxy.http_url}/healthz")[0] for _ in range(6)} == {200}, 20, "both healthy")

        def restart(name):
            """A new ``runpool`` for process ``name``, as a platform starts a replaced container."""
            servers[name] = stack.enter_context(LiveServer(
                tmp_path_factory.mktemp(name), pool_size={"a": 1, "b": 2}[name], env=env, port=ports[name],
                args=("--public-url", f"{proxy.ws_url}/{name}")))
            return servers[name]

        deployment = {"proxy": proxy, "db": database, "key": key, "restart": restart, "servers": servers}
        yield deployment


def _get(url, headers=None):
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()
    except OSError:
        return 0, ""


def query(deployment, sql, *args):
    with psycopg.connect(deployment["db"], autocommit=True) as db:
        return db.execute(sql, args).fetchall()


async def test_a_client_secret_from_the_shared_path_and_a_voice_turn_at_its_prefix(deployment):
    proxy = deployment["proxy"]
    backend = AsyncOpenAI(api_key=deployment["key"], base_url=f"{proxy.http_url}/v1")
    secret = await backend.realtime.client_secrets.create(session={"type": "realtime"})
    connect_url = secret.model_extra["connect_url"]
    assert connect_url.startswith((f"{proxy.ws_url}/a/", f"{proxy.ws_url}/b/"))
    client = AsyncOpenAI(api_key=secret.value, websocket_base_url=connect_url.removesuffix("/realtime"))
    async with client.realtime.connect(model="s2s-default") as conn:
        assert (await conn.recv()).type == "session.created"
        for event in speech_appends():
            await conn.input_audio_buffer.append(audio=event["audio"])
        async for event in conn:
            if event.type == "response.done":
                assert event.response.status == "completed"
                break


async def test_an_api_key_client_on_the_load_balanced_path(deployment):
    client = AsyncOpenAI(api_key=deployment["key"], websocket_base_url=f"{deployment['proxy'].ws_url}/v1")
    async with client.realtime.connect(model="s2s-default") as conn:
        assert (await conn.recv()).type == "session.created"
        await conn.response.create()
        async for event in conn:
            if event.type == "response.done":
                assert event.response.status == "completed"
                break


def test_the_page_the_admin_and_the_health_checks_through_the_proxy(deployment):
    proxy = deployment["proxy"]
    status, page = _get(f"{proxy.http_url}/")
    assert status == 200 and "Talk to the voice agent" in page
    assert _get(f"{proxy.http_url}/admin/login/")[0] == 200
    assert [_get(f"{proxy.http_url}/{name}/healthz")[0] for name in ("a", "b")] == [200, 200]


async def test_sessions_record_the_address_the_proxy_saw_and_not_a_forged_one(deployment):
    proxy, a = deployment["proxy"], deployment["servers"]["a"]
    headers = {"Authorization": f"Bearer {deployment['key']}"}
    async with websockets.connect(f"{proxy.ws_url}/a/v1/realtime", additional_headers=headers,
                                  local_addr=(CLIENT, 0)) as ws:
        through = json.loads(await ws.recv())["session"]["id"]
    forged = {**headers, "X-Forwarded-For": "203.0.113.9"}
    async with websockets.connect(f"{a.base_url}/realtime", additional_headers=forged, local_addr=(FORGER, 0)) as ws:
        direct = json.loads(await ws.recv())["session"]["id"]
    def rows():  # the recorders write them in the background
        return dict(query(deployment, "SELECT session_id, host(client_address) FROM pool_session "
                                      "WHERE session_id IN (%s, %s)", through, direct))

    await asyncio.to_thread(wait_until, lambda: len(rows()) == 2, 10, "both rows written")
    assert rows() == {through: CLIENT, direct: FORGER}


async def test_webrtc_signalling_goes_through_the_proxy_and_the_media_straight_to_the_process(deployment):
    proxy = deployment["proxy"]
    backend = AsyncOpenAI(api_key=deployment["key"], base_url=f"{proxy.http_url}/v1")
    secret = await backend.realtime.client_secrets.create(session={"type": "realtime", "instructions": "Hi."})
    calls_url = secret.model_extra["calls_url"]
    assert calls_url.startswith((f"{proxy.http_url}/a/", f"{proxy.http_url}/b/"))

    def post_blocking(sdp):
        request = urllib.request.Request(calls_url, data=sdp.encode(), method="POST", headers={
            "Content-Type": "application/sdp", "Authorization": f"Bearer {secret.value}"})
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, dict(reply.headers), reply.read().decode()

    client = WebRTCClient()
    status, headers, _ = await client.call(lambda sdp: asyncio.to_thread(post_blocking, sdp))
    assert status == 201 and headers["Location"].startswith(f"{calls_url}/rtc_")  # its hangup: this process
    created = await client.until("session.created")
    assert created["session"]["instructions"] == "Hi."
    client.send({"type": "response.create"})
    assert (await client.until("response.done"))["response"]["status"] == "completed"
    await client.hangup()


def _idle(deployment, name):
    """True when every unit of process ``name`` is idle (its ``/healthz``, through the proxy)."""
    status, body = _get(f"{deployment['proxy'].http_url}/{name}/healthz")
    health = json.loads(body) if status == 200 else {}
    return health.get("idle") is not None and health["idle"] == health["pool_size"]


def _secret(deployment):
    """``(status, body)`` of POST /v1/realtime/client_secrets on the proxy's shared path."""
    request = urllib.request.Request(f"{deployment['proxy'].http_url}/v1/realtime/client_secrets", data=b"{}",
                                     method="POST", headers={"Authorization": f"Bearer {deployment['key']}",
                                                             "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status, json.load(reply)
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


async def _completed_turn(ws):
    await ws.send(json.dumps({"type": "response.create"}))
    while (event := json.loads(await ws.recv()))["type"] != "response.done":
        if event["type"] == "error":
            return False
    return event["response"]["status"] == "completed"


async def _call_at(deployment, name):
    """A live call on process ``name`` (its prefix through the proxy)."""
    ws = await websockets.connect(f"{deployment['proxy'].ws_url}/{name}/v1/realtime",
                                  additional_headers={"Authorization": f"Bearer {deployment['key']}"})
    first = json.loads(await ws.recv())
    assert first["type"] == "session.created", first
    return ws


async def test_a_rolling_restart_drops_no_call_and_refuses_no_connect(deployment):
    """Last in this module: both processes are replaced, one after the other (A drained by
    ``drain_process``, B stopped by SIGTERM). While one drains
    and restarts, its live call and the other's go on until their users hang up, and new
    clients (client secrets from the shared path, then a session at their connect_url) keep
    being served by whichever process has a free unit and is not draining."""
    counts = {"dropped": 0, "refused": 0, "served": 0, "turns": 0}
    refusals = []  # why, for the failure message
    stop = asyncio.Event()

    async def keep_talking(ws):
        while not stop.is_set():
            try:
                ok = await _completed_turn(ws)
            except websockets.ConnectionClosed:
                return  # hung up by the test (below), never by the server: checked there
            counts["turns" if ok else "dropped"] += 1
            await asyncio.sleep(0.3)

    async def new_clients():
        while not stop.is_set():
            status, body = await asyncio.to_thread(_secret, deployment)
            if status != 200:
                counts["refused"] += 1
                refusals.append((round(time.monotonic(), 1), status, body.get("error", {}).get("code")))
            else:
                try:
                    async with websockets.connect(body["connect_url"], additional_headers={
                            "Authorization": f"Bearer {body['value']}"}) as ws:
                        created = json.loads(await ws.recv())
                        ok = created["type"] == "session.created" and await _completed_turn(ws)
                    counts["served" if ok else "refused"] += 1
                    if not ok:
                        refusals.append((round(time.monotonic(), 1), "session", created))
                except (OSError, websockets.InvalidStatus, websockets.ConnectionClosed) as error:
                    counts["refused"] += 1
                    refusals.append((round(time.monotonic(), 1), "connect", repr(error)[:200]))
            await asyncio.sleep(0.2)

    calls = {name: await _call_at(deployment, name) for name in ("a", "b")}
    talkers = {name: asyncio.create_task(keep_talking(ws)) for name, ws in calls.items()}
    connector = asyncio.create_task(new_clients())
    times = {}
    for name in ("a", "b"):
        server = deployment["servers"][name]
        started = time.monotonic()
        if name == "a":  # an operator's drain
            process_id = query(deployment, "SELECT id FROM pool_serverprocess WHERE pid = %s",
                               server.process.pid)[0][0]
            await asyncio.to_thread(server.manage, "drain_process", str(process_id))
        else:  # a container platform's stop: SIGTERM, then its grace period
            server.process.send_signal(signal.SIGTERM)
        await asyncio.to_thread(wait_until, lambda s=server: _get(f"{s.http_url}/healthz")[0] == 503, 10,
                                f"{name} says it drains")
        await asyncio.sleep(2)  # the call on it goes on meanwhile (its talker counts its turns)
        assert server.process.poll() is None  # still serving its live call
        talkers[name].cancel()
        await calls[name].close()  # the user hangs up; the drained process then stops
        assert await asyncio.to_thread(server.process.wait, 30) == 0
        left = time.monotonic() - started
        await asyncio.to_thread(deployment["restart"], name)
        health = f"{deployment['proxy'].http_url}/{name}/healthz"
        await asyncio.to_thread(wait_until, lambda url=health: _get(url)[0] == 200, 30, f"{name} back")
        times[name] = {"left_s": round(left, 1), "back_s": round(time.monotonic() - started, 1)}
        # Back, it takes the new clients while the next process restarts (A has one unit: a
        # live call of its own now would leave no free unit anywhere during B's drain).
    await asyncio.sleep(2)
    stop.set()
    await connector  # the talkers were cancelled as their users hung up
    print("rolling restart:", json.dumps({**counts, "times": times}))
    # Before the calls below: a refused connect may leave an unused secret holding a unit.
    assert counts["dropped"] == 0 and counts["refused"] == 0, refusals
    assert counts["served"] >= 10 and counts["turns"] >= 10
    for name in ("a", "b"):  # both replaced processes take live calls again, once free
        # A has one unit: the connector's last session may have ended a moment ago, its
        # disconnect not yet handled (a new client then is refused, as it should be).
        await asyncio.to_thread(wait_until, lambda n=name: _idle(deployment, n), 10, f"{name}'s units idle")
        ws = await _call_at(deployment, name)
        assert await _completed_turn(ws)
        await ws.close()

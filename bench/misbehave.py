"""Misbehaving clients: sessions that end well, abruptly (a TCP reset mid-audio), half-open (a
handshake never finished) or never read what the server sends (closed by the server after
SLOW_CLIENT_SECONDS), chosen at random, one after another. The server's open file descriptors
and RSS after each round, once its units are idle again, and how the sessions ended.

    python -m bench.misbehave [--sessions 1000] [--rounds 10]

On the scripted test backend: the models are not what is measured.
"""

import argparse
import asyncio
import json
import os
import random
import socket
import time
import urllib.request

import websockets

from .common import emit, rss_mb, start_server

SILENCE = json.dumps({"type": "input_audio_buffer.append", "audio": "AAAA" * 1600})  # 200 ms
BIG_ITEM = json.dumps({"type": "conversation.item.create", "item": {  # echoed back, 2 x 100 kB
    "type": "message", "role": "user", "content": [{"type": "input_text", "text": "word " * 20_000}]}})


async def _session(server):
    ws = await websockets.connect(f"{server.base_url}/realtime", max_size=None)
    assert json.loads(await ws.recv())["type"] == "session.created"
    return ws


async def well(server):
    """A response asked for and awaited, then a clean close."""
    ws = await _session(server)
    await ws.send(json.dumps({"type": "response.create"}))
    while json.loads(await ws.recv())["type"] != "response.done":
        pass
    await ws.close()


async def reset(server):
    """Audio, then the TCP connection dropped without a close."""
    ws = await _session(server)
    await ws.send(SILENCE)
    ws.transport.abort()


async def half_open(server):
    """A WebSocket handshake that never finishes."""
    _, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"GET /v1/realtime HTTP/1.1\r\nHost: x\r\n")
    await asyncio.sleep(0.2)
    writer.transport.abort()


async def stuck_reader(server):
    """A connected client that will read nothing: a small receive buffer, and the client
    library stops reading once one message waits (max_queue=1)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", server.port))
    return await websockets.connect(f"{server.base_url}/realtime", sock=sock, max_queue=1, max_size=None)


async def never_reads(server, slow_client_seconds=1.0):
    """Asks for a lot and reads nothing."""
    ws = await stuck_reader(server)
    try:
        for _ in range(60):
            await ws.send(BIG_ITEM)
        await asyncio.sleep(slow_client_seconds + 0.5)  # the server gives up on it first
    except websockets.ConnectionClosed:  # it already has (a busy machine sends slowly)
        pass
    ws.transport.abort()


CLIENTS = (well, reset, half_open, never_reads)


def fds_and_rss(pid):
    """Open file descriptors and resident memory (MiB) of a process, from /proc."""
    return len(os.listdir(f"/proc/{pid}/fd")), round(rss_mb(pid), 1)


def _idle(server):
    with urllib.request.urlopen(f"{server.http_url}/healthz", timeout=5) as reply:
        health = json.load(reply)
    return health["idle"] == health["pool_size"]


async def _round(server, sessions, rng):
    for _ in range(sessions):
        await rng.choice(CLIENTS)(server)
    deadline = time.monotonic() + 30
    while not await asyncio.to_thread(_idle, server):
        if time.monotonic() > deadline:
            raise RuntimeError("the units did not return to idle")
        await asyncio.sleep(0.1)
    await asyncio.sleep(0.5)
    fds, rss = fds_and_rss(server.process.pid)
    return {"sessions": sessions, "fds": fds, "rss_mb": rss}


def run(server, sessions, rounds, seed=13):
    """``sessions`` clients over ``rounds`` rounds, on a server with SLOW_CLIENT_SECONDS 1.
    Returns {"rounds": [{"sessions", "fds", "rss_mb"}], "end_reasons": {reason: count}}."""
    rng = random.Random(seed)
    per_round = [sessions // rounds + (i < sessions % rounds) for i in range(rounds)]

    async def all_rounds():
        return [await _round(server, n, rng) for n in per_round]

    result = asyncio.run(all_rounds())
    reasons = dict(server.query("select end_reason, count(*) from pool_session group by end_reason"))
    return {"rounds": result, "end_reasons": reasons}


def start(pool_size=2):
    """The scripted server this benchmark needs."""
    return start_server(pool_size, {"SLOW_CLIENT_SECONDS": 1}, backend="scripted")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args(argv)
    server = start()
    try:
        emit("misbehave", run(server, args.sessions, args.rounds))
    finally:
        server.stop()


if __name__ == "__main__":
    main()

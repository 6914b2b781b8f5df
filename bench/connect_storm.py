"""Connect storm: many clients connect at once to a small pool. Exactly pool-size claims, every
other client a clean ``session_limit_reached`` error then close 1008, no unit claimed twice.

    python -m bench.connect_storm [--clients 200] [--pool 4]
"""

import argparse
import asyncio
import json
import time
import urllib.request

import websockets

from .common import TOKEN, emit, start_server, stats


async def one_client(url, results, hold):
    started = time.perf_counter()
    try:
        async with websockets.connect(url) as ws:
            first = json.loads(await ws.recv())
            elapsed = (time.perf_counter() - started) * 1000
            if first["type"] == "session.created":
                results.append(("claimed", elapsed, first["session"]["id"]))
                await hold.wait()
                return
            code = first.get("error", {}).get("code")
            try:
                await ws.recv()
            except websockets.ConnectionClosed:
                pass
            results.append(("rejected", (time.perf_counter() - started) * 1000, (code, ws.close_code)))
    except Exception as exc:  # noqa: BLE001 - a failed connect is a result, reported as such
        results.append(("failed", (time.perf_counter() - started) * 1000, repr(exc)))


def pool_status(server):
    request = urllib.request.Request(f"{server.http_url}/v1/pool", headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(request, timeout=5) as reply:
        return json.load(reply)


async def storm(server, clients):
    results, hold = [], asyncio.Event()
    tasks = [asyncio.create_task(one_client(f"{server.base_url}/realtime", results, hold)) for _ in range(clients)]
    while len(results) < clients and not all(t.done() for t in tasks):
        await asyncio.sleep(0.05)
    status = await asyncio.to_thread(pool_status, server)
    hold.set()
    await asyncio.gather(*tasks)
    return results, status


def run(server, clients, pool):
    results, status = asyncio.run(storm(server, clients))
    claimed = [r for r in results if r[0] == "claimed"]
    rejected = [r for r in results if r[0] == "rejected"]
    clean = [r for r in rejected if r[2] == ("session_limit_reached", 1008)]
    active = sorted(u["session_id"] for u in status["units"] if u["state"] == "active")
    return {
        "clients": clients, "pool_size": pool, "claims": len(claimed), "clean_rejections": len(clean),
        "other_outcomes": [r for r in results if r[0] == "failed" or (r[0] == "rejected" and r not in clean)][:5],
        "no_unit_claimed_twice": active == sorted(r[2] for r in claimed) and len(set(active)) == len(active),
        "connect_to_session_created_ms": stats([r[1] for r in claimed]),
        "rejection_ms": stats([r[1] for r in rejected]),
        "target_met": len(claimed) == pool and len(clean) == clients - pool,
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--pool", type=int, default=4)
    args = parser.parse_args(argv)
    server = start_server(args.pool, {"STATUS_TOKEN": TOKEN})
    try:
        emit("connect_storm", run(server, args.clients, args.pool))
    finally:
        server.stop()


if __name__ == "__main__":
    main()

"""Throughput under load: every unit of a pool in conversation at once; turn latency p50/p95, so
operators can size the pool for their cores.

    python -m bench.throughput [--pools 2,4] [--rounds 2]
"""

import argparse
import asyncio

from .common import RECORDINGS, emit, start_server, stats
from .driver import converse, turns

SESSION = {"audio": {"input": {"turn_detection": {"interrupt_response": False}}}}


async def everyone(server, pool, rounds):
    names = ["hotwords", "stereo"]

    async def client(i):
        rows = []
        for r in range(rounds):
            conversation = await converse(f"{server.base_url}/realtime", RECORDINGS[names[(i + r) % 2]], SESSION)
            rows += turns(conversation)
        return rows

    results = await asyncio.gather(*(client(i) for i in range(pool)))
    return [row for rows in results for row in rows]


def run(server, pool, rounds):
    rows = asyncio.run(everyone(server, pool, rounds))
    return {"pool_size": pool, "concurrent_sessions": pool, "turns": len(rows),
            "first_audio_ms": stats([r["first_audio"] for r in rows]),
            "transcript_ms": stats([r["transcript"] for r in rows])}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pools", default="2,4")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    results = []
    for pool in (int(p) for p in args.pools.split(",")):
        server = start_server(pool)
        try:
            results.append(run(server, pool, args.rounds))
        finally:
            server.stop()
    emit("throughput_under_load", {"silence_ms": 500, "pools": results})


if __name__ == "__main__":
    main()

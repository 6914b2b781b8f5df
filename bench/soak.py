"""Soak: many sessions in a row, then one session in looping conversation for a long time.
Resident memory, threads and file descriptors of the server at the start and the end, the
server's RSS at every minute of the call, and once the call has ended and its unit drained.

    python -m bench.soak [--minutes 60] [--sessions 1000]
"""

import argparse
import asyncio
import base64
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import websockets

from realtime.client import CHUNK_MS, load_audio, pcm16_chunks

from .common import RECORDINGS, emit, rss_mb, start_server


def sample(pid):
    """Resident MiB, threads and open file descriptors of a process."""
    threads = next(int(line.split()[1]) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                   if line.startswith("Threads:"))
    return {"rss_mb": round(rss_mb(pid), 1), "threads": threads, "fds": len(os.listdir(f"/proc/{pid}/fd"))}


async def looping_conversation(server, seconds):
    pause = np.zeros(3 * 24_000, np.float32)
    audio = np.concatenate([part for name in ("hotwords", "stereo", "jfk")
                            for part in (load_audio(RECORDINGS[name]), pause)])
    chunks = [base64.b64encode(c).decode() for c in pcm16_chunks(audio)]
    counts = {"responses_completed": 0, "responses_cancelled": 0, "errors": 0}
    samples = {}
    async with websockets.connect(f"{server.base_url}/realtime", max_size=None) as ws:
        await ws.recv()
        t0 = time.perf_counter()
        stop_at = t0 + seconds

        async def receive():
            while True:
                event = json.loads(await ws.recv())
                if event["type"] == "response.done":
                    key = f"responses_{event['response']['status']}"
                    counts[key] = counts.get(key, 0) + 1
                    if "start" not in samples:
                        samples["start"] = sample(server.process.pid)
                elif event["type"] == "error":
                    counts["errors"] += 1

        receiver = asyncio.create_task(receive())
        i, per_minute = 0, []
        while time.perf_counter() < stop_at:
            await asyncio.sleep(max(0.0, t0 + i * CHUNK_MS / 1000 - time.perf_counter()))
            await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": chunks[i % len(chunks)]}))
            i += 1
            if i * CHUNK_MS >= 60_000 * (len(per_minute) + 1):
                per_minute.append(sample(server.process.pid)["rss_mb"])
                print(f"minute {len(per_minute)}: RSS {per_minute[-1]} MB, {counts}", file=sys.stderr, flush=True)
        await asyncio.sleep(5)
        receiver.cancel()
    samples["end"] = sample(server.process.pid)
    await asyncio.sleep(10)  # the unit drains; nothing else runs
    after = sample(server.process.pid)
    return {"seconds": seconds, **counts, "start": samples.get("start"), "end": samples["end"],
            "rss_mb_per_minute": per_minute, "after_call": after}


async def sessions_in_a_row(server, n):
    """``n`` sessions, one after the other, each closed as soon as it has sent 200 ms of audio.
    A client reconnects right after its close; a refusal is counted, not retried."""
    tiny = base64.b64encode(bytes(9600)).decode()  # 200 ms of silence
    start = sample(server.process.pid)
    served, refused = 0, 0
    for _ in range(n):
        async with websockets.connect(f"{server.base_url}/realtime") as ws:
            first = json.loads(await ws.recv())
            if first["type"] != "session.created":
                refused += 1
                continue
            served += 1
            await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": tiny}))
    await asyncio.sleep(2)
    return {"sessions": n, "served": served, "refused": refused, "start": start,
            "end": sample(server.process.pid)}


def run(server, seconds, sessions):
    """Sessions in a row first (minutes), then the long conversation."""
    return {"sessions_in_a_row": asyncio.run(sessions_in_a_row(server, sessions)),
            "looping_conversation": asyncio.run(looping_conversation(server, seconds))}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--minutes", type=float, default=60)
    parser.add_argument("--sessions", type=int, default=1000)
    args = parser.parse_args(argv)
    server = start_server(1, {"MAX_SESSION_SECONDS": None})  # the call may pass OpenAI's 60 minutes
    try:
        emit("soak", run(server, args.minutes * 60, args.sessions))
    finally:
        server.stop()


if __name__ == "__main__":
    main()

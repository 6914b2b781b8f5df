"""Listening capacity: K concurrent sessions stream real-time audio (speech with long pauses, as in
a real call; no responses, transcription on). The largest K where VAD keeps real time: every
append reaches the VAD within 100 ms of reaching its session, each ``speech_started`` comes
at most 100 ms later than on an idle server after its audio was sent (p99: this also counts the
wait before the session, in the event loop and the socket), and the event loop answers a health
check within 50 ms.

    python -m bench.listening [--steps 16,32,48,64] [--seconds 30] [--settings '{"THREADS": {"blas": 1}}']
"""

import argparse
import asyncio
import base64
import json
import sys
import time
import urllib.request

import numpy as np
import websockets

from pool.pipeline.stages.vad import MIN_SPEECH_MS
from realtime.client import CHUNK_MS, load_audio, pcm16_chunks
from realtime.session_config import SERVER_VAD_DEFAULTS

from .common import RECORDINGS, TOKEN, emit, start_server, stats
from .connect_storm import pool_status

PAUSE_S = 8.0  # silence after each utterance
# speech_started comes this long after its audio_start_ms was sent on an idle server: the default
# prefix padding, MIN_SPEECH_MS of voiced windows, one 40 ms append. More is a backlog.
ONSET_FLOOR_MS = SERVER_VAD_DEFAULTS["prefix_padding_ms"] + MIN_SPEECH_MS + CHUNK_MS


async def listener(url, chunks, offset, stop_at, onsets):
    """One caller: streams ``chunks`` in real time from ``offset`` until ``stop_at``; appends to
    ``onsets`` how long each ``speech_started`` came after the append holding its
    ``audio_start_ms`` was sent (ms: the VAD's own onset delay plus every wait on the way)."""
    async with websockets.connect(url) as ws:
        if json.loads(await ws.recv())["type"] != "session.created":
            return  # refused: the step reports fewer active units
        await ws.send(json.dumps({"type": "session.update", "session": {
            "audio": {"input": {"turn_detection": {"create_response": False}}}}}))
        sent_at = []  # perf_counter of each append, by its position in the input buffer

        async def read():  # server events, read as they come (no polling per append)
            async for message in ws:
                event = json.loads(message)
                if event["type"] == "input_audio_buffer.speech_started":
                    index = event["audio_start_ms"] // CHUNK_MS
                    if index < len(sent_at):
                        onsets.append((time.perf_counter() - sent_at[index]) * 1000)

        reader = asyncio.ensure_future(read())
        try:
            t0 = time.perf_counter()
            i = offset
            while time.perf_counter() < stop_at:
                await asyncio.sleep(max(0.0, t0 + (i - offset) * CHUNK_MS / 1000 - time.perf_counter()))
                await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": chunks[i % len(chunks)]}))
                sent_at.append(time.perf_counter())
                i += 1
        finally:
            reader.cancel()


HEALTH_TIMEOUT_S = 5.0


def health_ms(server):
    """One health check's answer time (ms); a check unanswered in HEALTH_TIMEOUT_S counts as that
    long (an overloaded step is a result, not a crash of the benchmark)."""
    started = time.perf_counter()
    try:
        with urllib.request.urlopen(f"{server.http_url}/healthz", timeout=HEALTH_TIMEOUT_S) as reply:
            reply.read()
    except OSError:  # a timeout, a refused or reset connection
        return HEALTH_TIMEOUT_S * 1000
    return (time.perf_counter() - started) * 1000


async def probe(server, stop_at, samples):
    while time.perf_counter() < stop_at:
        samples.append(await asyncio.to_thread(health_ms, server))
        await asyncio.sleep(0.5)


async def step(server, k, seconds, chunks):
    stop_at = time.perf_counter() + seconds
    health = []
    lag = {}

    async def read_lag():
        await asyncio.sleep(max(0.0, stop_at - time.perf_counter() - 1.0))
        try:
            status = await asyncio.to_thread(pool_status, server)
        except OSError:  # unanswered: an overloaded step is a result, not a crash of the benchmark
            lag["max_ms"], lag["active"] = None, None
            return
        lag["max_ms"] = max((u["input_lag_max_ms"] for u in status["units"] if u["state"] == "active"), default=0)
        lag["active"] = sum(u["state"] == "active" for u in status["units"])

    url = f"{server.base_url}/realtime"
    onsets = []
    listeners = [listener(url, chunks, i * len(chunks) // k, stop_at, onsets) for i in range(k)]
    await asyncio.gather(*listeners, probe(server, stop_at, health), read_lag())
    health_stats, onset = stats(health), stats(onsets)
    ok = (lag["active"] == k and lag["max_ms"] is not None and lag["max_ms"] < 100 and health_stats["p99"] < 50
          and onset is not None and onset["p99"] < ONSET_FLOOR_MS + 100)
    return {"sessions": k, "active_units": lag["active"], "input_lag_max_ms": lag["max_ms"],
            "health_ms": health_stats,
            "speech_started_ms": onset, "keeps_real_time": ok}


def wait_idle(server, timeout=120):
    """Until every unit is idle (the last step's transcriptions may still be queued)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(u["state"] == "idle" for u in pool_status(server)["units"]):
            return
        time.sleep(0.5)
    states = [u["state"] for u in pool_status(server)["units"]]
    raise RuntimeError(f"the pool did not return to idle in {timeout} s: {states}")


def run(server, steps, seconds):
    speech = load_audio(RECORDINGS["hotwords"])
    pattern = np.concatenate([speech, np.zeros(int(PAUSE_S * 24_000), np.float32)])
    chunks = [base64.b64encode(c).decode() for c in pcm16_chunks(pattern)]
    results = []
    for k in steps:
        wait_idle(server)
        results.append(asyncio.run(step(server, k, seconds, chunks)))
        print(json.dumps(results[-1]), file=sys.stderr)  # progress: a long run shows each step
    passing = [r["sessions"] for r in results if r["keeps_real_time"]]
    return {"seconds_per_step": seconds, "steps": results, "largest_k": max(passing, default=0),
            "target_at_least_64": max(passing, default=0) >= 64}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", default="16,32,48,64")
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--settings", type=json.loads, default={}, help="more S2S settings, JSON")
    parser.add_argument("--project-dir", default=None,
                        help="the checkout that serves (e.g. a git worktree of an older commit: before/after)")
    args = parser.parse_args(argv)
    steps = [int(k) for k in args.steps.split(",")]
    server = start_server(max(steps), {"STATUS_TOKEN": TOKEN, **args.settings}, project_dir=args.project_dir)
    try:
        emit("listening_capacity", run(server, steps, args.seconds))
    finally:
        server.stop()


if __name__ == "__main__":
    main()

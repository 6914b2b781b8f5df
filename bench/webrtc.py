"""WebRTC against WebSocket, one run, one server with the real default models: first audio after
the end of speech on the same recordings, and the server's CPU per session.

    python -m bench.webrtc [--runs 2] [--listen-seconds 30]

First audio: over the WebSocket, the first ``response.output_audio.delta`` received (a client
plays it at once); over WebRTC, ``output_audio_buffer.started`` received and the first audible
frame (above -40 dBFS) on the remote track, both from the end of the user's speech as the server
reports it (``audio_end_ms`` on the input buffer's clock). Over the WebSocket that clock starts
with the recording; over WebRTC it starts with the first microphone frame the server decoded,
and frames sent before the call was up are not heard, so the recording's start on it is
found from the first ``speech_started``: the same recording's over the WebSocket, where its
``audio_start_ms`` is its position in the recording, gives the offset. CPU: the server process's CPU seconds per second of a conversation, and of a session
that only listens to silence (the transport's own cost: Opus decode and encode, DTLS/SRTP, the
paced reply track, against JSON and base64), from ``/proc`` via psutil. The WebRTC client is
``tests.webrtc_client`` (aiortc, loopback only).
"""

import argparse
import asyncio
import time
import urllib.request

import numpy as np
import psutil

from realtime.client import load_audio
from tests.webrtc_client import WebRTCClient

from .common import RECORDINGS, emit, start_server, stats
from .driver import converse, turns

TRAILING_SILENCE_S = 6.0
SESSION = {"type": "realtime"}


def cpu_seconds(pid):
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def poster(server):
    """``post(sdp)`` to ``server``'s ``/v1/realtime/calls``, for ``WebRTCClient.call``."""

    def blocking(sdp):
        request = urllib.request.Request(f"{server.http_url}/v1/realtime/calls", data=sdp.encode(),
                                         headers={"Content-Type": "application/sdp"}, method="POST")
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, dict(reply.headers), reply.read().decode()

    async def post(sdp):
        return await asyncio.to_thread(blocking, sdp)

    return post


async def webrtc_conversation(server, recording, onset_ms, quiet_s=3.0, timeout_s=180):
    """One call: ``recording`` into the microphone track, then silence, until every response is
    done and has played. ``onset_ms``: where the VAD hears its first speech start, in the
    recording. Returns its completed turns' first audio marks (ms) and its duration (s)."""
    client = WebRTCClient()

    await client.call(poster(server))
    await client.until("session.created")
    started = time.perf_counter()
    played_at = time.monotonic()  # the recording's first sample goes out at the next frame
    client.microphone.play(np.concatenate([load_audio(recording), np.zeros(int(TRAILING_SILENCE_S * 24_000),
                                                                           np.float32)]))
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        await asyncio.sleep(0.5)
        open_ = {e["response"]["id"] for e in client.events if e["type"] == "response.created"} - {
            e["response"]["id"] for e in client.events if e["type"] == "response.done"}
        playing = {e["response_id"] for e in client.events if e["type"] == "output_audio_buffer.started"} - {
            e["response_id"] for e in client.events if e["type"] in ("output_audio_buffer.stopped",
                                                                      "output_audio_buffer.cleared")}
        quiet = not client.arrived or time.monotonic() - client.arrived[-1] > quiet_s
        if not client.microphone.has_audio and not open_ and not playing and quiet:
            break
    duration = time.perf_counter() - started
    await client.hangup()
    return webrtc_turns(client, played_at, onset_ms), duration


def webrtc_turns(client, played_at, onset_ms):
    """``turns()`` of a WebRTC call: per completed response, ms from the end of the speech it
    answers to ``output_audio_buffer.started`` and to the first audible frame heard."""
    first_start = next(e["audio_start_ms"] for e in client.events if e["type"] == "input_audio_buffer.speech_started")
    t0 = played_at - (first_start - onset_ms) / 1000  # when the buffer's clock was at 0
    stopped, last_item, created, started, completed, rows = {}, None, {}, {}, [], []
    for at, event in zip(client.arrived, client.events, strict=True):
        kind = event["type"]
        if kind == "input_audio_buffer.speech_stopped":
            stopped[event["item_id"]] = event["audio_end_ms"]
        elif kind == "conversation.item.input_audio_transcription.completed":
            last_item = event["item_id"]
        elif kind == "response.created":
            created[event["response"]["id"]] = (at, last_item)
        elif kind == "output_audio_buffer.started":
            started.setdefault(event["response_id"], at)
        elif kind == "response.done" and event["response"]["status"] == "completed":
            completed.append(event["response"]["id"])
    # A reply whose audio was all made before its turn committed (a speculative one) can be done
    # before its playback starts: output_audio_buffer.started may come after response.done.
    for response_id in completed:
        at_created, item = created[response_id]
        if item not in stopped or response_id not in started:
            continue
        end_of_speech = t0 + stopped[item] / 1000
        audible = next((t for t, samples in client.heard if t >= at_created
                        and np.sqrt(np.mean((samples / 32768.0) ** 2)) > 0.01), None)
        rows.append({"playback_started": round((started[response_id] - end_of_speech) * 1000, 1),
                     "first_audible": None if audible is None else round((audible - end_of_speech) * 1000, 1)})
    return rows


async def webrtc_listening(server, seconds):
    client = WebRTCClient()

    await client.call(poster(server))
    await client.until("session.created")
    before = cpu_seconds(server.process.pid)
    await asyncio.sleep(seconds)
    used = cpu_seconds(server.process.pid) - before
    await client.hangup()
    return used / seconds


async def websocket_listening(server, seconds):
    import base64
    import json

    import websockets

    silence = base64.b64encode(bytes(2 * 24_000 // 25)).decode()  # 40 ms of PCM16
    async with websockets.connect(f"{server.base_url}/realtime", max_size=None) as ws:
        await ws.recv()
        before = cpu_seconds(server.process.pid)
        start = time.perf_counter()
        for i in range(int(seconds * 25)):
            await asyncio.sleep(max(0.0, start + i * 0.04 - time.perf_counter()))
            await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": silence}))
        used = cpu_seconds(server.process.pid) - before
    return used / seconds


def run(server, recordings, runs, listen_seconds):
    """The benchmark on a started ``server``: each recording over both transports, ``runs``
    times, then a listening session of ``listen_seconds`` over each."""
    socket_rows, rtc_rows, socket_cpu, rtc_cpu = [], [], [], []
    pid = server.process.pid
    for _ in range(runs):
        for path in recordings.values():  # the two transports alternate on each recording
            before = cpu_seconds(pid)
            conversation = asyncio.run(converse(f"{server.base_url}/realtime", path, SESSION,
                                                trailing_silence_s=TRAILING_SILENCE_S))
            socket_cpu.append(cpu_seconds(pid) - before)
            socket_rows += turns(conversation)
            onset_ms = next(e["audio_start_ms"] for _, e in conversation["events"]
                            if e["type"] == "input_audio_buffer.speech_started")
            time.sleep(2)
            before = cpu_seconds(pid)
            rows, _ = asyncio.run(webrtc_conversation(server, path, onset_ms))
            rtc_cpu.append(cpu_seconds(pid) - before)
            rtc_rows += rows
            time.sleep(2)
    listen_socket = asyncio.run(websocket_listening(server, listen_seconds))
    time.sleep(2)
    listen_rtc = asyncio.run(webrtc_listening(server, listen_seconds))
    return {
        "runs": runs,
        "first_audio_ms": {
            "websocket_first_delta": stats([r["first_audio"] for r in socket_rows]),
            "webrtc_playback_started": stats([r["playback_started"] for r in rtc_rows]),
            "webrtc_first_audible": stats([r["first_audible"] for r in rtc_rows if r["first_audible"] is not None]),
        },
        # The server's CPU seconds for one conversation (the same recording, the same models),
        # and its cores for one session that only listens.
        "server_cpu_seconds_per_conversation": {"websocket": round(float(np.mean(socket_cpu)), 2),
                                                "webrtc": round(float(np.mean(rtc_cpu)), 2)},
        "server_cores_listening_session": {"websocket": round(listen_socket, 3), "webrtc": round(listen_rtc, 3)},
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--listen-seconds", type=float, default=30.0)
    args = parser.parse_args()
    with start_server() as server:
        emit("webrtc", run(server, RECORDINGS, args.runs, args.listen_seconds))


if __name__ == "__main__":
    main()

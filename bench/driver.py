"""A real-time client for benchmarks: streams a recording like a microphone and timestamps every
server event it receives (time.perf_counter, seconds)."""

import asyncio
import base64
import json
import time

import numpy as np
import websockets

from realtime.audio import PCM_RATE
from realtime.client import CHUNK_MS, load_audio, pcm16_chunks

PCM16_BYTES_PER_SECOND = 2 * PCM_RATE  # the session's default output: PCM16 mono


async def converse(url, recording, session=None, trailing_silence_s=3.0, quiet_s=3.0, timeout_s=180,
                   realtime=True):
    """Stream ``recording`` to ``url`` (ws://.../v1/realtime) paced in real time, then silence.

    Returns ``{"start": t0, "events": [(t, event), ...]}`` once every response is done, every
    committed turn with words has had a response created after it, and the server has been quiet
    for ``quiet_s``; or at ``timeout_s``. ``t0`` is when the first audio chunk was sent, so an
    audio position p (seconds) was sent at about ``t0 + p``. (A loaded server may take longer
    than ``quiet_s`` between a commit and its reply: ending then would count only the fast turns.)
    """
    audio = np.concatenate([load_audio(recording), np.zeros(int(trailing_silence_s * 24_000), np.float32)])
    chunks = [base64.b64encode(c).decode() for c in pcm16_chunks(audio)]
    events = []
    async with websockets.connect(url, max_size=None) as ws:
        events.append((time.perf_counter(), json.loads(await ws.recv())))
        if session:
            await ws.send(json.dumps({"type": "session.update", "session": session}))
        t0 = time.perf_counter()

        async def send():
            for i, chunk in enumerate(chunks):
                if realtime:
                    await asyncio.sleep(max(0.0, t0 + i * CHUNK_MS / 1000 - time.perf_counter()))
                await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": chunk}))

        sender = asyncio.create_task(send())
        deadline = t0 + timeout_s
        open_responses = 0
        unanswered = set()  # committed items that may still get a reply (no response created since)

        def settled():
            return sender.done() and open_responses == 0 and not unanswered

        while time.perf_counter() < deadline:
            # Quiet counts once the recording is sent and nothing is owed: until then, look again
            # at least every 0.5 s (a fast server's last response.done can come before the
            # trailing silence is sent, and then no event would wake this loop until the deadline).
            wait = quiet_s if settled() else min(0.5, deadline - time.perf_counter())
            try:
                message = await asyncio.wait_for(ws.recv(), wait)
            except asyncio.TimeoutError:
                if settled():
                    break
                continue
            event = json.loads(message)
            events.append((time.perf_counter(), event))
            kind = event["type"]
            if kind == "input_audio_buffer.committed":
                unanswered.add(event["item_id"])
            elif kind in ("conversation.item.input_audio_transcription.completed",
                          "conversation.item.input_audio_transcription.failed"):
                if not event.get("transcript", "").strip():
                    unanswered.discard(event["item_id"])  # no words: the server answers nothing
            elif kind == "response.created":
                open_responses += 1
                unanswered.clear()  # a reply answers every turn before it
            elif kind == "response.done":
                open_responses -= 1
        sender.cancel()
    return {"start": t0, "events": events}


def turns(conversation, unfinished=False):
    """Completed responses of a conversation with the client-side marks of the turn they answer:
    milliseconds from the end of the user's speech (server-reported ``audio_end_ms``) to each
    event; and ``playback_stall``: the silence (ms) a listener playing the reply's audio in real
    time from its first delta hears while waiting for the next one (to the last delta received).
    ``unfinished``: also the responses that sent audio but had no ``response.done`` when the
    conversation ended (its deadline), marked ``"completed": False``; an overloaded pool's
    first audio is then not measured on its fastest replies only."""
    t0, events = conversation["start"], conversation["events"]
    stopped, committed, transcribed = {}, {}, {}
    last_item, created, first_audio, result = None, {}, {}, []
    playback = {}  # response id -> [playhead (s), stall (s)]: its audio played in real time
    ended = set()

    def row(response_id, completed):
        t_created, item = created[response_id]
        if item not in stopped or response_id not in first_audio:
            return
        end_of_speech = t0 + stopped[item][1] / 1000

        def ms(t):
            return round((t - end_of_speech) * 1000, 1)

        result.append({"response": response_id, "speech_stopped": ms(stopped[item][0]),
                       "committed": ms(committed[item]), "transcript": ms(transcribed[item]),
                       "response_created": ms(t_created), "first_audio": ms(first_audio[response_id]),
                       "playback_stall": round(playback[response_id][1] * 1000, 1), "completed": completed})

    for t, event in events:
        kind = event["type"]
        if kind == "input_audio_buffer.speech_stopped":
            stopped[event["item_id"]] = (t, event["audio_end_ms"])
        elif kind == "input_audio_buffer.committed":
            committed[event["item_id"]] = t
        elif kind == "conversation.item.input_audio_transcription.completed":
            transcribed[event["item_id"]] = t
            last_item = event["item_id"]
        elif kind == "response.created":
            created[event["response"]["id"]] = (t, last_item)
        elif kind == "response.output_audio.delta":
            first_audio.setdefault(event["response_id"], t)
            play = playback.setdefault(event["response_id"], [t, 0.0])
            if t > play[0]:  # the client has played everything it had: the listener hears a gap
                play[1] += t - play[0]
                play[0] = t
            play[0] += len(base64.b64decode(event["delta"])) / PCM16_BYTES_PER_SECOND
        elif kind == "response.done":
            ended.add(event["response"]["id"])
            if event["response"]["status"] == "completed":
                row(event["response"]["id"], True)
    if unfinished:
        for response_id in created:
            if response_id not in ended:
                row(response_id, False)
    return result


def last_turn_answered(conversation):
    """True when the conversation's last committed user turn is followed by a response created
    after it that completed."""
    last_commit, created, completed = None, {}, set()
    for i, (_, event) in enumerate(conversation["events"]):
        if event["type"] == "input_audio_buffer.committed":
            last_commit = i
        elif event["type"] == "response.created":
            created[event["response"]["id"]] = i
        elif event["type"] == "response.done" and event["response"]["status"] == "completed":
            completed.add(event["response"]["id"])
    return last_commit is not None and any(i > last_commit and rid in completed for rid, i in created.items())

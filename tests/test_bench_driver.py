"""The benchmarks' client (``bench.driver.converse``) against a scripted Realtime server on
loopback: a conversation ends when the server owes nothing, not when it has been quiet for a
while. A loaded server can be silent for seconds between a commit and its reply; a client that
stopped listening then would count only the fast turns (section 5 of BENCHMARKS.md counted 4 of
16 replies at a pool of 8)."""

import asyncio
import json

import pytest
import websockets

from bench.common import RECORDINGS
from bench.driver import converse, turns

QUIET_S = 0.3  # the client's quiet period; the scripted server stays silent longer than this


async def serve(transcript, handler_done):
    """A server that commits one turn after the first appends, says nothing for 3 x QUIET_S,
    then sends ``transcript`` and, when it holds words, a whole reply."""

    async def handler(ws):
        await ws.send(json.dumps({"type": "session.created", "session": {}}))
        await ws.recv()  # the first append
        send = [
            {"type": "input_audio_buffer.speech_stopped", "item_id": "item_1", "audio_end_ms": 100},
            {"type": "input_audio_buffer.committed", "item_id": "item_1"},
        ]
        for event in send:
            await ws.send(json.dumps(event))
        await asyncio.sleep(3 * QUIET_S)  # the transcription waits behind other sessions' work
        await ws.send(json.dumps({"type": "conversation.item.input_audio_transcription.completed",
                                  "item_id": "item_1", "transcript": transcript}))
        if transcript:
            await asyncio.sleep(3 * QUIET_S)
            response = {"id": "resp_1", "status": "in_progress"}
            await ws.send(json.dumps({"type": "response.created", "response": response}))
            await ws.send(json.dumps({"type": "response.output_audio.delta", "response_id": "resp_1",
                                      "delta": "AAAA"}))
            await ws.send(json.dumps({"type": "response.done", "response": {**response, "status": "completed"}}))
        try:
            async for _ in ws:  # the rest of the recording, until the client leaves
                pass
        finally:
            handler_done.set()

    return await websockets.serve(handler, "127.0.0.1", 0)


@pytest.mark.parametrize("transcript", ["What is the weather like?", ""])
async def test_a_conversation_waits_for_the_reply_a_commit_is_owed(transcript):
    done = asyncio.Event()
    server = await serve(transcript, done)
    port = server.sockets[0].getsockname()[1]
    try:
        # With a deadline far off: a conversation that waited for it would fail the wait_for.
        conversation = await asyncio.wait_for(
            converse(f"ws://127.0.0.1:{port}", RECORDINGS["hotwords"], trailing_silence_s=0.0,
                     quiet_s=QUIET_S, timeout_s=600, realtime=False), timeout=60)
    finally:
        server.close()
        await server.wait_closed()
    kinds = [event["type"] for _, event in conversation["events"]]
    if transcript:
        assert kinds[-1] == "response.done" and len(turns(conversation)) == 1
    else:  # no words: nothing is owed, and the client leaves when quiet
        assert kinds[-1] == "conversation.item.input_audio_transcription.completed"

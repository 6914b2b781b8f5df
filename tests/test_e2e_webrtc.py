"""End to end over WebRTC: a live ``runpool`` with the real default models, an aiortc client on
loopback playing real speech into its microphone track, hearing the reply on the remote track."""

import asyncio
import urllib.error
import urllib.request

import numpy as np
import soxr

from .helpers import JFK, JFK_WORDS, load_audio, normalise
from .webrtc_client import WebRTCClient

SESSION = {"type": "session.update", "session": {
    "type": "realtime", "audio": {"input": {"turn_detection": {"silence_duration_ms": 1500}}}}}


def poster(server):
    """``post(sdp)`` to the live server's ``/v1/realtime/calls`` (on a thread: urllib blocks)."""

    def post_blocking(sdp):
        request = urllib.request.Request(f"{server.http_url}/v1/realtime/calls", data=sdp.encode(), method="POST",
                                         headers={"Content-Type": "application/sdp"})
        try:
            with urllib.request.urlopen(request, timeout=30) as reply:
                return reply.status, dict(reply.headers), reply.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, dict(error.headers), error.read().decode()

    async def post(sdp):
        return await asyncio.to_thread(post_blocking, sdp)

    return post


def heard_samples(client, since=0.0):
    """float32 at 24 kHz of what the client heard after ``since`` (monotonic seconds)."""
    chunks = [samples for at, samples in client.heard if at >= since]
    return np.concatenate(chunks).astype(np.float32) / 32768 if chunks else np.zeros(0, np.float32)


async def test_a_spoken_question_is_answered_on_the_remote_track(server, whisper):
    client = WebRTCClient()
    status, _, _ = await client.call(poster(server))
    assert status == 201
    await client.until("session.created")
    client.send(SESSION)
    await client.until("session.updated")
    client.microphone.play(load_audio(JFK))
    transcribed = await client.until("conversation.item.input_audio_transcription.completed", timeout=60)
    assert JFK_WORDS in normalise(transcribed["transcript"])
    started = await client.until("output_audio_buffer.started", timeout=60)
    done = await client.until("response.done", timeout=120)
    assert done["response"]["status"] == "completed"
    await client.until("output_audio_buffer.stopped", timeout=120)
    spoken = done["response"]["output"][0]["content"][0]["transcript"]
    # What came over Opus is the reply's speech: Whisper hears its words in it.
    heard = whisper.transcribe(soxr.resample(heard_samples(client), 24_000, 16_000), "en")
    said, understood = set(normalise(spoken).split()), set(normalise(heard).split())
    assert len(said & understood) >= len(said) / 2, (spoken, heard)
    assert started["response_id"] == done["response"]["id"]
    await client.hangup()


async def test_speech_over_a_long_reply_cancels_it_and_its_audio_stops(server):
    client = WebRTCClient()
    await client.call(poster(server))
    await client.until("session.created")
    client.send({"type": "session.update", "session": {
        "type": "realtime", "instructions": "Tell a long story of at least ten sentences, whatever the user says.",
        "audio": {"input": {"turn_detection": {"silence_duration_ms": 1500}}}}})
    await client.until("session.updated")
    client.microphone.play(load_audio(JFK))
    started = await client.until("output_audio_buffer.started", timeout=90)
    await asyncio.sleep(2.0)
    client.microphone.play(load_audio(JFK))  # the user talks over the story
    cleared = await client.until("output_audio_buffer.cleared", timeout=60)
    assert cleared["response_id"] == started["response_id"]
    # The story is cut where its playback stopped: cancelled if it was still being written,
    # truncated in any case (the TTS runs ahead of playback, so its response may be done).
    story = next(e for e in client.events
                 if e["type"] == "response.done" and e["response"]["id"] == cleared["response_id"])
    assert story["response"]["status"] in ("cancelled", "completed")
    truncated = next(e for e in client.events if e["type"] == "conversation.item.truncated")
    assert truncated["item_id"] == story["response"]["output"][0]["id"]
    assert truncated["audio_end_ms"] >= 1500  # it had played 2 s when the user began
    cleared_at = client.arrived[client.events.index(cleared)]
    await asyncio.sleep(1.5)
    # The story's audio stopped within 100 ms: nothing audible from then until the reply to the
    # interruption starts playing (if it has yet).
    later = [at for at, e in zip(client.arrived, client.events, strict=True) if at > cleared_at
             and e["type"] == "output_audio_buffer.started"]
    assert client.heard_audio(since=cleared_at + 0.1, until=min(later, default=float("inf"))) < 0.04
    await client.hangup()

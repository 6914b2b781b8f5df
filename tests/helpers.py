"""Shared test helpers: the recordings, a WebSocket test client for the scripted pool."""

import base64
import json
import time
from pathlib import Path

import numpy as np

from realtime.client import load_audio, pcm16_chunks

PROJECT_DIR = Path(__file__).resolve().parents[1]  # this checkout: manage.py and s2s_project
AUDIO_DIR = PROJECT_DIR.parent / "shared" / "audio"  # the recordings tests and benchmarks use

JFK = AUDIO_DIR / "jfk.flac"
HOTWORDS = AUDIO_DIR / "hotwords.mp3"
JFK_WORDS = "ask not what your country can do for you"


def normalise(text):
    """Lower case, letters and spaces only: transcripts compared without case or punctuation."""
    return " ".join("".join(c if c.isalnum() else " " for c in text.lower()).split())


def speech_appends(path=JFK, silence_s=2.0, chunk_ms=40):
    """``input_audio_buffer.append`` events for a recording at 24 kHz, then silence."""
    samples = np.concatenate([load_audio(path), np.zeros(int(silence_s * 24_000), np.float32)])
    return [{"type": "input_audio_buffer.append", "audio": base64.b64encode(c).decode()}
            for c in pcm16_chunks(samples, chunk_ms)]


class Client:
    """A channels WebsocketCommunicator speaking JSON events, for the scripted pool."""

    def __init__(self, communicator):
        self.ws = communicator
        self.received = []

    async def send(self, event):
        await self.ws.send_to(text_data=json.dumps(event))

    async def recv(self, timeout=10):
        message = await self.ws.receive_output(timeout)
        if message["type"] == "websocket.close":
            raise ConnectionError(f"closed with code {message.get('code')}")
        event = json.loads(message["text"])
        self.received.append(event)
        return event

    async def until(self, event_type, timeout=10):
        """Receive until an event of ``event_type``; returns it (earlier ones are in ``received``)."""
        while True:
            event = await self.recv(timeout)
            if event["type"] == event_type:
                return event

    def types(self):
        return [e["type"] for e in self.received]


def user_text(text):
    """A ``conversation.item.create`` event for a user message of text."""
    return {"type": "conversation.item.create", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}}


def jfk_segment(start_s, end_s):
    """float32 samples at 24 kHz of jfk.flac between two times (seconds)."""
    samples = load_audio(JFK)
    return samples[int(start_s * 24_000):int(end_s * 24_000)]


def appends(samples, chunk_ms=40):
    """``input_audio_buffer.append`` events for float32 samples at 24 kHz."""
    return [{"type": "input_audio_buffer.append", "audio": base64.b64encode(c).decode()}
            for c in pcm16_chunks(samples, chunk_ms)]


def silence(seconds):
    return np.zeros(int(seconds * 24_000), np.float32)


def check_turns_answered(events, interrupt_response=True):
    """The turn-taking promises on a list of server events (dicts, in the order received):

    - every committed user item gets its transcription completed (or failed);
    - the last committed item is followed by a response created after it that completed;
    - no ``response.output_audio.delta`` of a reply created before the user's latest
      ``speech_started`` reaches the client (no stale reply talks over the user); with
      ``interrupt_response`` off, a reply the user was already hearing may go on, but a reply
      whose audio had not begun may not begin over the user.

    Returns ``(committed item ids, {response id: status})``.
    """
    types = [e["type"] for e in events]
    committed = [(i, e["item_id"]) for i, e in enumerate(events) if e["type"] == "input_audio_buffer.committed"]
    assert committed, f"no turn committed: {types}"
    finished = {e["item_id"] for e in events if e["type"] in (
        "conversation.item.input_audio_transcription.completed",
        "conversation.item.input_audio_transcription.failed")}
    missing = [item for _, item in committed if item not in finished]
    assert not missing, f"committed items never transcribed: {missing}"
    created = {e["response"]["id"]: i for i, e in enumerate(events) if e["type"] == "response.created"}
    status = {e["response"]["id"]: e["response"]["status"] for e in events if e["type"] == "response.done"}
    last_commit = committed[-1][0]
    answers = [rid for rid, i in created.items() if i > last_commit and status.get(rid) == "completed"]
    assert answers, f"the last turn got no completed reply: {status}, {types[last_commit:]}"
    latest_speech, heard = -1, {}  # response id -> index of its first audio delta
    for i, e in enumerate(events):
        if e["type"] == "input_audio_buffer.speech_started":
            latest_speech = i
        elif e["type"] == "response.output_audio.delta":
            rid = e["response_id"]
            heard.setdefault(rid, i)
            going_on = not interrupt_response and heard[rid] < latest_speech
            assert created[rid] > latest_speech or going_on, (
                f"audio of {rid}, created before the speech at event {latest_speech}, "
                f"reached the client at event {i}")
    return [item for _, item in committed], status


async def open_socket(headers=(), subprotocols=None, server=("10.0.0.5", 8000), client=("192.0.2.7", 50000)):
    """A connected Client whose scope has a server socket and a client (peer) address, as
    Daphne sets them (channels' communicator sets neither); returns (client, subprotocol)."""
    from channels.testing import WebsocketCommunicator

    from s2s_project.asgi import application

    communicator = WebsocketCommunicator(application, "/v1/realtime", headers=list(headers),
                                         subprotocols=subprotocols)
    communicator.scope["server"] = server
    communicator.scope["client"] = client
    connected, subprotocol = await communicator.connect()
    assert connected  # always accepted: refusals are an error event and close 1008
    return Client(communicator), subprotocol


async def refused_with(client):
    """The code of the ``error`` a refused connect gets; asserts the close 1008 that follows."""
    error = await client.recv()
    assert error["type"] == "error"
    assert await client.ws.receive_output(2) == {"type": "websocket.close", "code": 1008}
    return error["error"]["code"]


# A 1x1 PNG, as a data: URL (an input_image part).
PIXEL = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGP4z8DwHwAFAAH/iZk9HQAAAABJRU5ErkJggg=="


def image_message(url=PIXEL, role="user"):
    return {"type": "conversation.item.create", "item": {"type": "message", "role": role, "content": [
        {"type": "input_text", "text": "What is in this picture?"},
        {"type": "input_image", "image_url": url, "detail": "low"}]}}


def wait_for(condition, timeout=5.0):
    """Poll ``condition()`` until it is true or ``timeout`` seconds pass; returns its last value
    (for tests that watch other threads: assert on what it returns)."""
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.005)
    return condition()

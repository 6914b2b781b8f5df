"""Shared test helpers: the recordings, a WebSocket test client for the scripted pool."""

import base64
import json
from pathlib import Path

import numpy as np

from realtime.client import load_audio, pcm16_chunks

AUDIO_DIR = Path(__file__).resolve().parents[2] / "shared" / "audio"
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

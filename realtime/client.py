"""A Realtime client for real input, built on the ``openai`` SDK: stream a recording as a live
microphone would, collect the transcripts and the spoken reply.

Used by ``manage.py talk`` and by anyone who wants to script a conversation against the server.
"""

import asyncio
import base64
import time
from dataclasses import dataclass, field

import numpy as np
import soundfile
import soxr

from .audio import PCM_RATE, float_to_pcm16

CHUNK_MS = 40  # a microphone-sized append


def load_audio(path, rate=PCM_RATE):
    """Decode WAV, FLAC or MP3 (libsndfile via soundfile) -> float32 mono at ``rate`` Hz.

    Channels are averaged; resampling is soxr's. Raises ``soundfile.LibsndfileError`` for files
    it cannot read.
    """
    samples, file_rate = soundfile.read(str(path), dtype="float32", always_2d=True)
    mono = samples.mean(axis=1)
    return soxr.resample(mono, file_rate, rate) if file_rate != rate else mono


def pcm16_chunks(samples, chunk_ms=CHUNK_MS, rate=PCM_RATE):
    """Split float32 samples into PCM16 byte chunks of ``chunk_ms`` milliseconds."""
    pcm = float_to_pcm16(samples)
    step = rate * chunk_ms // 1000 * 2
    return [pcm[i:i + step] for i in range(0, len(pcm), step)]


@dataclass
class TurnResult:
    """What one spoken turn produced. ``audio``: the reply, PCM16 bytes at 24 kHz."""

    user_transcript: str = ""
    assistant_transcript: str = ""
    audio: bytes = b""
    events: list = field(default_factory=list)  # event types, in the order received
    status: str | None = None


async def talk(base_url, audio_path, *, api_key="local", session=None, realtime_factor=1.0,
               trailing_silence_s=2.0, timeout_s=120.0, on_event=None):
    """Stream ``audio_path`` to the server at ``base_url`` (e.g. ``ws://127.0.0.1:8000/v1``) and
    return the TurnResult once ``response.done`` arrives.

    ``realtime_factor``: 1.0 paces appends as a live microphone; 0 sends as fast as possible.
    ``session``: a ``session.update`` payload sent first. Raises TimeoutError after ``timeout_s``.
    """
    from openai import AsyncOpenAI

    client = AsyncOpenAI(api_key=api_key, websocket_base_url=base_url)
    samples = load_audio(audio_path)
    silence = np.zeros(int(trailing_silence_s * PCM_RATE), dtype=np.float32)
    result = TurnResult()
    async with client.realtime.connect(model="s2s-default") as conn:
        if session:
            await conn.session.update(session=session)

        async def stream():
            for chunk in pcm16_chunks(np.concatenate([samples, silence])):
                await conn.input_audio_buffer.append(audio=base64.b64encode(chunk).decode())
                if realtime_factor:
                    await asyncio.sleep(CHUNK_MS / 1000 / realtime_factor)

        sender = asyncio.create_task(stream())
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                event = await asyncio.wait_for(conn.recv(), max(0.1, deadline - time.monotonic()))
                result.events.append(event.type)
                if on_event:
                    on_event(event)
                if event.type == "conversation.item.input_audio_transcription.completed":
                    result.user_transcript = event.transcript
                elif event.type == "response.output_audio_transcript.delta":
                    result.assistant_transcript += event.delta
                elif event.type == "response.output_audio.delta":
                    result.audio += base64.b64decode(event.delta)
                elif event.type == "response.done":
                    result.status = event.response.status
                    return result
        finally:
            sender.cancel()

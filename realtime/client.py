"""A Realtime client for real input, built on the ``openai`` SDK: stream a recording as a live
microphone would, follow the conversation to its end, collect the transcripts and the replies.

Used by ``manage.py talk`` and by anyone who wants to script a conversation against the server.
"""

import asyncio
import base64
import time
from dataclasses import dataclass, field

import soundfile
import soxr

from realtime.audio import PCM_RATE, float_to_pcm16

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
class Reply:
    """One response. ``audio``: PCM16 bytes at 24 kHz; ``reason``: why it was cancelled."""

    response_id: str
    transcript: str = ""
    audio: bytes = b""
    status: str | None = None
    reason: str | None = None


@dataclass
class TalkResult:
    """What a recording produced: every user turn's transcript and every reply, in order."""

    user_turns: list = field(default_factory=list)
    replies: list = field(default_factory=list)
    events: list = field(default_factory=list)  # event types, in the order received

    @property
    def final(self):
        """The last reply (the answer to the last turn), or an empty Reply when there was none."""
        return self.replies[-1] if self.replies else Reply("")

    @property
    def user_transcript(self):
        return " ".join(t for t in self.user_turns if t)

    @property
    def assistant_transcript(self):
        return self.final.transcript

    @property
    def audio(self):
        return self.final.audio

    @property
    def status(self):
        return self.final.status


class _Follower:
    """Follows a conversation's events to know when the last user turn has had its reply."""

    def __init__(self, result):
        self.result = result
        self.replies = {}
        self.speaking = False
        self.untranscribed = set()
        self.active = None
        self.last_commit = -1  # index in result.events
        self.answered_after = -1  # index of the latest commit a finished reply was created after
        self.created_at = {}

    def see(self, event):
        result = self.result
        index = len(result.events)
        result.events.append(event.type)
        kind = event.type
        if kind == "input_audio_buffer.speech_started":
            self.speaking = True
        elif kind == "input_audio_buffer.committed":
            self.speaking = False
            self.last_commit = index
            self.untranscribed.add(event.item_id)
        elif kind in ("conversation.item.input_audio_transcription.completed",
                      "conversation.item.input_audio_transcription.failed"):
            self.untranscribed.discard(event.item_id)
            result.user_turns.append(getattr(event, "transcript", "") or "")
        elif kind == "response.created":
            self.active = event.response.id
            self.created_at[event.response.id] = index
            reply = Reply(event.response.id)
            self.replies[reply.response_id] = reply
            result.replies.append(reply)
        elif kind == "response.output_audio_transcript.delta":
            self.replies[event.response_id].transcript += event.delta
        elif kind == "response.output_audio.delta":
            self.replies[event.response_id].audio += base64.b64decode(event.delta)
        elif kind == "response.done":
            reply = self.replies.get(event.response.id)
            if reply is not None:
                reply.status = event.response.status
                details = event.response.status_details
                reply.reason = getattr(details, "reason", None) if details else None
            if self.active == event.response.id:
                self.active = None
            if self.created_at.get(event.response.id, -1) > self.last_commit:
                self.answered_after = self.last_commit

    def waiting(self):
        """True while speech, a transcript or a reply is still in progress."""
        return self.speaking or bool(self.untranscribed) or self.active is not None

    def last_turn_answered(self):
        return self.last_commit >= 0 and self.answered_after == self.last_commit


async def talk(base_url, audio_path, *, api_key="local", session=None, realtime_factor=1.0,
               chunk_ms=CHUNK_MS, timeout_s=180.0, quiet_s=5.0, on_event=None):
    """Stream ``audio_path`` to the server at ``base_url`` (e.g. ``ws://127.0.0.1:8000/v1``) as a
    live microphone would, then keep sending silence until the last user turn has had its reply
    (or, when a turn gets none, until nothing has happened for ``quiet_s`` seconds). Returns a
    TalkResult.

    ``realtime_factor``: 1.0 paces the recording as a live microphone; 0 sends it as fast as
    possible (the silence after it is always real time). ``chunk_ms``: audio per append (None:
    the whole recording in one append). ``session``: a ``session.update`` payload sent first.
    Raises TimeoutError after ``timeout_s`` seconds.
    """
    from openai import AsyncOpenAI

    client = AsyncOpenAI(api_key=api_key, websocket_base_url=base_url)
    samples = load_audio(audio_path)
    result = TalkResult()
    follower = _Follower(result)
    sent_all = asyncio.Event()
    async with client.realtime.connect(model="s2s-default") as conn:
        if session:
            await conn.session.update(session=session)

        async def microphone():
            chunks = [float_to_pcm16(samples)] if chunk_ms is None else pcm16_chunks(samples, chunk_ms)
            for chunk in chunks:
                await conn.input_audio_buffer.append(audio=base64.b64encode(chunk).decode())
                if realtime_factor:
                    await asyncio.sleep(len(chunk) / 2 / PCM_RATE / realtime_factor)
            sent_all.set()
            quiet = base64.b64encode(bytes(PCM_RATE * CHUNK_MS // 1000 * 2)).decode()
            while True:  # the microphone stays open: silence, in real time
                await conn.input_audio_buffer.append(audio=quiet)
                await asyncio.sleep(CHUNK_MS / 1000)

        sender = asyncio.create_task(microphone())
        deadline = time.monotonic() + timeout_s
        last_event = time.monotonic()
        try:
            while True:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no reply to the last turn within {timeout_s} s")
                try:
                    event = await asyncio.wait_for(conn.recv(), 0.25)
                except asyncio.TimeoutError:
                    event = None
                if event is not None:
                    last_event = time.monotonic()
                    follower.see(event)
                    if on_event:
                        on_event(event)
                if not sent_all.is_set() or follower.waiting():
                    continue
                if follower.last_turn_answered() or time.monotonic() - last_event > quiet_s:
                    return result
        finally:
            sender.cancel()

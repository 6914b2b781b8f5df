"""Back-pressure on a unit's input is an event, not a poll: a full VAD inbox tells the session
when it has room (``Inbox.when_room``), and the client's events wait for it instead of being
dropped. The scripted backend through channels' test tools."""

import threading

import pytest

from pool.backends.scripted import SCRIPT
from pool.pipeline import unit as unit_module
from pool.pipeline.stages.vad import VADStage
from pool.pipeline.unit import Inbox

from .helpers import appends, silence


def test_a_full_inbox_calls_its_waiter_once_when_a_message_leaves():
    inbox, calls = Inbox(2), []
    assert inbox.when_room(lambda: calls.append("now")) is False  # room now: no call, ever
    inbox.put_nowait("a")
    inbox.put_nowait("b")
    assert inbox.when_room(lambda: calls.append("room")) is True
    assert calls == []
    inbox.get_nowait()
    inbox.get_nowait()
    assert calls == ["room"]


@pytest.fixture
def slow_vad(monkeypatch):
    """A VAD inbox of 4 messages and a VAD that hears nothing until ``gate`` is set."""
    gate = threading.Event()
    append = VADStage._append

    def held(self, ctx, msg):
        gate.wait(10)
        append(self, ctx, msg)

    monkeypatch.setattr(unit_module, "VAD_INBOX", 4)
    monkeypatch.setattr(VADStage, "_append", held)
    yield gate
    gate.set()


@pytest.fixture
def slow_pool(slow_vad, scripted_pool):
    """The scripted pool, built after the inbox bound is patched."""
    return slow_vad


async def test_a_client_that_outruns_the_vad_waits_for_room_and_loses_no_audio(slow_pool, connect):
    SCRIPT.transcript = lambda audio: f"{len(audio)} samples"
    client = await connect()
    await client.until("session.created")
    await client.send({"type": "session.update", "session": {"audio": {"input": {
        "turn_detection": None, "transcription": {"model": "whisper-1"}}}}})
    await client.until("session.updated")
    chunks = appends(silence(1.2), chunk_ms=100)  # 12 appends: three times the inbox
    for append in chunks:
        await client.send(append)
    await client.send({"type": "input_audio_buffer.commit"})
    assert await client.ws.receive_nothing(0.5)  # the server waits; it refuses nothing
    slow_pool.set()
    transcribed = await client.until("conversation.item.input_audio_transcription.completed", timeout=30)
    heard = int(transcribed["transcript"].split()[0])
    # 1.2 s at 16 kHz, less the streaming resampler's delay (under 10 ms): one lost append is 100 ms.
    assert len(chunks) * 1600 - 160 <= heard <= len(chunks) * 1600
    assert "error" not in client.types()
    await client.ws.disconnect()

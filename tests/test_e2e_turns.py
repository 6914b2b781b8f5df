"""Turn-taking end to end: the real default models behind a live Daphne server (``runpool``),
driven by the official ``openai`` SDK with real recordings, with the default session unless a
test says otherwise (and then the default is tested beside it)."""

import asyncio
import base64
import statistics
import subprocess
import sys

import numpy as np
import pytest
import soundfile

from pool.testing import wait_until
from realtime.audio import PCM_RATE
from realtime.client import CHUNK_MS, pcm16_chunks, talk

from .helpers import JFK, JFK_WORDS, check_turns_answered, normalise
from .helpers import PROJECT_DIR as ROOT
from .test_e2e import _wait_idle


async def converse(server, **kwargs):
    """``talk()`` with every server event kept as a dict; returns (result, events)."""
    events = []
    await _wait_idle(server.port)
    result = await talk(server.base_url, JFK, on_event=lambda e: events.append(e.to_dict()),
                        timeout_s=240, **kwargs)
    return result, events


@pytest.mark.parametrize("session", [
    {"type": "realtime"},
    {"type": "realtime", "audio": {"input": {"turn_detection": {"interrupt_response": False}}}},
], ids=["default", "interrupt_response_off"])
async def test_jfk_in_real_time_every_turn_is_answered_and_no_reply_talks_over_the_user(server, session):
    result, events = await converse(server, session=session)
    interrupt = session.get("audio", {}).get("input", {}).get("turn_detection", {}).get("interrupt_response", True)
    committed, status = check_turns_answered(events, interrupt)
    assert len(committed) >= 2  # server_vad's 500 ms cuts the sentence at its pauses
    assert JFK_WORDS in normalise(result.user_transcript)
    assert result.status == "completed" and len(result.audio) >= 0.5 * PCM_RATE * 2
    cancelled = [e["response"]["status_details"]["reason"] for e in events
                 if e["type"] == "response.done" and e["response"]["status"] == "cancelled"]
    assert set(cancelled) <= {"turn_detected"}
    # Every reply counts the prompt it was made from, though its stream paused at each phrase,
    # and the instructions come from llama.cpp's prompt cache (warmed before the pool served).
    usages = [e["response"]["usage"] for e in events
              if e["type"] == "response.done" and e["response"]["status"] == "completed"]
    assert usages and all(u["input_tokens"] > u["input_token_details"]["cached_tokens"] > 0 for u in usages), usages


async def test_the_session_history_holds_what_was_said_and_each_reply_with_its_timings(server):
    """The default session over the SDK, then its history as the admin reads it: every turn's
    words, every reply as spoken (cut where it was interrupted), each response's turn timings."""
    result, events = await converse(server, session={"type": "realtime"})
    session_id = next(e["session"]["id"] for e in events if e["type"] == "session.created")

    def ended():
        return server.query(f"select first_audio_p50_ms, completed_responses, cancelled_responses from "
                            f"pool_session where session_id = '{session_id}' and ended_at is not null")

    [(p50, completed, cancelled)] = await asyncio.to_thread(wait_until, ended, 10, "the session row ended")
    items = server.query(f"select role, text, interrupted, status from pool_conversationitem "
                         f"where session_id = '{session_id}' and kind = 'message' order by at_ms, id")
    said = " ".join(text for role, text, _, _ in items if role == "user")
    assert JFK_WORDS in normalise(said) and normalise(said) == normalise(result.user_transcript)
    replies = [(text, interrupted) for role, text, interrupted, _ in items if role == "assistant"]
    assert replies[-1] == (result.replies[-1].transcript, 0)  # the completed reply, as spoken
    responses = server.query(f"select status, reason, transcribed_ms, first_audio_sent_ms from "
                             f"pool_sessionresponse where session_id = '{session_id}' order by at_ms")
    assert [(s, r or None) for s, r, _, _ in responses] == [
        (r.status, r.reason) for r in result.replies]
    first_audio = [sent for status, _, transcribed, sent in responses if status == "completed"]
    assert completed == len(first_audio) >= 1 and cancelled == len(responses) - completed
    assert all(0 < ms < 30_000 for ms in first_audio) and p50 == statistics.median(first_audio)


@pytest.mark.chromium
async def test_a_key_that_records_gets_both_sides_of_its_session_as_flac(server, whisper):
    """A key issued with ``--record-audio yes`` on the live server (RECORD_AUDIO is off): its
    session's user side is jfk.flac as the server heard it, its assistant side the replies sent.
    Then the session's admin page in headless Chromium: timeline, latency table, players."""
    key = server.manage("apikey", "create", "recorder", "--record-audio", "yes").strip()
    result, events = await converse(server, session={"type": "realtime"}, api_key=key)
    session_id = next(e["session"]["id"] for e in events if e["type"] == "session.created")
    query = (f"select user_audio, assistant_audio, audio_in_seconds, audio_out_seconds from pool_session "
             f"where session_id = '{session_id}' and user_audio != '' and assistant_audio != ''")
    [(user_name, assistant_name, audio_in, audio_out)] = await asyncio.to_thread(
        wait_until, lambda: server.query(query), 10, "both recordings stored")
    user, rate = soundfile.read(server.media / user_name, dtype="float32")
    assert rate == 16_000 and abs(len(user) / rate - audio_in) < 0.05
    assert JFK_WORDS in normalise(whisper.transcribe(user))
    assistant, rate = soundfile.read(server.media / assistant_name, dtype="float32")
    assert rate == 24_000 and abs(len(assistant) / rate - audio_out) < 0.05
    assert result.status == "completed"
    page = await asyncio.to_thread(_session_page_in_chromium, server, session_id)
    said = server.query(f"select text from pool_conversationitem where session_id = '{session_id}' and role = 'user'")
    assert said and all(text in page["text"] for (text,) in said) and "FIRST AUDIO SENT" in page["text"].upper()
    assert abs(page["durations"][0] - audio_in) < 0.1 and abs(page["durations"][1] - audio_out) < 0.1


def _session_page_in_chromium(server, session_id):
    """The admin's page of ``session_id``: its text, and the duration (s) each audio player
    loaded. A screenshot goes to artifacts/admin-session.png."""
    from .browser import admin_login, browser, screenshot_path

    [(pk,)] = server.query(f"select id from pool_session where session_id = '{session_id}'")
    path = f"/admin/pool/session/{pk}/change/"
    with browser() as chromium:
        page = chromium.new_page(viewport={"width": 1400, "height": 900})
        admin_login(page, server, path)
        durations = page.eval_on_selector_all("audio", """players => Promise.all(players.map(a =>
            new Promise(done => { a.onloadedmetadata = () => done(a.duration); a.onerror = () => done(-1);
                                  a.preload = "metadata"; a.load(); })))""")
        page.screenshot(path=str(screenshot_path("admin-session.png")), full_page=True)
        return {"text": page.inner_text("#content"), "durations": durations}


async def test_jfk_in_one_append_is_answered_once_all_of_it_is_heard(server):
    result, events = await converse(server, session={"type": "realtime"}, chunk_ms=None)
    committed, status = check_turns_answered(events)
    assert len(committed) >= 2
    assert list(status.values()) == ["completed"]  # one reply, to every turn of the append
    assert JFK_WORDS in normalise(result.user_transcript)


async def test_semantic_vad_keeps_the_sentence_whole_and_answers_it(server):
    result, events = await converse(server, session={
        "type": "realtime", "audio": {"input": {"turn_detection": {"type": "semantic_vad"}}}})
    committed, status = check_turns_answered(events)
    assert 1 <= len(committed) <= 2
    ends = [e["audio_end_ms"] for e in events if e["type"] == "input_audio_buffer.speech_stopped"]
    # Not cut at the pauses after "ask not" (~4.4 s) or "for you" (~7.6 s), as server_vad cuts it.
    assert not any(4000 < end < 8000 for end in ends), ends
    assert JFK_WORDS in normalise(result.user_transcript)
    assert result.status == "completed"


@pytest.fixture(scope="module")
def speak():
    """Speech synthesised by the project's own TTS in another voice than the assistant's:
    ``speak(text)`` -> float32 samples at 24 kHz."""
    from pool.backends.cache import default_paths
    from pool.backends.tts import KokoroTTS
    from pool.conf import get_config

    paths = default_paths(get_config()["MODEL_CACHE_DIR"])
    tts = KokoroTTS(paths["tts_model"], paths["tts_voices"], threads=1)
    return lambda text: tts.synthesize(text, "bf_emma")


async def test_backchannels_leave_the_reply_alone_and_a_real_interruption_cancels_it(server, speak):
    from openai import AsyncOpenAI

    quiet = np.zeros(PCM_RATE, np.float32)
    backchannels = [np.concatenate([speak("Mm-hmm."), quiet]), np.concatenate([speak("Yeah."), quiet])]
    interruption = np.concatenate([speak("Wait, stop, tell me a joke instead."), quiet, quiet])
    await _wait_idle(server.port)
    client = AsyncOpenAI(api_key="local", websocket_base_url=server.base_url)
    events = []

    async def say(samples):
        for chunk in pcm16_chunks(samples):
            await conn.input_audio_buffer.append(audio=base64.b64encode(chunk).decode())
            await asyncio.sleep(CHUNK_MS / 1000)

    async def until(kind, timeout=120):
        while True:
            event = await asyncio.wait_for(conn.recv(), timeout)
            events.append(event.to_dict())
            if event.type == kind:
                return event

    async with client.realtime.connect(model="s2s-default") as conn:
        await conn.session.update(session={"type": "realtime", "instructions": (
            "You are a storyteller. Tell a long story of at least ten sentences.")})
        await conn.conversation.item.create(item={"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "Tell me a long story about a lighthouse keeper."}]})
        await conn.response.create()
        story = (await until("response.created")).response.id
        await until("response.output_audio.delta")
        listening = len(events)
        for backchannel in backchannels:  # said while the story is being told
            sender = asyncio.create_task(say(backchannel))
            while not sender.done():
                try:
                    events.append((await asyncio.wait_for(conn.recv(), 0.2)).to_dict())
                except asyncio.TimeoutError:
                    pass
        during = [e["type"] for e in events[listening:]]
        assert "input_audio_buffer.speech_started" not in during, during
        assert "response.created" not in during and "input_audio_buffer.committed" not in during
        assert "response.done" not in during, "the story ended before the interruption: make it longer"
        sender = asyncio.create_task(say(interruption))
        done = await until("response.done")
        assert done.response.id == story
        assert done.response.status == "cancelled"
        assert done.response.status_details.reason == "turn_detected"
        await sender
        transcript = await until("conversation.item.input_audio_transcription.completed")
        turn = [(e["type"], e.get("audio_start_ms", e.get("audio_end_ms"))) for e in events[listening:]
                if e["type"].startswith("input_audio_buffer.")]
        assert "joke" in normalise(transcript.transcript), turn  # where the server heard it start and stop
        answer = await until("response.done")
        assert answer.response.status == "completed"
    spoken = [e for e in events if e["type"] == "conversation.item.input_audio_transcription.completed"]
    assert len(spoken) == 1  # the backchannels made no items


def test_manage_py_talk_follows_the_readme_example_to_a_spoken_answer(server, tmp_path):
    """The README's example, as a user runs it: ``manage.py talk ../shared/audio/jfk.flac``."""
    asyncio.run(_wait_idle(server.port))
    out = tmp_path / "reply.wav"
    run = subprocess.run([sys.executable, "manage.py", "talk", str(JFK), "--url", server.base_url,
                          "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.strip().splitlines()
    assert any(line.startswith("you:") for line in lines) and any(line.startswith("assistant:") for line in lines)
    assert JFK_WORDS in normalise(" ".join(line[4:] for line in lines if line.startswith("you:")))
    last = lines[-1]
    assert last.startswith("reply:") and last.endswith("(status completed)"), lines
    seconds = float(last.split()[1])
    assert seconds >= 0.5
    audio, rate = soundfile.read(out)
    assert rate == PCM_RATE and abs(len(audio) / rate - seconds) < 0.1

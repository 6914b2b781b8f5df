"""Turn-taking over the protocol on the scripted test backend: real Silero VAD and Smart Turn on
real speech, scripted STT/LLM/TTS (so transcripts and reply timing are chosen by the test).

The same promises with the real default models are in ``test_e2e_turns.py``.
"""

import asyncio
import base64

import numpy as np
import pytest

from pool.backends.scripted import SCRIPT
from realtime.audio import float_to_pcm16
from realtime.client import load_audio

from .helpers import JFK, appends, check_turns_answered, jfk_segment, silence, speech_appends, user_text

# The scripted backend's turn-taking, streamed at the recordings' own pace (the timing is the test).
pytestmark = [pytest.mark.usefixtures("scripted_pool"), pytest.mark.realtime]

# jfk.flac, as Silero hears it: speech 0.35-2.2 s ("And so my fellow Americans"), 3.3-4.4 s ("ask
# not"), 5.4-7.6 s ("what your country can do for you"), 8.2-10.5 s ("ask what you can do for
# your country"): pauses of 0.6-1.1 s, longer than the default 500 ms silence.
QUESTION = (0.0, 2.6)
SHORT = (3.25, 3.85)  # "ask": about 0.5 s of speech, a stand-in for "mm-hmm"
LONG = (8.0, 10.7)  # "ask what you can do for your country": 2.3 s of speech, no long pause


def by_length(audio):
    """Scripted STT: a short utterance is a backchannel, a longer one a request (peeks at the
    first 0.5 and 1 s of speech hear "Mm-hmm." too; the third hears the request)."""
    return "Mm-hmm." if len(audio) < 1.6 * 16_000 else "Wait, stop, tell me a joke instead."


async def ask_by_text(client, text="Tell me about the moon."):
    """A reply started without speech, so that the VAD hears only what the test sends next."""
    await client.send(user_text(text))
    await client.send({"type": "response.create"})


async def stream(client, samples, realtime=True, chunk_ms=40):
    for append in appends(samples, chunk_ms):
        await client.send(append)
        if realtime:
            await asyncio.sleep(chunk_ms / 1000)


async def until_idle(client, quiet_s=1.5, timeout=60):
    """Receive until no event has come for ``quiet_s`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        if await client.ws.receive_nothing(timeout=quiet_s, interval=0.05):
            return
        await client.recv()
    raise AssertionError("the session never went quiet")


async def session(connect, **turn_detection):
    client = await connect()
    await client.until("session.created")
    if turn_detection:
        await client.send({"type": "session.update",
                           "session": {"audio": {"input": {"turn_detection": turn_detection}}}})
        await client.until("session.updated")
    return client


def jfk_with_silence():
    return np.concatenate([load_audio(JFK), silence(2.0)])


def one_append(samples):
    return base64.b64encode(float_to_pcm16(samples)).decode()


def user_messages(request):
    return [msg["content"] for msg in request.messages if msg["role"] == "user"]


@pytest.mark.parametrize("turn_detection", [{}, {"interrupt_response": False}],
                         ids=["default", "interrupt_response_off"])
async def test_natural_pauses_every_turn_answered_and_no_stale_reply(connect, turn_detection):
    """jfk.flac in real time with the default 500 ms silence: several turns. A reply still being
    written when the user goes on is dropped before it says anything; the last turn is answered
    by a reply that saw every turn."""
    SCRIPT.transcript = lambda audio: f"words for {len(audio) // 1600} tenths"
    SCRIPT.token_delay = 0.2  # the reply's first phrase takes 0.8 s: the user goes on before it
    client = await session(connect, **turn_detection)
    sender = asyncio.create_task(stream(client, jfk_with_silence()))
    await client.until("response.done", timeout=60)
    await sender
    await until_idle(client)
    committed, status = check_turns_answered(client.received)
    assert len(committed) >= 3  # the pauses cut the recording into several turns
    cancelled = [e["response"] for e in client.received
                 if e["type"] == "response.done" and e["response"]["status"] == "cancelled"]
    assert all(r["status_details"]["reason"] == "turn_detected" for r in cancelled)
    assert list(status.values())[-1] == "completed"
    transcripts = [e["transcript"] for e in client.received
                   if e["type"] == "conversation.item.input_audio_transcription.completed"]
    assert user_messages(SCRIPT.requests[-1]) == transcripts  # the last reply saw every turn
    await client.ws.disconnect()


async def test_one_append_holding_several_utterances_gets_one_reply_to_all_of_them(connect):
    SCRIPT.transcript = lambda audio: f"words for {len(audio) // 1600} tenths"
    client = await session(connect)
    await client.send({"type": "input_audio_buffer.append", "audio": one_append(jfk_with_silence())})
    await client.until("response.done", timeout=30)
    await until_idle(client)
    committed, status = check_turns_answered(client.received)
    assert len(committed) >= 3
    assert list(status.values()) == ["completed"]  # one reply, built from every turn
    assert len(user_messages(SCRIPT.requests[-1])) == len(committed)
    await client.ws.disconnect()


async def test_a_turn_committed_during_a_reply_is_answered_after_it(connect):
    """interrupt_response off: the user speaks while the assistant speaks; the reply is not
    cancelled, and the new turn gets its own reply once it ends."""
    SCRIPT.transcript = by_length
    SCRIPT.token_delay = 0.3
    client = await session(connect, interrupt_response=False)
    await ask_by_text(client)
    await client.until("response.output_audio.delta", timeout=30)
    await stream(client, jfk_segment(*LONG), realtime=False)
    await stream(client, silence(1.0), realtime=False)
    await until_idle(client, quiet_s=2.0)
    check_turns_answered(client.received, interrupt_response=False)
    done = [e["response"]["status"] for e in client.received if e["type"] == "response.done"]
    assert done == ["completed", "completed"]
    assert user_messages(SCRIPT.requests[-1])[-1] == "Wait, stop, tell me a joke instead."
    await client.ws.disconnect()


async def test_speech_never_cancels_the_clients_own_response_with_interrupt_response_off(connect):
    """The stale-reply rule is for replies the server started for a turn: a response the client
    asked for is not cancelled by speech when interrupt_response is off, even before its first
    word, and the turn spoken meanwhile is answered after it."""
    SCRIPT.transcript = by_length
    SCRIPT.token_delay = 0.5  # nothing is said for about 2 s
    client = await session(connect, interrupt_response=False)
    await ask_by_text(client)
    await client.until("response.created")
    await stream(client, jfk_segment(*LONG), realtime=False)
    await stream(client, silence(1.0), realtime=False)
    first = await client.until("response.done", timeout=30)
    second = await client.until("response.done", timeout=30)
    assert first["response"]["status"] == second["response"]["status"] == "completed"
    assert user_messages(SCRIPT.requests[-1])[-1] == "Wait, stop, tell me a joke instead."
    await client.ws.disconnect()


async def test_a_backchannel_neither_interrupts_nor_starts_a_turn_and_a_real_interruption_does(connect):
    """Default settings. While the reply plays, a short "mm-hmm" leaves it alone: no
    speech_started (clients stop their playback on it), no item, no reply. Then "Wait, stop,
    tell me a joke instead" cancels it (turn_detected) and gets its own completed reply."""
    SCRIPT.transcript = by_length
    SCRIPT.token_delay = 0.4  # the reply takes about 4 s to write: it is active throughout
    SCRIPT.reply = "The moon is bright tonight. It has no air. Astronauts walked on it long ago."
    client = await session(connect)
    await ask_by_text(client)
    await client.until("response.output_audio.delta", timeout=30)
    heard = len(client.received)
    await stream(client, jfk_segment(*SHORT), realtime=False)  # "mm-hmm"
    await stream(client, silence(0.8), realtime=False)
    await asyncio.sleep(0.5)
    await stream(client, jfk_segment(*LONG), realtime=False)  # "wait, stop, ..."
    await stream(client, silence(1.0), realtime=False)
    await client.until("response.done", timeout=30)  # the reply, cancelled
    await client.until("response.done", timeout=30)  # the answer to the interruption
    await until_idle(client)
    after = client.received[heard:]
    types = [e["type"] for e in after]
    assert types.count("input_audio_buffer.speech_started") == 1  # the interruption only
    done = [e["response"] for e in client.received if e["type"] == "response.done"]
    assert [r["status"] for r in done] == ["cancelled", "completed"]
    assert done[0]["status_details"]["reason"] == "turn_detected"
    transcripts = [e["transcript"] for e in client.received
                   if e["type"] == "conversation.item.input_audio_transcription.completed"]
    assert transcripts == ["Wait, stop, tell me a joke instead."]
    assert "Mm-hmm." not in " ".join(user_messages(SCRIPT.requests[-1]))
    check_turns_answered(client.received)
    await client.ws.disconnect()


async def test_while_speech_over_the_reply_is_undecided_the_reply_synthesizes_nothing_it_can_wait_for(connect):
    """The peeks that decide whether the reply stops get the cores: between the first peek and
    the verdict the TTS starts no synthesis while the client holds seconds of audio. The reply
    writes a phrase every 0.3 s, each 1.2-2.4 s of speech, so without the wait the peeks would
    find new phrases synthesized between them."""
    synthesized_at_peeks = []

    def peeked(audio):
        synthesized_at_peeks.append(len(SCRIPT.tts_texts))
        return by_length(audio)

    SCRIPT.transcript = by_length
    SCRIPT.peek_transcript = peeked
    SCRIPT.token_delay = 0.3
    SCRIPT.seconds_per_char = 0.3
    SCRIPT.reply = " ".join(f"Phrase {n}." for n in range(40))
    client = await session(connect)
    await ask_by_text(client)
    await client.until("response.output_audio.delta", timeout=30)
    await asyncio.sleep(1.0)  # the client holds several seconds of audio
    await stream(client, jfk_segment(*LONG))  # heard as "mm-hmm" until 1.6 s, then a request
    done = await client.until("response.done", timeout=30)
    assert (done["response"]["status"], done["response"]["status_details"]["reason"]) == ("cancelled", "turn_detected")
    assert len(synthesized_at_peeks) >= 3 and len(set(synthesized_at_peeks)) == 1, synthesized_at_peeks
    await client.ws.disconnect()


@pytest.mark.parametrize("likeness, interrupted", [(-0.4, False), (-6.0, True)])
async def test_words_whisper_misheard_in_a_backchannel_sound_like_one_and_leave_the_reply_alone(
        connect, likeness, interrupted):
    """Whisper writes a listener's "uh-huh" in a voice it never heard as other words ("Dye
    her"); the peek also scores the audio against the backchannel phrases (its likeness): near
    0, it is one of them and the reply goes on; far below BACKCHANNEL_LIKENESS, the words are
    what was said, and they interrupt."""
    SCRIPT.transcript = "Dye her."
    SCRIPT.peek_transcript = "Dye her."
    SCRIPT.peek_likeness = likeness
    SCRIPT.token_delay = 0.4  # the reply is active throughout
    SCRIPT.reply = "The moon is bright tonight. It has no air. Astronauts walked on it long ago."
    client = await session(connect)
    await ask_by_text(client)
    await client.until("response.output_audio.delta", timeout=30)
    heard = len(client.received)
    await stream(client, jfk_segment(*SHORT), realtime=False)
    await stream(client, silence(1.0), realtime=False)
    done = await client.until("response.done", timeout=30)
    types = [e["type"] for e in client.received[heard:]]
    assert ("input_audio_buffer.speech_started" in types) is interrupted
    assert (done["response"]["status"], (done["response"]["status_details"] or {}).get("reason")) == (
        ("cancelled", "turn_detected") if interrupted else ("completed", None))
    await client.ws.disconnect()


ASK_NOT = "Ask not what your country can do for you."


@pytest.mark.parametrize("segment, transcript, peeked, likeness", [
    # Peeks at the first seconds hear only a cut-off word (Whisper hears "S..." for "Ask not").
    (LONG, ASK_NOT, lambda audio: "S..." if len(audio) < 2.5 * 16_000 else ASK_NOT, None),
    # Every peek at JFK's "Ask not" under 10 dB of noise heard "And not-": while it is said,
    # "not-" may be cut off by the peek and "And" alone is a backchannel word; in the whole
    # utterance "not" was said, in audio unlike any backchannel.
    (SHORT, "And not-", "And not-", -3.0),
], ids=["cut-off-word", "dashed-last-word"])
async def test_speech_over_the_reply_that_peeks_cannot_make_out_is_judged_when_it_ends(
        connect, segment, transcript, peeked, likeness):
    """Default settings. When speech over the reply ends, a last peek hears all of it and
    decides: words other than backchannels make it a turn, which interrupts and is answered,
    not dropped with its words."""
    SCRIPT.transcript = transcript
    SCRIPT.peek_transcript = peeked
    SCRIPT.peek_likeness = likeness
    SCRIPT.token_delay = 0.4  # the reply is active throughout
    SCRIPT.reply = "The moon is bright tonight. It has no air. Astronauts walked on it long ago."
    client = await session(connect)
    await ask_by_text(client)
    await client.until("response.output_audio.delta", timeout=30)
    await stream(client, jfk_segment(*segment), realtime=False)
    await stream(client, silence(1.0), realtime=False)
    await client.until("response.done", timeout=30)  # the reply, cancelled
    await client.until("response.done", timeout=30)  # the answer to the turn
    await until_idle(client)
    done = [e["response"] for e in client.received if e["type"] == "response.done"]
    assert [(r["status"], (r["status_details"] or {}).get("reason")) for r in done] == [
        ("cancelled", "turn_detected"), ("completed", None)]
    assert user_messages(SCRIPT.requests[-1])[-1] == transcript
    check_turns_answered(client.received)
    await client.ws.disconnect()


async def test_with_no_minimum_any_speech_over_the_reply_interrupts_at_once(connect, settings):
    """INTERRUPT_MIN_SPEECH_MS 0 is OpenAI's behaviour: speech_started cancels the reply."""
    settings.S2S = {**settings.S2S, "INTERRUPT_MIN_SPEECH_MS": 0}
    SCRIPT.transcript = by_length
    SCRIPT.token_delay = 0.4
    client = await session(connect)
    await ask_by_text(client)
    await client.until("response.output_audio.delta", timeout=30)
    await stream(client, jfk_segment(*SHORT), realtime=False)
    await stream(client, silence(1.0), realtime=False)
    done = await client.until("response.done", timeout=30)
    assert done["response"]["status_details"]["reason"] == "turn_detected"
    await client.ws.disconnect()


async def test_semantic_vad_waits_for_a_turn_that_ends_mid_sentence(connect):
    """A transcript ending in "for" is not answered at once: the user's next words join it."""
    said = iter(["I would like to book a table for", "two people tonight."])
    SCRIPT.transcript = lambda audio: next(said)
    client = await session(connect, type="semantic_vad")
    await stream(client, jfk_segment(*QUESTION), realtime=False)
    await stream(client, silence(1.0))  # in real time: the pause the user takes
    await stream(client, jfk_segment(*LONG), realtime=False)
    await stream(client, silence(1.0), realtime=False)
    await client.until("response.done", timeout=30)
    await until_idle(client)
    assert [e["type"] for e in client.received].count("response.created") == 1
    assert user_messages(SCRIPT.requests[-1]) == ["I would like to book a table for", "two people tonight."]
    await client.ws.disconnect()


async def test_truncate_while_the_reply_is_spoken_cuts_it_to_what_was_heard(connect):
    """What the SDKs send on every interruption: truncate the playing item, then cancel."""
    SCRIPT.token_delay = 0.2
    SCRIPT.reply = "One two three four. Five six seven eight. Nine ten eleven twelve."
    client = await session(connect, create_response=False)
    await client.send(user_text("Count."))
    await client.send({"type": "response.create"})
    delta = await client.until("response.output_audio.delta", timeout=30)
    await client.send({"type": "conversation.item.truncate", "item_id": delta["item_id"],
                       "content_index": 0, "audio_end_ms": 10_000_000})
    error = await client.until("error")
    assert error["error"]["code"] == "invalid_value" and error["error"]["param"] == "audio_end_ms"
    await client.send({"type": "conversation.item.truncate", "item_id": delta["item_id"],
                       "content_index": 0, "audio_end_ms": 100})
    truncated = await client.until("conversation.item.truncated")
    assert truncated["audio_end_ms"] == 100
    await client.send({"type": "response.cancel"})
    done = await client.until("response.done")
    assert done["response"]["status"] == "cancelled"
    spoken = done["response"]["output"][0]["content"][0]["transcript"]
    assert len(spoken.split()) < 4  # 100 ms of the first phrase: at most a word of it
    await client.send({"type": "conversation.item.retrieve", "item_id": delta["item_id"]})
    item = (await client.until("conversation.item.retrieved"))["item"]
    assert item["content"][0]["transcript"] == spoken
    await until_idle(client, quiet_s=0.5)
    assert "error" not in [e["type"] for e in client.received[-3:]]
    await client.ws.disconnect()


async def test_truncate_without_a_cancel_ends_the_reply_as_cancelled(connect):
    SCRIPT.token_delay = 0.2
    client = await session(connect, create_response=False)
    await client.send(user_text("Talk."))
    await client.send({"type": "response.create"})
    delta = await client.until("response.output_audio.delta", timeout=30)
    await client.send({"type": "conversation.item.truncate", "item_id": delta["item_id"],
                       "content_index": 0, "audio_end_ms": 0})
    await client.until("conversation.item.truncated")
    done = await client.until("response.done", timeout=30)
    assert done["response"]["status"] == "cancelled"
    assert done["response"]["output"][0]["content"][0]["transcript"] == ""
    await client.ws.disconnect()


async def test_a_function_output_for_an_unknown_call_is_refused_and_not_added(connect):
    client = await session(connect)
    await client.send({"type": "conversation.item.create", "event_id": "evt_1", "item": {
        "type": "function_call_output", "call_id": "call_nope", "output": "{}"}})
    error = await client.until("error")
    assert error["error"]["code"] == "invalid_tool_call_id"
    assert error["error"]["param"] == "item.call_id" and error["error"]["event_id"] == "evt_1"
    await client.send({"type": "conversation.item.create", "item": {
        "type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{}"}})
    await client.until("conversation.item.done")
    await client.send({"type": "conversation.item.create", "item": {
        "type": "function_call_output", "call_id": "call_1", "output": "{}"}})
    added = await client.until("conversation.item.added")
    assert added["item"]["call_id"] == "call_1"
    assert "call_nope" not in str([e for e in client.received if e["type"] == "conversation.item.added"])
    await client.ws.disconnect()


async def test_speech_appends_still_answer_one_clean_utterance(connect):
    """The simplest turn still works with the defaults: one sentence, one completed reply."""
    client = await session(connect, silence_duration_ms=1500)
    for append in speech_appends():
        await client.send(append)
    done = await client.until("response.done", timeout=30)
    assert done["response"]["status"] == "completed"
    await client.ws.disconnect()



async def test_idle_timeout_commits_the_silence_and_the_assistant_answers(connect):
    """server_vad's idle_timeout_ms: no speech for that long (here from when it was set) and the
    server says so (timeout_triggered), commits the silent buffer and answers it."""
    SCRIPT.transcript = ""  # silence: no words, answered all the same
    client = await session(connect, type="server_vad", idle_timeout_ms=5000)
    sender = asyncio.create_task(stream(client, silence(8.0)))
    triggered = await client.until("input_audio_buffer.timeout_triggered", timeout=15)
    committed = await client.until("input_audio_buffer.committed", timeout=5)
    done = await client.until("response.done", timeout=15)
    sender.cancel()
    assert committed["item_id"] == triggered["item_id"]
    # The silent segment is about the timeout, ending where the input is: about 5 s streamed.
    assert 4500 <= triggered["audio_end_ms"] - triggered["audio_start_ms"] <= 5000
    assert 4500 <= triggered["audio_end_ms"] <= 6500
    assert done["response"]["status"] == "completed"
    assert "input_audio_buffer.speech_started" not in client.types()
    assert client.types().count("input_audio_buffer.timeout_triggered") == 1  # once per silence
    assert client.types().count("input_audio_buffer.committed") == 1
    await client.ws.disconnect()

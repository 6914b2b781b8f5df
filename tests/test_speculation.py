"""Speculative replies on the scripted backend (real Silero VAD on real speech, scripted STT, LLM
and TTS): a reply started at the first pause of a turn is sent only if the turn ends there with
the same words, and then exactly as a reply started at the commit would be; otherwise nothing of
it is seen. Each scenario runs twice, with SPECULATIVE_REPLIES on and off, and the two event
streams are compared."""

import numpy as np
import pytest

from pool import metrics
from pool.backends.scripted import SCRIPT

from .helpers import jfk_segment, silence
from .test_turn_taking import session, stream, until_idle

pytestmark = [pytest.mark.usefixtures("scripted_pool"), pytest.mark.realtime]

# jfk.flac: "And so my fellow Americans" (0.35-2.2 s), a pause of 1.1 s, "ask not" (3.3-4.4 s).
FIRST_WORDS = (0.0, 2.6)
WITH_A_PAUSE = (0.0, 4.6)


def counted(outcome):
    return metrics.SPECULATIVE_REPLIES.labels(metrics.PROCESS, outcome)._value.get()


def stable(events):
    """The events as a client sees them, without their ids and times: what must not differ."""
    drop = {"event_id", "item_id", "response_id", "previous_item_id", "audio_start_ms", "audio_end_ms", "id",
            "call_id", "delta", "audio"}

    def clean(value):
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items() if k not in drop}
        if isinstance(value, list):
            return [clean(v) for v in value]
        return value

    return [clean(e) for e in events if e["type"] != "response.output_audio.delta"]


async def converse(connect, settings, speculate, audio, **turn_detection):
    """The events of one spoken turn and its reply, with SPECULATIVE_REPLIES ``speculate``."""
    settings.S2S = {**settings.S2S, "SPECULATIVE_REPLIES": speculate}
    SCRIPT.reset()
    SCRIPT.transcript = lambda audio: f"A question of {len(audio) // 16_000} seconds."
    client = await session(connect, **turn_detection)
    start = len(client.received)
    await stream(client, np.concatenate([audio, silence(1.5)]))
    await client.until("response.done", timeout=30)
    await until_idle(client)
    await client.ws.disconnect()
    return client.received[start:], list(SCRIPT.requests)


async def test_a_reply_started_at_the_pause_is_used_when_the_turn_ends_there(connect, settings):
    used, discarded = counted("used"), counted("discarded")
    with_it, asked = await converse(connect, settings, True, jfk_segment(*FIRST_WORDS))
    assert (counted("used"), counted("discarded")) == (used + 1, discarded)
    without, asked_without = await converse(connect, settings, False, jfk_segment(*FIRST_WORDS))
    assert stable(with_it) == stable(without)  # the same events, in the same order
    assert [r.messages for r in asked] == [r.messages for r in asked_without]  # no second reply was asked for
    done = next(e for e in with_it if e["type"] == "response.done")["response"]
    assert done["status"] == "completed" and done["usage"]["output_tokens"] > 0


async def test_a_reply_started_at_a_pause_the_user_talks_through_leaves_no_trace(connect, settings):
    """silence_duration_ms 1500: the 1.1 s pause after "fellow Americans" is not the end of the
    turn. The reply started there is discarded when speech resumes, and the conversation, the
    events and the tokens counted are those of a run that never speculated (the reply started
    at the turn's last pause is used)."""
    used, discarded = counted("used"), counted("discarded")
    with_it, asked = await converse(connect, settings, True, jfk_segment(*WITH_A_PAUSE), silence_duration_ms=1500)
    # Discarded at the pause the user talked through; the one at the end of the turn is used.
    assert (counted("used"), counted("discarded")) == (used + 1, discarded + 1)
    without, asked_without = await converse(connect, settings, False, jfk_segment(*WITH_A_PAUSE),
                                            silence_duration_ms=1500)
    assert stable(with_it) == stable(without)
    # The discarded reply asked for its first phrase only; the turn's reply, as without it.
    assert len(asked) == len(asked_without) + 1
    assert [r.messages for r in asked[1:]] == [r.messages for r in asked_without]
    speculative = asked[0].messages[-1]["content"]
    assert speculative != asked[-1].messages[-1]["content"]  # it was made on the first words only
    assert speculative not in str(with_it)  # and nothing of it reached the client


async def test_a_pause_the_user_talked_through_while_it_was_transcribed_starts_no_reply(connect, settings):
    """The STT's transcript of a pause can arrive after speech has resumed (a slow STT, a busy
    machine): that pause is over, and a reply started on it would be computed only to be thrown
    away. The pause's transcription here takes 1.2 s, past the end of the 1.1 s pause."""
    import time

    started, discarded = counted("used") + counted("discarded"), counted("discarded")
    slow_first = iter([1.2])

    async def converse_slowly(speculate):
        settings.S2S = {**settings.S2S, "SPECULATIVE_REPLIES": speculate}
        SCRIPT.reset()

        def transcript(audio):
            time.sleep(next(slow_first, 0.0))  # only the first: the pause's speculation
            return f"A question of {len(audio) // 16_000} seconds."

        SCRIPT.transcript = transcript
        client = await session(connect, silence_duration_ms=1500)
        start = len(client.received)
        await stream(client, np.concatenate([jfk_segment(*WITH_A_PAUSE), silence(1.5)]))
        await client.until("response.done", timeout=30)
        await until_idle(client)
        await client.ws.disconnect()
        return client.received[start:], list(SCRIPT.requests)

    with_it, asked = await converse_slowly(True)
    # One reply was started, at the turn's last pause, and used; none on the stale pause.
    assert (counted("used") + counted("discarded"), counted("discarded")) == (started + 1, discarded)
    without, asked_without = await converse_slowly(False)
    assert stable(with_it) == stable(without)
    assert [r.messages for r in asked] == [r.messages for r in asked_without]  # no LLM call for the stale pause


def test_a_reply_is_speculated_on_only_for_a_turn_that_would_be_answered_at_once():
    from types import SimpleNamespace

    from pool.conf import DEFAULTS
    from realtime.session.conversation import Conversation
    from realtime.session.turns import TurnTaking
    from realtime.session_config import Backchannels

    turns = TurnTaking("sess_1", Conversation(), 300, Backchannels(tuple(DEFAULTS["BACKCHANNEL_WORDS"])))
    turns.turn_detection = {"type": "server_vad", "create_response": True, "interrupt_response": True}
    turns.speaking = "item_1"
    assert turns.may_speculate("item_1", "What is the capital of France?")
    assert not turns.may_speculate("item_2", "What is the capital of France?")  # not the speech in progress
    assert not turns.may_speculate("item_1", "...")  # no words
    turns.response = SimpleNamespace()  # a reply under way: the turn would wait for it
    assert not turns.may_speculate("item_1", "What is the capital of France?")
    turns.response = None
    turns.untranscribed.add("item_0")  # an earlier turn not transcribed yet
    assert not turns.may_speculate("item_1", "What is the capital of France?")
    turns.untranscribed.clear()
    turns.turn_detection = {"type": "semantic_vad", "create_response": True}
    assert not turns.may_speculate("item_1", "I would like to book a table for")  # mid-sentence: it waits
    turns.turn_detection = {"type": "server_vad", "create_response": False}
    assert not turns.may_speculate("item_1", "What is the capital of France?")  # no automatic replies

"""Interruptions end to end: cases of the interruption corpus (``bench.interruption_corpus``) said
over a story the real default models are telling, by a client on laptop speakers written with the
official ``openai`` SDK (``bench.interruptions.run_case``: it plays the reply in real time, stops
it at ``speech_started`` and streams its microphone, echo included). Voices the server never
speaks in: other Kokoro voices, espeak-ng's formant voices, a real human recording."""

import pytest

from bench.interruption_corpus import Case, Renderer
from bench.interruptions import run_case

from .test_e2e import _wait_idle

ECHO = (150, -15.0, 0.3)  # 150 ms late, 15 dB quieter, RT60 0.3 s: a laptop on a desk
CASES = [
    Case("backchannel", "Mm-hmm.", "kokoro:af_nova", "en", None, "held_out"),
    Case("backchannel", "Yeah.", "espeak:en-gb-scotland+m2:30:140", "en", 20.0, "held_out"),
    Case("backchannel", "I see.", "kokoro:bm_george", "en", None, "held_out"),
    Case("echo", "echo", "", "en", None, "held_out", ECHO),
    # Misses now and then (#27, BENCHMARKS.md 14a: echo + interruption missed 1 of 8 on the
    # corpus): AEC3, started on the echo a second before, takes "Wait." for echo in double talk
    # (server log: "echo of the playback removed from the microphone" over the word). Seen in 1 of
    # 1 CI-like runs on a Zen 3 (2026-12-03), 2 of 3 on a Zen 5 before 9abfbb0; since the peek
    # fixes (621a01e, 3ba5449) in 3 of 14 runs on a Xeon with VNNI (the one whose log was read,
    # that way). Kept in the suite, reported as XFAIL or XPASS, until double talk is decided.
    pytest.param(Case("echo_interruption", "Wait.", "kokoro:am_echo", "en", None, "held_out", ECHO),
                 marks=pytest.mark.xfail(strict=False, reason="#27: AEC3 may remove a voice over "
                                         "an echo it started on (double talk)")),
    Case("interruption", "Sorry, what?", "espeak:en-029+f4:70:190", "en", None, "held_out"),
    Case("interruption", "And so my fellow Americans.", "human:jfk-fellow-americans", "en", None, "held_out"),
]


class SDKConnection:
    """``run_case``'s connection over the openai SDK's realtime connection."""

    def __init__(self, connection):
        self.connection = connection

    async def send(self, event):
        await self.connection.send(event)

    async def recv(self):
        return (await self.connection.recv()).to_dict()


@pytest.fixture(scope="module")
def renderer():
    """The corpus's renderer with the project's Kokoro (for the Kokoro voices)."""
    from pool.backends.cache import default_paths
    from pool.backends.tts import KokoroTTS
    from pool.conf import get_config

    paths = default_paths(get_config()["MODEL_CACHE_DIR"])
    return Renderer(KokoroTTS(paths["tts_model"], paths["tts_voices"], threads=1))


@pytest.mark.parametrize("case", CASES, ids=lambda case: f"{case.kind}-{case.phrase}-{case.voice or 'echo'}")
async def test_what_a_listener_says_over_the_story_does_to_it(server, renderer, case):
    from openai import AsyncOpenAI

    await _wait_idle(server.port)
    client = AsyncOpenAI(api_key="local", websocket_base_url=server.base_url)
    async with client.realtime.connect(model="s2s-default") as connection:
        row = await run_case(SDKConnection(connection), case, renderer)
    assert row["valid"], "the story never started playing"
    assert not row["before_utterance"], row  # nothing stopped the story before the listener spoke
    if case.interrupts:
        # The story stopped (speech_started, and its response cancelled or its playback cut);
        # how fast is the benchmark's to measure (bench.interruptions), not a test's.
        assert row["stopped_after_s"] is not None and row["turns"] >= 1, row
    else:
        assert not row["false"], row  # no speech_started, no cancelled reply, no turn

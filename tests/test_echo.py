"""Echo-aware barge-in at the VAD stage: a client on laptop speakers sends the assistant's own voice
back as its microphone. The real Silero VAD and WebRTC's echo canceller, with what the server sent
as the reference; the echo goes through a room (``bench.interruption_corpus.room``)."""

import queue

import numpy as np
import pytest
import soxr

from bench.double_talk import RATE, SENT_AT, echo_of, listen
from bench.interruption_corpus import active_rms
from pool.backends.scripted import load_scripted
from pool.conf import DEFAULTS
from pool.pipeline import messages as m
from pool.pipeline.playback import Playback

from .helpers import HOTWORDS, JFK, load_audio, normalise


@pytest.fixture(scope="module")
def backends():
    return load_scripted({**DEFAULTS, "BACKEND": "scripted"})


def kinds(events):
    return [type(e).__name__ for e in events]


@pytest.fixture(scope="module")
def reply():
    """The assistant's reply as the client plays it: 11 s of real speech (jfk.flac)."""
    return load_audio(JFK)


@pytest.mark.parametrize("delay_ms, gain_db, rt60_s", [(100, -10.0, 0.25), (250, -25.0, 0.4), (150, -15.0, 0.3)])
def test_the_assistants_own_voice_from_the_speakers_is_not_speech(backends, reply, delay_ms, gain_db, rt60_s):
    mic = echo_of(reply, delay_ms, gain_db, rt60_s)
    events = listen(backends, mic, reply)
    assert "SpeechStarted" not in kinds(events)
    removed = [e for e in events if isinstance(e, m.EchoRemoved)]
    # Said where it was: seconds of it, from when two matches on audio of their own agreed on
    # its delay (the first 0.6 s or so pass uncancelled; they are not taken for speech either).
    assert removed and sum(e.end_ms - e.start_ms for e in removed) > 1500


@pytest.mark.parametrize("delay_ms, gain_db, rt60_s", [(100, -25.0, 0.4), (250, -25.0, 0.25), (250, -10.0, 0.4)])
def test_a_faint_echo_through_a_reverberant_room_is_not_speech(backends, delay_ms, gain_db, rt60_s):
    """A quiet echo through a room scores about ECHO_SIMILARITY against the playback, now just
    above, now just below, at delays that wander by tens of ms (reverberation). Before, each
    weak match dropped a speech candidate until one check scored below the threshold, and the
    echo of the reply's first second became speech (here hotwords.mp3 at -25 dB, RT60 0.4 s;
    BENCHMARKS.md 14b)."""
    reply = load_audio(HOTWORDS)
    events = listen(backends, echo_of(reply, delay_ms, gain_db, rt60_s), reply)
    assert "SpeechStarted" not in kinds(events)


def test_without_the_canceller_the_echo_is_heard_as_speech(backends, reply):
    """The same microphone, for a transport whose echo is not cancelled (keeps_audio off)."""
    mic = echo_of(reply, 150, -15.0, 0.3)
    assert "SpeechStarted" in kinds(listen(backends, mic, reply, keeps_audio=False))


def test_a_real_voice_over_the_echo_is_speech_and_keeps_its_words(backends, reply, whisper):
    """The user talks over the echo, at a normal level: speech, from where they began, and the
    turn the STT is given holds their words, not the assistant's (the canceller passed them)."""
    user = load_audio(HOTWORDS)
    user = user * (0.1 / active_rms(user))
    mic = echo_of(reply, 150, -15.0, 0.3)
    at = 3 * RATE
    mic[at:at + len(user)] += user[: len(mic) - at]
    stt_inbox = queue.Queue()
    events = listen(backends, mic, reply, stt_inbox=stt_inbox)
    started = [e for e in events if isinstance(e, m.SpeechStarted)]
    assert len(started) == 1 and 2700 <= started[0].audio_start_ms <= 3400
    turns = [msg for _, msg in list(stt_inbox.queue) if isinstance(msg, m.Transcribe)]
    heard = normalise(" ".join(whisper.transcribe(t.audio, "en") for t in turns))
    assert "then you go into your" in heard, heard
    assert not {"country", "americans", "fellow", "ask"} & set(heard.split()), heard


def test_nothing_is_cancelled_while_nothing_plays(backends):
    """A listening session pays nothing: with no reply playing, the input passes as it came."""
    user = load_audio(HOTWORDS)
    events = listen(backends, user, np.zeros(0, np.float32))
    assert kinds(events)[0] == "SpeechStarted"
    assert not [e for e in events if isinstance(e, m.EchoRemoved)]


def test_the_playback_model_says_what_played_when(reply):
    now = [SENT_AT]
    playback = Playback(keeps_audio=True, clock=lambda: now[0])
    playback.sent(1.0, reply[:RATE])
    playback.sent(1.0, reply[RATE:2 * RATE])  # queued behind the first second
    assert playback.end == SENT_AT + 2.0
    expected = soxr.resample(reply[RATE:2 * RATE], RATE, 16_000)
    got = playback.reference(SENT_AT + 1.0, 16_000)
    assert np.abs(got - expected).max() < 1e-4
    now[0] = SENT_AT + 0.5
    playback.stopped()  # cancelled half a second in: nothing after it played
    assert playback.end == SENT_AT + 0.5 and not playback.reference(SENT_AT + 0.5, 8000).any()
    assert playback.reference(SENT_AT, 8000).any()


def test_a_client_given_replies_faster_than_it_plays_them_holds_a_bounded_reference(reply):
    """Back-to-back text turns: 200 seconds of replies sent at once. What is kept for the echo
    canceller stops AHEAD_SECONDS past now (test_faults' 200-turn call grew by 64 KB a turn)."""
    from pool.pipeline.playback import AHEAD_SECONDS, KEEP_SECONDS

    now = [SENT_AT]
    playback = Playback(keeps_audio=True, clock=lambda: now[0])
    for _ in range(200):
        playback.sent(1.0, reply[:RATE])
    assert playback.end == SENT_AT + 200.0  # it still plays all of it, in order
    kept = sum(len(samples) for _, samples in playback._chunks) / 16_000
    assert kept <= AHEAD_SECONDS + KEEP_SECONDS + 1.0
    assert playback.reference(SENT_AT + 10.0, 16_000).any()  # what plays next is still known


def test_a_voice_over_a_reply_the_microphone_does_not_hear_passes_untouched(backends, reply):
    """A client on headphones: its microphone hears the user, not the reply. The canceller never
    starts (AEC3 attenuates a voice while its reference plays, echo or not: run for every client,
    it cost every interruption of the corpus), so the STT gets the user's audio as it came."""
    user = load_audio(HOTWORDS)
    user = user * (0.1 / active_rms(user))
    mic = np.zeros(len(reply), np.float32)
    at = 2 * RATE
    mic[at:at + len(user)] = user
    stt_inbox = queue.Queue()
    events = listen(backends, mic, reply, stt_inbox=stt_inbox)
    assert kinds(events)[0] == "SpeechStarted" and not [e for e in events if isinstance(e, m.EchoRemoved)]
    [turn] = [msg for _, msg in list(stt_inbox.queue) if isinstance(msg, m.Transcribe)]
    sent = soxr.resample(user, RATE, 16_000)
    assert abs(20 * np.log10(active_rms(turn.audio, 16_000) / active_rms(sent, 16_000))) < 0.5


def test_a_voice_that_once_sounds_like_the_playback_does_not_start_the_canceller(backends, reply):
    """A user's word can resemble the playback by chance (an e2e "Yeah" did, once in a few runs);
    a real echo comes back at the same delay again and again. One match must not start the
    canceller: run on a voice, AEC3 takes its words away (the e2e "Wait, stop, tell me a joke
    instead." that followed was removed as echo, and the reply went on). Here the microphone
    hears 250 ms of a voice that resembles the playback, 150 ms late (a trace of it under the
    voice: similarity 0.22-0.29, as chance matches scored), then the user talks over the reply:
    the user's speech starts, nothing is removed, and the STT gets it at its level."""
    user = load_audio(HOTWORDS)
    mic = np.zeros(len(reply), np.float32)
    at, length, late = RATE, RATE // 4, RATE * 150 // 1000
    mic[at:at + length] = reply[at - late:at - late + length] * 0.02 + user[RATE // 2:RATE // 2 + length] * 0.1
    user = user * (0.1 / active_rms(user))
    start = 3 * RATE
    mic[start:start + len(user)] = user
    stt_inbox = queue.Queue()
    events = listen(backends, mic, reply, stt_inbox=stt_inbox)
    assert "SpeechStarted" in kinds(events) and not [e for e in events if isinstance(e, m.EchoRemoved)]
    turn = [msg for _, msg in list(stt_inbox.queue) if isinstance(msg, m.Transcribe)][-1]
    sent = soxr.resample(user, RATE, 16_000)
    assert abs(20 * np.log10(active_rms(turn.audio, 16_000) / active_rms(sent, 16_000))) < 0.5


@pytest.mark.parametrize("traces", [[(0.05, 0.0)], [(0.02, 0.1), (0.02, 0.1)]], ids=["one strong", "two agreeing"])
def test_a_voice_that_resembles_the_playback_then_talks_alone_keeps_its_words(backends, reply, traces):
    """A user who talks on over a reply their microphone does not hear (headphones, or a client
    that cancels its own echo), and whose voice resembles the playback for a moment or two: once
    strongly (Kokoro's am_echo against af_alloy scored 0.45, over ECHO_SURE_SIMILARITY), or
    twice weakly at the same delay (am_puck, af_nova: bench.double_talk). Here each moment is
    300 ms of the playback, 150 ms late (``(gain, voice)``: the playback's gain, and the level of
    a voice on top), 600 ms apart; then the user talks. Before, the canceller started at the
    match and AEC3 took the words away (the e2e JFK over a reply, interrupt_response off, lost
    "what your country can do for you"); an echo follows the playback all along, so the
    canceller waits until the microphone has, window after window."""
    user = load_audio(HOTWORDS)
    user = user * (0.1 / active_rms(user))
    mic = np.zeros(len(reply), np.float32)
    length, late = RATE * 3 // 10, RATE * 150 // 1000
    for i, (gain, voice) in enumerate(traces):
        at = RATE + i * RATE * 6 // 10
        mic[at:at + length] = reply[at - late:at - late + length] * gain + user[at:at + length] * voice
    start = RATE + len(traces) * RATE * 6 // 10
    mic[start:start + len(user)] = user[: len(mic) - start]
    stt_inbox = queue.Queue()
    events = listen(backends, mic, reply, stt_inbox=stt_inbox)
    assert not [e for e in events if isinstance(e, m.EchoRemoved)]
    turns = [msg for _, msg in list(stt_inbox.queue) if isinstance(msg, m.Transcribe)]
    said = np.concatenate([t.audio for t in turns])
    sent = soxr.resample(user, RATE, 16_000)
    assert abs(20 * np.log10(active_rms(said, 16_000) / active_rms(sent, 16_000))) < 0.5


@pytest.mark.parametrize("gain", [0.1, 1.0])
def test_a_first_word_like_the_playback_on_a_microphone_without_echo_is_speech(backends, reply, gain):
    """A client on headphones plays the reply for 2 s; its microphone hears nothing of it. Then
    the user speaks, and their first 300 ms resemble the playback (here: the playback itself,
    150 ms late, under the voice; live, af_sarah's "What" against af_alloy by chance). A
    microphone that did not follow the playback through seconds of it has no echo path: the
    speech starts with its first word (before, that word was dropped as echo and the speech
    started 350-500 ms later, without it)."""
    user = load_audio(HOTWORDS)
    user = user * (0.1 / active_rms(user))
    mic = np.zeros(len(reply), np.float32)
    at, length, late = 2 * RATE, RATE * 3 // 10, RATE * 150 // 1000
    mic[at:at + len(user)] = user[: len(mic) - at]
    mic[at:at + length] = reply[at - late:at - late + length] * gain + user[:length] * 0.3
    events = listen(backends, mic, reply)
    [started, *_] = [e for e in events if isinstance(e, m.SpeechStarted)]
    assert started.audio_start_ms <= 2000  # the first word is in it (with its prefix padding)
    assert not [e for e in events if isinstance(e, m.EchoRemoved)]


@pytest.mark.parametrize("user_from_s, reply_from_s", [(1.0, 0.5), (1.4, 0.5), (5.8, 0.5), (8.1, 0.5), (2.2, 1.0)])
def test_a_voice_a_reply_begins_over_gets_the_turns_it_gets_alone(backends, user_from_s, reply_from_s):
    """A user talks on as a reply begins, on a microphone that hears nothing of it (headphones;
    the e2e JFK with interrupt_response off). Matched on the reply's first tens of ms, any two
    voices look alike: before, the first probe (on 30 ms of microphone) or a delay reaching back
    before the reply began found the echo on a chance likeness, and the canceller took seconds of
    the user's words (an e2e run lost "what your country can"). The microphone: jfk.flac from
    ``user_from_s``; the reply: hotwords.mp3 from ``reply_from_s`` (offsets where the old check
    failed, of a scan over both, BENCHMARKS.md 14s). Its speech and turns are those it has with
    no reply playing at all."""
    user = load_audio(JFK)[int(user_from_s * RATE):]
    reply = load_audio(HOTWORDS)[int(reply_from_s * RATE):]
    events = listen(backends, user, reply)
    alone = listen(backends, user, np.zeros(0, np.float32))
    assert not [e for e in events if isinstance(e, m.EchoRemoved)]
    assert [(type(e), getattr(e, "audio_start_ms", None), getattr(e, "audio_end_ms", None)) for e in events] == [
        (type(e), getattr(e, "audio_start_ms", None), getattr(e, "audio_end_ms", None)) for e in alone]


@pytest.fixture(scope="module")
def story():
    """Kokoro's story in the reply's voice (af_alloy), as bench.double_talk plays it."""
    from bench.double_talk import story
    from pool.backends.cache import default_paths
    from pool.backends.tts import KokoroTTS

    paths = default_paths(DEFAULTS["MODEL_CACHE_DIR"])
    return story(KokoroTTS(paths["tts_model"], paths["tts_voices"], threads=2))


@pytest.mark.models
def test_a_window_the_reply_began_in_confirms_no_echo(backends, story):
    """The third route of the kind above, from bench.double_talk's "begun over" cases: JFK
    under way (from 4.9 s) when Kokoro's story begins; at 0.55 s of microphone a match of 0.40
    at a delay of 443 ms had 107 ms of the story played inside it, and the one window it could
    be confirmed on held the story's first 90 ms and the silence before: the canceller started
    and took 2.9 s of JFK. A window confirms an echo only where the playback sounded in the
    window before it too."""
    from bench.interruption_corpus import Renderer, active_rms

    voice = load_audio(JFK)
    user = (voice * (Renderer.LEVEL / active_rms(voice)))[int(4.9 * RATE):]
    events = listen(backends, user, story, step_ms=20)
    alone = listen(backends, user, np.zeros(0, np.float32), step_ms=20)
    assert not [e for e in events if isinstance(e, m.EchoRemoved)]
    assert [(type(e), getattr(e, "audio_start_ms", None)) for e in events] == [
        (type(e), getattr(e, "audio_start_ms", None)) for e in alone]


def test_what_sounds_like_the_playback(reply):
    """echo.similarity: the playback, late and through a room, scores high; pink noise (a fan),
    or a near-silent stretch of the playback, scores low - a noisy microphone is not taken for
    one that hears its speakers (it was, before the pre-emphasis and the level floor)."""
    from bench.interruption_corpus import pink_noise
    from pool.backends.echo import similarity
    from pool.pipeline.stages.vad import ECHO_SIMILARITY

    played = soxr.resample(reply, RATE, 16_000).astype(np.float32)
    end = 5 * 16_000
    reference = played[end - 16_000:end]  # the last second played
    echo = echo_of(reply, 150, -15.0, 0.3)
    heard = soxr.resample(echo, RATE, 16_000).astype(np.float32)[end - 6400:end]
    assert similarity(heard, reference) >= ECHO_SIMILARITY
    for seed in range(5):
        assert similarity(pink_noise(6400, seed) * 0.01, reference) < ECHO_SIMILARITY / 2
    hush = np.random.default_rng(0).standard_normal(16_000).astype(np.float32) * 1e-4 + 0.002  # hum and hiss
    assert similarity(pink_noise(6400, 9) * 0.01, hush) == 0.0

"""Turn detection on a real recording through the VAD stage, with the real Silero model."""

import base64
import queue
import threading
import time

import numpy as np
import pytest

from pool.backends.base import Backends
from pool.backends.scripted import load_scripted
from pool.backends.vad import SileroVAD
from pool.conf import DEFAULTS
from pool.pipeline import messages as m
from pool.pipeline.stages.stt import STTStage
from pool.pipeline.stages.vad import VADStage
from realtime import session_config as sc
from realtime.audio import InputAudioDecoder

from .helpers import JFK, speech_appends, wait_for


@pytest.fixture(scope="module")
def backends():
    return load_scripted({**DEFAULTS, "BACKEND": "scripted"})


def run_vad(backends, silence_ms, threshold=0.5, path=JFK, check_ms=None, silence_s=2.0, speculations=None):
    stt_inbox = queue.Queue()
    stage = VADStage(backends, stt_inbox)
    events = []
    ctx = m.SessionContext(events.append)
    stage.handle(ctx, m.ConfigureInput(InputAudioDecoder({"type": "audio/pcm", "rate": 24000}),
                                       m.TurnDetection(threshold, 300, silence_ms, check_ms), "en"))
    for append in speech_appends(path, silence_s=silence_s):
        stage.handle(ctx, m.AppendInput(append["audio"]))
    transcribe = []
    while not stt_inbox.empty():
        transcribe.append(stt_inbox.get()[1])
    if speculations is not None:
        speculations.extend(t for t in transcribe if isinstance(t, m.Speculate))
    return events, [t for t in transcribe if not isinstance(t, m.Speculate)]


def test_long_silence_setting_keeps_the_sentence_in_one_turn(backends):
    speculations = []
    events, transcribe = run_vad(backends, silence_ms=1500, speculations=speculations)
    # Each pause the speech went on after is told (SpeechResumed: what the STT speculated on
    # there is of no use); the last pause is the end of the turn.
    resumed = [e for e in events if isinstance(e, m.SpeechResumed)]
    assert len(resumed) == len(speculations) - 1 >= 1
    events = [e for e in events if not isinstance(e, m.SpeechResumed)]
    kinds = [type(e).__name__ for e in events]
    assert kinds == ["SpeechStarted", "SpeechStopped", "InputCommitted"]
    assert {e.item_id for e in resumed} == {events[0].item_id}
    started, stopped, committed = events
    assert started.item_id == stopped.item_id == committed.item_id == transcribe[0].item_id
    # JFK speaks from about 0.3 s to about 10.8 s of the 11 s recording
    assert 0 <= started.audio_start_ms < 1500
    assert 9500 < stopped.audio_end_ms < 11_500
    assert abs(len(transcribe[0].audio) / 16 - committed.audio_ms) <= 1
    assert committed.audio_ms > 9000


def test_short_silence_setting_splits_the_speech_at_its_pauses(backends):
    events, transcribe = run_vad(backends, silence_ms=300)
    starts = [e for e in events if isinstance(e, m.SpeechStarted)]
    stops = [e for e in events if isinstance(e, m.SpeechStopped)]
    assert len(starts) == len(stops) == len(transcribe) >= 2
    ends = [s.audio_end_ms for s in stops]
    assert ends == sorted(ends)


def test_threshold_one_hears_no_speech(backends):
    events, transcribe = run_vad(backends, silence_ms=500, threshold=1.0)
    assert events == [] and transcribe == []


def test_invalid_base64_and_odd_pcm_are_rejected_and_the_stream_goes_on(backends):
    stage = VADStage(backends, queue.Queue())
    events = []
    ctx = m.SessionContext(events.append)
    stage.handle(ctx, m.ConfigureInput(InputAudioDecoder({"type": "audio/pcm", "rate": 24000}), None, None))
    stage.handle(ctx, m.AppendInput("***not base64***", "evt_a"))
    stage.handle(ctx, m.AppendInput(base64.b64encode(b"\x00\x00\x00").decode(), "evt_b"))
    stage.handle(ctx, m.AppendInput(base64.b64encode(b"\x00\x00" * 4800).decode(), "evt_c"))
    stage.handle(ctx, m.CommitInput("evt_d"))
    assert [(type(e).__name__, getattr(e, "code", None), e.event_id) for e in events] == [
        ("InputRejected", "invalid_base64", "evt_a"),
        ("InputRejected", "invalid_audio", "evt_b"),
        ("InputCommitted", None, "evt_d"),
    ]


def test_shared_model_keeps_streams_independent(backends):
    import numpy as np

    from realtime.client import load_audio

    vad: SileroVAD = backends.vad
    speech = load_audio(JFK, 16_000)[16_000:16_000 + 512 * 20].astype(np.float32)
    alone = [vad.new_stream().probability(speech[:512])]
    a, b = vad.new_stream(), vad.new_stream()
    for i in range(20):
        a.probability(speech[i * 512:(i + 1) * 512])
    assert b.probability(speech[:512]) == pytest.approx(alone[0], abs=1e-6)


def test_semantic_vad_keeps_mid_sentence_pauses_inside_the_turn(backends):
    """Smart Turn hears that "ask not" and "what your country can do for you" are unfinished,
    where a 500 ms silence timer cuts them (issue: natural pauses split a sentence)."""
    server = [e for e in run_vad(backends, silence_ms=500)[0] if isinstance(e, m.InputCommitted)]
    events, transcribe = run_vad(backends, silence_ms=sc.EAGERNESS_SILENCE_MS["auto"],
                                 check_ms=sc.END_OF_TURN_CHECK_MS)
    semantic = [e for e in events if isinstance(e, m.SpeechStopped)]
    assert len(server) >= 3
    assert 1 <= len(semantic) <= 2, [e.audio_end_ms for e in semantic]
    # No turn ends at the pauses after "ask not" (~4.4 s) or "for you" (~7.6 s).
    assert not any(4000 < e.audio_end_ms < 8000 for e in semantic), [e.audio_end_ms for e in semantic]
    # The last turn holds "ask what you can do for your country" (to ~10.5 s) in one piece.
    assert semantic[-1].audio_end_ms > 10_000
    assert len(transcribe) == len(semantic)


def test_semantic_vad_without_an_end_of_turn_model_ends_turns_on_the_fallback_silence(backends):
    import dataclasses

    silence_only = dataclasses.replace(backends, turn=None)
    events, _ = run_vad(silence_only, silence_ms=2000, check_ms=sc.END_OF_TURN_CHECK_MS, silence_s=3.0)
    turn = [type(e).__name__ for e in events if not isinstance(e, m.SpeechResumed)]  # pauses talked through
    assert turn == ["SpeechStarted", "SpeechStopped", "InputCommitted"]


def server_vad_stage(backends):
    """``(stage, ctx, events, stt_inbox)``: a VAD stage with the default server_vad (threshold
    0.5, 300 ms prefix padding, 500 ms silence) on 24 kHz PCM16; ``events`` gets what it emits,
    ``stt_inbox`` what it hands the STT."""
    stt_inbox = queue.Queue()
    stage = VADStage(backends, stt_inbox)
    events = []
    ctx = m.SessionContext(events.append)
    stage.handle(ctx, m.ConfigureInput(InputAudioDecoder({"type": "audio/pcm", "rate": 24000}),
                                       m.TurnDetection(0.5, 300, 500), "en"))
    return stage, ctx, events, stt_inbox


def test_a_peek_transcribes_the_speech_in_progress_once_it_is_long_enough(backends):
    stage, ctx, events, stt_inbox = server_vad_stage(backends)
    peeked = False
    for append in speech_appends(JFK, silence_s=1.0):
        stage.handle(ctx, m.AppendInput(append["audio"]))
        if events and not peeked:  # speech has started: ask for a peek at 500 ms of it
            stage.handle(ctx, m.PeekInput(events[0].item_id, 500))
            stage.handle(ctx, m.PeekInput("item_gone", 500))  # an item that is over: ignored
            peeked = True
    work = []
    while not stt_inbox.empty():
        work.append(stt_inbox.get()[1])
    peeks = [w for w in work if isinstance(w, m.Peek)]
    assert len(peeks) == 1 and peeks[0].item_id == events[0].item_id
    assert 500 <= len(peeks[0].audio) / 16 < 1500  # ms of 16 kHz audio: the speech so far
    assert peeks[0].input_lag_ms >= 0  # how far the VAD was behind the audio when it asked
    assert isinstance(work[-1], m.Transcribe)  # the turns are still committed as usual
    # Every request is answered: one for an unknown item hears nothing at once.
    assert [(e.item_id, e.transcript) for e in events if isinstance(e, m.SpeechPeeked)] == [("item_gone", "")]


def test_speech_that_peeks_judge_is_not_speculated_on(backends):
    """Speech asked to be peeked at (over the assistant) is transcribed by its peeks and at its
    commit, not at its pauses, so that its peeks have the cores (``VADStage._maybe_speculate``);
    other speech still is."""
    stage, ctx, events, stt_inbox = server_vad_stage(backends)
    peeked = set()
    for append in speech_appends(JFK, silence_s=1.0):
        stage.handle(ctx, m.AppendInput(append["audio"]))
        started = [e.item_id for e in events if isinstance(e, m.SpeechStarted)]
        if len(started) == 1 and not peeked:  # the first turn only is over the assistant
            stage.handle(ctx, m.PeekInput(started[0], 300))
            peeked.add(started[0])
    work = [msg for _, msg in list(stt_inbox.queue)]
    turns = [w.item_id for w in work if isinstance(w, m.Transcribe)]
    speculated = {w.item_id for w in work if isinstance(w, m.Speculate)}
    assert len(turns) >= 2 and turns[0] in peeked  # jfk.flac pauses 500 ms and more between turns
    assert turns[0] not in speculated and set(turns[1:]) <= speculated
    assert any(isinstance(w, m.Peek) and w.item_id == turns[0] for w in work)


def test_each_turn_is_transcribed_at_its_first_pause_and_the_commit_reuses_it(backends):
    """server_vad, 500 ms: the speech so far goes to the STT at 200 ms of every pause; a pause
    that becomes the end of the turn commits with nothing but silence after it."""
    speculations = []
    events, transcribe = run_vad(backends, silence_ms=500, speculations=speculations)
    assert transcribe and all(t.speculated_samples is not None for t in transcribe)
    by_item = {s.item_id: s for s in speculations}
    for t in transcribe:
        spoken = by_item[t.item_id]
        assert t.speculated_samples == len(spoken.audio)
        np.testing.assert_array_equal(t.audio[: len(spoken.audio)], spoken.audio)
    # jfk.flac pauses for 200-500 ms inside turns too: those speculations are thrown away.
    assert len(speculations) >= len(transcribe)


def test_speech_after_the_pause_makes_the_speculation_stale(backends):
    """With a long silence the 200-500 ms pauses do not end the turn: the commit carries the
    speech after the last pause, so it is transcribed afresh."""
    speculations = []
    _, transcribe = run_vad(backends, silence_ms=1500, speculations=speculations)
    assert len(transcribe) == 1 and len(speculations) >= 2
    assert transcribe[0].speculated_samples == len(speculations[-1].audio)
    assert all(s.item_id == transcribe[0].item_id for s in speculations)


class CountingSTT:
    def __init__(self):
        self.calls = []

    def transcribe(self, audio, language=None, prompt=None):
        self.calls.append(len(audio))
        return f"heard {len(audio)} samples"


def test_the_stt_stage_answers_a_commit_from_its_speculation_only_when_it_matches():
    stt = CountingSTT()
    stage = STTStage(Backends(None, stt, None, None))
    events = []
    ctx = m.SessionContext(events.append)
    audio = np.zeros(16_000, np.float32)
    stage.handle(ctx, m.Speculate("item_1", audio[:8000], "en"))
    # Nothing reaches the protocol yet: the session alone is told, and may start a reply on it.
    assert wait_for(lambda: events)
    assert events == [m.Speculated("item_1", "heard 8000 samples", "en", 8000)] and stt.calls == [8000]
    stage.handle(ctx, m.Transcribe("item_1", audio, "en", speculated_samples=8000))
    assert stt.calls == [8000] and events[-1].transcript == "heard 8000 samples" and events[-1].speculative
    # The user went on after the pause: the speculation does not match the commit.
    stage.handle(ctx, m.Speculate("item_2", audio[:4000], "en"))
    stage.handle(ctx, m.Transcribe("item_2", audio, "en", speculated_samples=None))
    assert stt.calls[-1] == 16_000 and events[-1].transcript == "heard 16000 samples"
    # A speculation never outlives its session.
    stage.handle(ctx, m.Speculate("item_3", audio[:4000], "en"))
    stage.end_session()
    stage.handle(ctx, m.Transcribe("item_3", audio, "en", speculated_samples=4000))
    assert events[-1].transcript == "heard 16000 samples"


class PeekingSTT(CountingSTT):
    def hear(self, audio, language=None, prompt=None, phrases=()):
        return f"peeked {len(audio)} samples", None


def stt_thread(stage, ctx):
    """The STT stage on a thread of its own, as in a unit: put messages into the inbox returned."""
    inbox = queue.Queue()

    def run():
        while (msg := inbox.get()) is not None:
            stage.handle(ctx, msg)

    threading.Thread(target=run, daemon=True).start()
    return inbox


def test_a_speculation_waiting_in_the_compute_queue_holds_up_no_peek_and_no_commit():
    """A speculation is due later than other units' synthesis and waits behind it in the compute
    queue; the STT thread does not wait with it (a peek queued behind one waited 2.0-2.2 s in an
    e2e run). A peek is answered at once; a commit the user spoke past the pause for takes the
    stale speculation out of the queue; a commit that matches waits for its speculation, which the
    session hears of before the transcript."""
    stt = PeekingSTT()
    stage = STTStage(Backends(None, stt, None, None))
    events = []
    ctx = m.SessionContext(events.append)
    audio = np.zeros(16_000, np.float32)
    synthesis, busy = threading.Event(), threading.Event()
    stage._queue.submit(0.0, lambda: (busy.set(), synthesis.wait(10)))  # another unit's phrase
    assert busy.wait(5)
    inbox = stt_thread(stage, ctx)
    inbox.put(m.Speculate("item_1", audio[:4000], "en"))
    inbox.put(m.Peek("item_1", audio[:4800], "en", None, 300))
    assert wait_for(lambda: events, timeout=2.0)
    (peeked,) = events
    assert (peeked.item_id, peeked.transcript, peeked.voiced_ms, peeked.likeness, peeked.final) == (
        "item_1", "peeked 4800 samples", 300, None, False)
    lag, waited, heard = peeked.timing  # where the peek's time went, for the log
    assert lag is None and waited >= 0 and heard >= 0  # made here, not by a VAD
    stale = stage._speculation.future
    inbox.put(m.Transcribe("item_1", audio, "en", speculated_samples=None))  # speech went on
    assert wait_for(lambda: stale.cancelled() and stage._queue.pending() == 1)  # the commit's alone waits
    synthesis.set()
    assert wait_for(lambda: len(events) == 2)
    inbox.put(m.Speculate("item_2", audio[:8000], "en"))
    assert wait_for(lambda: len(events) == 3)
    inbox.put(m.Transcribe("item_2", audio[:9600], "en", speculated_samples=8000))
    assert wait_for(lambda: len(events) == 4)
    assert stt.calls == [16_000, 8000]  # the stale speculation never ran
    assert [(type(e).__name__, e.item_id, e.transcript, getattr(e, "speculative", None)) for e in events[1:]] == [
        ("Transcribed", "item_1", "heard 16000 samples", False),
        ("Speculated", "item_2", "heard 8000 samples", None),
        ("Transcribed", "item_2", "heard 8000 samples", True),
    ]
    inbox.put(None)


def test_a_commit_that_comes_while_its_speculation_waits_makes_it_due_now_and_it_is_not_announced():
    stt = PeekingSTT()
    stage = STTStage(Backends(None, stt, None, None))
    events, ran = [], []
    ctx = m.SessionContext(events.append)
    audio = np.zeros(16_000, np.float32)
    synthesis, busy = threading.Event(), threading.Event()
    stage._queue.submit(0.0, lambda: (busy.set(), synthesis.wait(10)))
    assert busy.wait(5)
    inbox = stt_thread(stage, ctx)
    inbox.put(m.Speculate("item_1", audio[:8000], "en", commit_in_ms=60_000))  # due long after the rest
    assert wait_for(lambda: stage._queue.pending() == 1)
    inbox.put(m.Transcribe("item_1", audio[:9600], "en", speculated_samples=8000))
    assert wait_for(lambda: stage._speculation is None)  # the commit took it, and waits for it
    # Another unit's phrase, due now: before the speculation as it was, after it once its commit waits.
    stage._queue.submit(time.perf_counter(), lambda: ran.append(list(stt.calls)))
    synthesis.set()
    assert wait_for(lambda: events and ran)
    assert ran == [[8000]]  # the speculation ran first: its commit made it due now
    assert [(type(e).__name__, e.transcript, e.speculative) for e in events] == [
        ("Transcribed", "heard 8000 samples", True)]
    inbox.put(None)


def test_semantic_vad_speculates_before_its_end_of_turn_check(backends):
    """Smart Turn may commit at its check (200 ms into a pause): the transcript has started
    100 ms before, and the commit reuses it."""
    speculations = []
    events, transcribe = run_vad(backends, silence_ms=sc.EAGERNESS_SILENCE_MS["auto"],
                                 check_ms=sc.END_OF_TURN_CHECK_MS, speculations=speculations)
    assert transcribe and all(t.speculated_samples is not None for t in transcribe)
    by_item = {s.item_id: s for s in speculations}
    stopped = {e.item_id: e for e in events if isinstance(e, m.SpeechStopped)}
    for t in transcribe:
        silence_ms = (len(by_item[t.item_id].audio) - len(t.audio)) / 16  # negative: cut before
        assert -sc.END_OF_TURN_CHECK_MS < silence_ms <= -50, (silence_ms, stopped[t.item_id])


def test_streams_run_together_give_each_stream_its_own_probabilities(backends):
    """The shared model runs the windows of concurrent streams as one batch: each stream gets
    the probabilities and recurrent state it would get alone, whatever else is in its batch."""
    import threading

    import numpy as np

    from realtime.client import load_audio

    speech = load_audio(JFK, 16_000).astype(np.float32)
    offsets = [16_000 * i for i in range(8)]  # eight different stretches of speech and pause

    def probabilities(stream, offset):
        return [stream.probability(speech[offset + i * 512:offset + (i + 1) * 512]) for i in range(30)]

    alone = [probabilities(backends.vad.new_stream(), offset) for offset in offsets]
    together = [None] * len(offsets)
    start = threading.Barrier(len(offsets))

    def run(i):
        stream = backends.vad.new_stream()
        start.wait()
        together[i] = probabilities(stream, offsets[i])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(offsets))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert max(max(a) for a in alone) > 0.9 and min(min(a) for a in alone) < 0.1  # speech and pauses
    for a, t in zip(alone, together, strict=True):
        assert t == pytest.approx(a, abs=1e-4)


def test_the_batch_thread_ends_when_its_model_is_collected():
    import gc

    import numpy as np

    from pool.backends.cache import default_paths

    vad = SileroVAD(default_paths("/nonexistent")["vad"])
    vad.new_stream().probability(np.zeros(512, dtype=np.float32))
    thread = vad._thread
    assert thread.is_alive()
    del vad
    gc.collect()
    thread.join(timeout=10)
    assert not thread.is_alive()

"""The shared models' deadline-first queues: what runs first when several units want one model,
and what cancel removes. The order is observed with a model that blocks until released, so no
test depends on how fast anything runs."""

import threading
import time

import numpy as np
import pytest

from pool import metrics
from pool.backends.base import PER_THREAD_PRIORITY
from pool.pipeline import messages as m
from pool.pipeline.compute import WHENEVER, ComputeQueue
from pool.pipeline.playback import Playback
from pool.pipeline.stages.llm import LLMStage
from pool.pipeline.stages.stt import STTStage
from pool.pipeline.stages.tts import TTSStage

from .helpers import wait_for


class Gate:
    """A model call that records its argument and blocks until released."""

    def __init__(self):
        self.ran, self.started = [], threading.Event()
        self._open = threading.Event()

    def __call__(self, name):
        self.ran.append(name)
        self.started.set()
        self._open.wait(10)
        return name

    def release(self):
        self._open.set()


def busy_queue():
    """A one-worker queue whose worker is busy with a first call until the gate opens."""
    queue, gate = ComputeQueue("test"), Gate()
    first = queue.submit(0.0, gate, "running")
    assert gate.started.wait(5)
    return queue, gate, first


def test_the_earliest_deadline_runs_first_and_speculative_work_last():
    queue, gate, first = busy_queue()
    now = time.perf_counter()
    later = queue.submit(now + 3.0, gate, "another unit's later phrase")
    speculative = queue.submit(WHENEVER, gate, "speculative reply")
    waiting = queue.submit(now, gate, "a waiting user's first phrase")
    gate.release()
    assert [f.result(5) for f in (first, later, speculative, waiting)]
    assert gate.ran == ["running", "a waiting user's first phrase", "another unit's later phrase", "speculative reply"]


def test_a_speculative_reply_adopted_while_it_waits_moves_up_at_once():
    """A deadline may be a callable, asked whenever a worker picks its next call: a speculative
    reply's work (due never) that the session adopts is due as any reply from then on."""
    queue, gate, first = busy_queue()
    job = m.ResponseJob("resp_spec", None, "audio", "alloy", 1.0, None, speculative=True)
    job.marks.speech_stopped = time.perf_counter()
    spoken = queue.submit(job.due, gate, "the adopted reply's first phrase")
    later = queue.submit(time.perf_counter() + 3.0, gate, "another unit's later phrase")
    assert job.due() == WHENEVER
    job.adopt()
    gate.release()
    [f.result(5) for f in (first, spoken, later)]
    assert gate.ran == ["running", "the adopted reply's first phrase", "another unit's later phrase"]


def test_equal_deadlines_run_in_the_order_submitted():
    queue, gate, first = busy_queue()
    futures = [queue.submit(1.0, gate, f"unit {i}") for i in range(4)]
    gate.release()
    [f.result(5) for f in futures]
    assert gate.ran == ["running"] + [f"unit {i}" for i in range(4)]


def test_cancel_takes_queued_work_out_at_once_and_it_never_runs():
    queue, gate, first = busy_queue()
    kept, dropped = queue.submit(2.0, gate, "kept"), queue.submit(1.0, gate, "dropped")
    assert queue.pending() == 2
    assert dropped.cancel()
    assert queue.pending() == 1  # gone from the queue before any worker looked at it
    gate.release()
    assert kept.result(5) == "kept"
    assert gate.ran == ["running", "kept"]


def test_only_work_due_at_some_time_counts_as_due_waiting():
    # A TTS piece is cut short while work a user waits for is queued, not for speculative work.
    queue, gate, first = busy_queue()
    job = m.ResponseJob("resp_spec", None, "audio", "alloy", 1.0, None, speculative=True)
    job.marks.speech_stopped = time.perf_counter()
    waiting = [queue.submit(WHENEVER, gate, "speculative"), queue.submit(job.due, gate, "a speculative reply")]
    assert queue.pending() == 2 and queue.due_waiting() == 0
    job.adopt()
    assert queue.due_waiting() == 1
    waiting.append(queue.submit(2.0, gate, "another unit's later phrase"))
    assert queue.due_waiting() == 2
    gate.release()
    [f.result(5) for f in (first, *waiting)]


def test_an_error_reaches_the_caller_and_the_queue_goes_on():
    queue = ComputeQueue("test")

    def broken():
        raise ValueError("bad phrase")

    failed, fine = queue.submit(0.0, broken), queue.submit(1.0, str, 42)
    assert isinstance(failed.exception(5), ValueError)
    assert fine.result(5) == "42" and fine.compute_seconds >= 0


class Batcher:
    """A model that batches: ``one(name)`` alone, ``batch([(name,), ...])`` for several, each
    recorded."""

    def __init__(self):
        self.batches = []

    def one(self, name):
        self.batches.append([name])
        return name.upper()

    def batch(self, calls):
        self.batches.append([name for (name,) in calls])
        return [name.upper() for (name,) in calls]


def test_calls_of_a_model_that_batches_run_as_one_batch_when_they_wait_together():
    """Three units' transcriptions wait behind a running call: the worker runs them as one batch,
    the earliest due first, each future with its own result; a cancelled one is left out, and a
    call of another model waits its own turn."""
    queue, gate, first = busy_queue()
    model = Batcher()
    now = time.perf_counter()
    later = queue.submit(now + 2.0, model.one, "unit c", batch=model.batch)
    other = queue.submit(now + 1.0, gate, "a phrase")
    dropped = queue.submit(now, model.one, "unit d", batch=model.batch)
    due = queue.submit(now, model.one, "unit a", batch=model.batch)
    also = queue.submit(now + 0.5, model.one, "unit b", batch=model.batch)
    assert dropped.cancel()
    gate.release()
    assert [f.result(5) for f in (due, also, later)] == ["UNIT A", "UNIT B", "UNIT C"]
    assert other.result(5) == "a phrase" and first.result(5) == "running"
    assert model.batches == [["unit a", "unit b", "unit c"]]
    assert gate.ran == ["running", "a phrase"]
    assert due.batched == later.batched == 3 and due.compute_seconds == later.compute_seconds
    assert other.batched == 1


def test_a_call_that_waits_alone_runs_as_itself():
    queue = ComputeQueue("test")
    model = Batcher()
    assert queue.submit(0.0, model.one, "alone", batch=model.batch).result(5) == "ALONE"
    assert model.batches == [["alone"]]
    with pytest.raises(ValueError, match="positional"):
        queue.submit(0.0, model.one, name="alone", batch=model.batch)


def test_a_failed_batch_fails_each_of_its_calls_and_the_queue_goes_on():
    queue, gate, first = busy_queue()

    def broken(calls):
        raise ValueError("bad audio")

    def short(calls):
        return []  # a batch that lost a result must not leave a caller waiting

    failing = [queue.submit(0.0, str, i, batch=broken) for i in range(2)]
    losing = [queue.submit(1.0, str, i, batch=short) for i in range(2)]
    fine = queue.submit(2.0, str, 42)
    gate.release()
    assert all(isinstance(f.exception(5), ValueError) for f in failing)
    assert all(isinstance(f.exception(5), RuntimeError) for f in losing)
    assert fine.result(5) == "42"


def test_units_transcriptions_that_wait_together_are_one_batch_of_the_shared_stt():
    """Two units' STT stages on one model: their turns' transcripts, asked for while the queue
    runs a synthesis, come from one ``transcribe_batch`` of both, each to its own unit."""
    from pool.backends.scripted import load_scripted
    from pool.conf import get_config

    class Model:  # an STT that batches
        languages, name = frozenset({"en"}), "batching-stt"
        batches = []

        def transcribe_detect(self, audio, language=None, prompt=None):
            return self.transcribe_batch([(audio, language, prompt)])[0]

        def transcribe_batch(self, turns):
            self.batches.append(len(turns))
            return [(f"{len(audio)} samples, {prompt}", "en") for audio, _language, prompt in turns]

    backends = load_scripted(get_config())
    shared = type(backends)(**{**backends.__dict__, "stt": Model()})
    unit_a, unit_b = STTStage(shared), STTStage(shared)
    queue, gate = unit_a._queue, Gate()
    running = queue.submit(0.0, gate, "a synthesis")
    assert gate.started.wait(5)
    events = []
    for stage, samples, prompt in ((unit_a, 16_000, "Kokoro"), (unit_b, 8_000, None)):
        msg = m.Transcribe(f"item_{samples}", np.zeros(samples, np.float32), "en", prompt=prompt)
        threading.Thread(target=stage.handle, args=(m.SessionContext(events.append), msg), daemon=True).start()
    assert wait_for(lambda: queue.pending() == 2)
    gate.release()
    assert running.result(5) == "a synthesis"
    assert wait_for(lambda: len(events) == 2)
    assert Model.batches == [2]
    assert sorted((e.item_id, e.transcript) for e in events) == [
        ("item_16000", "16000 samples, Kokoro"), ("item_8000", "8000 samples, None")]


class Clock:
    """A clock the test sets (perf_counter seconds)."""

    def __init__(self, now=0.0):
        self.now = now

    def __call__(self):
        return self.now


def Job(speech_stopped=None, sent=(), speculative=False):  # noqa: N802 - what due() reads of a job
    """A reply to speech that stopped at ``speech_stopped``, with ``sent``: (perf_counter time,
    seconds of audio) sent then, on ``job.clock``."""
    clock = Clock()
    job = m.ResponseJob("resp", None, "audio", "alloy", 1.0, None, speculative=speculative,
                        playout=Playback(clock=clock))
    job.marks = m.Marks(speech_stopped=speech_stopped)
    job.clock = clock
    for at, seconds in sent:
        job.clock.now = at
        job.audio_sent(seconds)
    return job


def test_a_first_phrase_is_due_when_the_user_stopped_and_a_later_one_when_the_held_audio_runs_out():
    assert Job(speech_stopped=100.0).due() == 100.0
    assert Job(speech_stopped=100.0, sent=[(101.0, 2.5)]).due() == 103.5
    assert Job(speech_stopped=100.0, sent=[(101.0, 2.5), (102.0, 1.0)]).due() == 104.5
    before, due, after = time.perf_counter(), Job().due(), time.perf_counter()
    assert before <= due <= after  # a response without speech (response.create) is due now


def test_a_reply_whose_client_ran_out_of_audio_is_due_when_what_it_got_since_runs_out():
    """A client plays what arrives after a stall from its arrival: the reply is due when that
    runs out, not at its first delta plus all the audio sent (in the past after a stall, which
    put a stalled reply before every user waiting for a first word), and the TTS cuts its next
    phrase to what the client holds, not to a lead that stays below zero."""
    stalled = Job(speech_stopped=100.0, sent=[(101.0, 1.0), (110.0, 2.0)])
    assert stalled.due() == 112.0
    stalled.clock.now = 111.0
    assert stalled.held_seconds() == 1.0


def test_a_speculative_reply_plays_from_its_adoption():
    job = Job(speech_stopped=100.0, sent=[(100.3, 1.5)], speculative=True)
    assert job.due() == WHENEVER and job.held_seconds() is None  # held: the client has nothing
    job.clock.now = 100.6
    job.adopt()
    assert job.due() == 102.1 and job.audio_seconds == 1.5


def test_units_share_one_queue_and_a_waiting_users_first_phrase_goes_before_a_later_phrase():
    """Three units' TTS stages on one model: while unit A's first phrase is being synthesized,
    unit C's second phrase (its client holds C's first audio) and then unit B's first phrase (B's
    user waits in silence) are asked for; B's runs first although it was asked for last."""
    from pool.backends.scripted import load_scripted
    from pool.conf import get_config
    from realtime.audio import OutputAudioEncoder

    gate = Gate()

    class Model:  # a TTS whose every synthesis waits for the gate
        voices = languages = frozenset()

        def synthesize(self, text, voice, speed=1.0):
            gate(text)
            return np.zeros(2400, np.float32)

    backends = load_scripted(get_config())
    shared = type(backends)(**{**backends.__dict__, "tts": Model()})
    unit_a, unit_b, unit_c = TTSStage(shared), TTSStage(shared), TTSStage(shared)
    assert unit_a._queue is unit_b._queue is unit_c._queue is STTStage(shared)._queue is LLMStage(shared, None)._queue
    events = []

    def job(speech_stopped):
        encoder = OutputAudioEncoder({"type": "audio/pcm", "rate": 24000})
        job = m.ResponseJob("resp", None, "audio", "alloy", 1.0, encoder)
        job.marks.speech_stopped = speech_stopped
        return job

    def speak(stage, job, text):
        threading.Thread(target=stage._speak, args=(m.SessionContext(events.append), job, text), daemon=True).start()

    now = time.perf_counter()
    a, b, c = job(now - 3), job(now - 1), job(now - 6)
    c.audio_sent(0.5)  # C's client holds half a second of audio
    speak(unit_a, a, "A's first phrase")
    assert gate.started.wait(5)
    speak(unit_c, c, "C's second phrase")
    assert wait_for(lambda: unit_a._queue.pending() == 1)
    speak(unit_b, b, "B's first phrase")
    assert wait_for(lambda: unit_a._queue.pending() == 2)
    gate.release()
    assert wait_for(lambda: len(events) == 3)
    assert gate.ran == ["A's first phrase", "B's first phrase", "C's second phrase"]


class Beside:
    """A model with a one-thread copy (``pair``): records which runtime ran each call and how
    many ran at once, each blocking until released."""

    def __init__(self):
        self.ran, self.at_once, self.running = [], 0, 0
        self._lock, self._open = threading.Lock(), threading.Event()

    def _run(self, runtime, name):
        with self._lock:
            self.ran.append((runtime, name))
            self.running += 1
            self.at_once = max(self.at_once, self.running)
        self._open.wait(10)
        with self._lock:
            self.running -= 1
        return name

    def alone(self, name):
        return self._run("both cores", name)

    def pair(self, name):
        return self._run("one core", name)

    def release(self):
        self._open.set()


def beside_backends(model):
    """Scripted backends whose TTS runs on ``model.alone`` and its one-thread copy on ``model.pair``
    (one second of silence for any text)."""
    from pool.backends.scripted import load_scripted
    from pool.conf import get_config

    class TTS:
        voices = languages = frozenset()

        def __init__(self, runtime):
            self.runtime = runtime

        def synthesize(self, text, voice, speed=1.0):
            self.runtime(text)
            return np.zeros(24_000, np.float32)

    backends = load_scripted(get_config())
    return type(backends)(**{**backends.__dict__, "tts": TTS(model.alone), "tts_pair": TTS(model.pair)})


def submit_beside(queue, model, deadline, name, expected_seconds=0.5):
    return queue.submit(deadline, model.alone, name, pair=model.pair, expected_seconds=expected_seconds)


def side_by_side_calls():
    return metrics.COMPUTE_CALLS.labels(metrics.PROCESS, "side_by_side")._value.get()


def test_two_later_phrases_whose_clients_hold_seconds_of_audio_run_side_by_side_on_one_core_each():
    counted = side_by_side_calls()
    queue, gate, first = busy_queue()
    model, now = Beside(), time.perf_counter()
    a = submit_beside(queue, model, now + 4.0, "A's third sentence")
    b = submit_beside(queue, model, now + 5.0, "B's second sentence")
    gate.release()
    assert wait_for(lambda: model.running == 2)  # both started before either ended
    model.release()
    assert [a.result(5), b.result(5)] == ["A's third sentence", "B's second sentence"]
    assert sorted(model.ran) == [("one core", "A's third sentence"), ("one core", "B's second sentence")]
    assert a.paired and b.paired and not a.background
    assert side_by_side_calls() == counted + 2  # s2s_compute_calls_total{how="side_by_side"}


def test_later_phrases_whose_clients_ran_out_of_audio_run_side_by_side():
    """Both already late (more replies play than the cores synthesize alone): two at a time
    clear the backlog sooner."""
    queue, gate, first = busy_queue()
    model, now = Beside(), time.perf_counter()
    late = [submit_beside(queue, model, now - ago, f"late by {ago} s") for ago in (2.0, 0.5)]
    gate.release()
    assert wait_for(lambda: model.running == 2)
    model.release()
    assert [f.result(5) for f in late] and all(f.paired for f in late)


def test_a_call_in_time_alone_but_late_beside_another_runs_alone_on_both_cores():
    """The earliest call, or the next, due within PAIR_SLOWDOWN x its expected compute plus the
    margin: beside another it would miss its deadline, so each runs alone, in order."""
    for deadlines in ((3.0, 9.0), (9.0, 3.0), (-1.0, 3.0)):  # 3 s: within 2 x 2 s + the margin
        queue, gate, first = busy_queue()
        model, now = Beside(), time.perf_counter()
        model.release()  # each call returns at once: only which runtime ran it, and how, is seen
        futures = [submit_beside(queue, model, now + due, f"due in {due} s", expected_seconds=2.0)
                   for due in deadlines]
        gate.release()
        assert [f.result(5) for f in futures]
        assert model.at_once == 1 and not any(f.paired for f in futures)
        assert model.ran == [("both cores", f"due in {due} s") for due in sorted(deadlines)]


def test_a_call_without_a_pair_runs_alone_and_keeps_its_place():
    """A waiting user's first phrase (the TTS stage gives it no ``pair``) runs on both cores
    first; the later phrases after it."""
    queue, gate, first = busy_queue()
    model, now = Beside(), time.perf_counter()
    model.release()
    later = submit_beside(queue, model, now + 6.0, "a later phrase")
    waiting = queue.submit(now, model.alone, "a waiting user's first phrase")
    gate.release()
    assert waiting.result(5) and later.result(5)
    assert model.ran == [("both cores", "a waiting user's first phrase"), ("both cores", "a later phrase")]


def test_a_later_phrase_is_not_paired_with_a_call_that_cannot_run_beside_it():
    """The next call in deadline order (an LLM step) has no one-thread copy: the phrase runs alone
    and the LLM step after it, in deadline order; no later call jumps ahead to make a pair."""
    queue, gate, first = busy_queue()
    model, now = Beside(), time.perf_counter()
    model.release()
    phrase = submit_beside(queue, model, now + 4.0, "a later phrase")
    step = queue.submit(now + 4.5, gate, "another reply's LLM step")
    other = submit_beside(queue, model, now + 5.0, "another later phrase")
    gate.release()
    assert phrase.result(5) and step.result(5) and other.result(5)
    assert gate.ran == ["running", "another reply's LLM step"]
    assert model.ran == [("both cores", "a later phrase"), ("both cores", "another later phrase")]
    assert not phrase.paired and not other.paired


def test_a_paired_call_cancelled_while_it_waits_leaves_its_mate_to_run_alone():
    queue, gate, first = busy_queue()
    model, now = Beside(), time.perf_counter()
    model.release()
    kept = submit_beside(queue, model, now + 4.0, "kept")
    dropped = submit_beside(queue, model, now + 5.0, "dropped")
    assert dropped.cancel()
    gate.release()
    assert kept.result(5) == "kept"
    assert model.ran == [("both cores", "kept")]


def test_units_later_phrases_run_side_by_side_and_the_pace_learns_only_from_runs_alone():
    """Two units' TTS stages on a model with a one-thread copy (``Backends.tts_pair``), each
    client holding 5 s of audio: their next phrases are synthesized at once on the copy, and the
    shared SpeechPace does not take a run that shared the cores for the model's speed."""
    from realtime.audio import OutputAudioEncoder

    model = Beside()
    shared = beside_backends(model)
    unit_a, unit_b = TTSStage(shared), TTSStage(shared)
    queue, gate = unit_a._queue, Gate()
    running = queue.submit(0.0, gate, "a first phrase")
    assert gate.started.wait(5)
    pace = unit_a._pace
    factor = pace.real_time_factor
    events = []
    for stage, name in ((unit_a, "A's next phrase"), (unit_b, "B's next phrase")):
        job = m.ResponseJob("resp", None, "audio", "alloy", 1.0, OutputAudioEncoder({"type": "audio/pcm", "rate": 24000}))
        job.marks.speech_stopped = time.perf_counter() - 6
        job.audio_sent(5.0)
        threading.Thread(target=stage._speak, args=(m.SessionContext(events.append), job, name), daemon=True).start()
    assert wait_for(lambda: queue.pending() == 2)
    gate.release()
    assert running.result(5)
    assert wait_for(lambda: model.running == 2)
    model.release()
    assert wait_for(lambda: len(events) == 2)
    assert sorted(model.ran) == [("one core", "A's next phrase"), ("one core", "B's next phrase")]
    assert pace.real_time_factor == factor


def test_a_first_phrase_is_never_synthesized_beside_another():
    """Two units' first phrases (their users wait in silence), both late already: each has both
    cores, one after the other."""
    from realtime.audio import OutputAudioEncoder

    model = Beside()
    model.release()
    shared = beside_backends(model)
    stages = TTSStage(shared), TTSStage(shared)
    queue, gate = stages[0]._queue, Gate()
    running = queue.submit(0.0, gate, "a transcription")
    assert gate.started.wait(5)
    events = []
    for stage, name in zip(stages, ("A's first phrase", "B's first phrase"), strict=True):
        job = m.ResponseJob("resp", None, "audio", "alloy", 1.0, OutputAudioEncoder({"type": "audio/pcm", "rate": 24000}))
        job.marks.speech_stopped = time.perf_counter() - 2
        threading.Thread(target=stage._speak, args=(m.SessionContext(events.append), job, name), daemon=True).start()
    assert wait_for(lambda: queue.pending() == 2)
    gate.release()
    assert running.result(5) and wait_for(lambda: len(events) == 2)
    assert model.at_once == 1 and sorted(model.ran) == [("both cores", "A's first phrase"), ("both cores", "B's first phrase")]


def test_the_workers_of_a_queue_no_one_holds_end():
    import gc

    queue = ComputeQueue("dropped")
    assert queue.submit(0.0, str, 1).result(5) == "1"
    [worker] = [t for t in threading.enumerate() if t.name == "dropped-0"]
    del queue
    gc.collect()
    worker.join(15)  # it looks every IDLE_SECONDS
    assert not worker.is_alive()


def test_a_stuck_call_holds_only_its_own_caller():
    """A wedged model call (one unit's) must not stop every other unit: once it has run
    STUCK_SECONDS, a waiting call gets a worker of its own; the extra worker ends when idle."""
    queue, gate, stuck = busy_queue()
    queue.STUCK_SECONDS = 0.3
    other = queue.submit(1.0, str, "another unit's phrase")
    assert queue.result(other, poll=0.1) == "another unit's phrase" and not stuck.done()
    gate.release()
    assert stuck.result(5) == "running"


def background_queue():
    """A queue with the background lane, whose background worker is busy with speculative work
    (due never, for a model with a low-priority copy: here the same gate) until the gate opens."""
    queue, gate = ComputeQueue("lanes", background=True), Gate()
    speculative = queue.submit(WHENEVER, gate, "speculative reply", background=gate)
    assert gate.started.wait(5)
    return queue, gate, speculative


def test_work_due_now_does_not_wait_for_a_background_run():
    """One run cannot be interrupted: with one lane, a user who stopped speaking waited for the
    speculative reply (or the later phrase) that had the cores. In the background lane it runs
    beside the foreground, and the user's first phrase starts at once."""
    queue, gate, speculative = background_queue()
    first_phrase = queue.submit(time.perf_counter(), str, "a waiting user's first phrase")
    assert first_phrase.result(5) == "a waiting user's first phrase"
    assert not speculative.done()  # still running: the first phrase did not wait for it
    gate.release()
    assert speculative.result(5) == "speculative reply"


def test_speculative_work_runs_in_the_background_lane_on_its_low_priority_model():
    """The background lane calls ``background`` (the model's low-priority copy) on a thread at
    the lowest OS priority, for speculative work only: another reply's later phrase is real work
    and keeps the foreground's deadline order, on the model itself."""
    import os

    from pool.backends.base import LOWEST_PRIORITY_NICE

    queue = ComputeQueue("lanes", background=True)

    def where(model):
        return lambda: (model, threading.current_thread().name,
                        os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))

    def run(deadline):
        return queue.submit(deadline, where("model"), background=where("low-priority copy")).result(5)

    normal = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    assert run(time.perf_counter()) == ("model", "lanes-0", normal)
    assert run(time.perf_counter() + 3.0) == ("model", "lanes-0", normal)
    assert run(WHENEVER) == ("low-priority copy", "lanes-background", LOWEST_PRIORITY_NICE)


def test_work_without_a_low_priority_model_waits_its_turn_in_the_foreground():
    """A model with no low-priority copy (llama.cpp, Whisper) runs its own threads at normal
    priority whoever calls it: in the background lane it would take the cores from the work due
    now (the LLM's next part of one reply beside another user's first phrase). Such work stays
    in the foreground's deadline order."""
    queue, gate = ComputeQueue("lanes", background=True), Gate()
    first_phrase = queue.submit(time.perf_counter(), gate, "a waiting user's first phrase")
    assert gate.started.wait(5)
    llm_part = queue.submit(WHENEVER, lambda: threading.current_thread().name)
    assert not wait_for(lambda: queue.pending() == 0, timeout=0.3)  # the idle background worker leaves it
    gate.release()
    assert first_phrase.result(5) and llm_part.result(5) == "lanes-0"


def test_a_background_run_that_becomes_due_first_keeps_the_cores():
    """A speculative reply adopted while its phrase is synthesized in the background is due
    first of all: the foreground starts nothing beside it (a later-due run would take the cores
    from it, at the lowest priority), and goes on once it is done."""
    queue, gate = ComputeQueue("lanes", background=True), Gate()
    job = m.ResponseJob("resp_spec", None, "audio", "alloy", 1.0, None, speculative=True)
    job.marks.speech_stopped = time.perf_counter()
    adopted = queue.submit(job.due, gate, "the speculative reply's first phrase", background=gate)
    assert gate.started.wait(5)  # running in the background: due never
    job.adopt()  # due when its user stopped speaking, before the call below
    other = Gate()
    later = queue.submit(time.perf_counter(), other, "another user's first phrase")
    assert not other.started.wait(0.3)  # it would start within RECHECK_SECONDS if it were let
    gate.release()
    assert adopted.result(5) and other.started.wait(5)
    other.release()
    assert later.result(5) == "another user's first phrase"


def test_a_background_run_that_keeps_the_cores_too_long_is_no_longer_waited_for():
    """A wedged model in the background lane must not stop the foreground: the foreground waits
    for a background run due first only while that run has had the cores STUCK_SECONDS."""
    queue, gate = ComputeQueue("lanes", background=True), Gate()
    queue.STUCK_SECONDS = 0.3
    due = [WHENEVER]
    wedged = queue.submit(lambda: due[0], gate, "wedged", background=gate)
    assert gate.started.wait(5)  # in the background lane
    due[0] = time.perf_counter() - 60  # due before anything else now
    assert queue.submit(time.perf_counter(), str, "another user's first phrase").result(5)
    assert not wedged.done()
    gate.release()


def _may_raise_priority():
    """Whether this process may lower a nice value (CAP_SYS_NICE), tried on a throwaway thread."""
    import os

    outcome = []

    def attempt():
        me = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, me, 19)
        try:
            os.setpriority(os.PRIO_PROCESS, me, 0)
            outcome.append(True)
        except PermissionError:
            outcome.append(False)

    thread = threading.Thread(target=attempt)
    thread.start()
    thread.join()
    return outcome == [True] and PER_THREAD_PRIORITY


@pytest.mark.skipif(not _may_raise_priority(), reason="raising a thread's priority needs CAP_SYS_NICE on Linux")
def test_an_adopted_background_run_has_normal_priority_while_no_foreground_run_is_under_way():
    """At the lowest priority an adopted reply's first phrase loses the cores to every thread that
    wakes (the VADs, the event loop) although a user waits for it. Once adopted, its worker and its
    runtime's threads run at normal priority, except while the foreground runs something (due
    before it), and at the lowest again when it is done."""
    import os

    from pool.backends.base import LOWEST_PRIORITY_NICE, lower_thread_priority

    def nice(thread):
        return os.getpriority(os.PRIO_PROCESS, thread)

    runtime_started, runtime_done, runtime = threading.Event(), threading.Event(), []

    def runtime_thread():  # stands for the low-priority model runtime's pool thread
        lower_thread_priority()
        runtime.append(threading.get_native_id())
        runtime_started.set()
        runtime_done.wait(30)

    threading.Thread(target=runtime_thread, daemon=True).start()
    assert runtime_started.wait(5)
    queue = ComputeQueue("lanes", background=True, background_threads=runtime)
    worker, gate = [], Gate()

    def synthesis(text):
        worker.append(threading.get_native_id())
        return gate(text)

    job = m.ResponseJob("resp_spec", None, "audio", "alloy", 1.0, None, speculative=True)
    job.marks.speech_stopped = time.perf_counter()
    adopted = queue.submit(job.due, gate, "first phrase", background=synthesis)
    assert gate.started.wait(5)
    lanes = (worker[0], runtime[0])
    normal = nice(threading.get_native_id())
    assert [nice(t) for t in lanes] == [LOWEST_PRIORITY_NICE] * 2  # speculative: due never
    job.adopt()
    assert wait_for(lambda: [nice(t) for t in lanes] == [normal] * 2)
    # Work due before it runs in the foreground: the adopted run is behind it, at the lowest again.
    other = Gate()
    earlier = queue.submit(job.marks.speech_stopped - 1, other, "a user who stopped earlier")
    assert other.started.wait(5)
    assert wait_for(lambda: [nice(t) for t in lanes] == [LOWEST_PRIORITY_NICE] * 2)
    other.release()
    assert earlier.result(5) and wait_for(lambda: [nice(t) for t in lanes] == [normal] * 2)
    gate.release()
    assert adopted.result(5) == "first phrase"
    assert wait_for(lambda: [nice(t) for t in lanes] == [LOWEST_PRIORITY_NICE] * 2)  # the next run is speculative
    runtime_done.set()

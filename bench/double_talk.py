"""Double talk without echo, and echo without double talk: does the VAD stage start its echo
canceller only for a microphone that hears the playback?

    python -m bench.double_talk [--split tune|held_out|all] [--settings JSON] [--rows FILE]

A client on headphones (or with echo cancellation of its own) sends a user who talks over the
reply, and no echo. If the stage takes a chance likeness of that voice to the reply for an echo,
its canceller starts and AEC3 removes the user's words while the reply plays (#27: the e2e JFK
talked over a reply with ``interrupt_response`` off lost "what your country can do for you").
A client on laptop speakers sends the reply's echo, which the canceller must find.

The VAD stage runs offline, as in ``tests/test_echo.py``: the real Silero VAD and AEC3, the
scripted STT, a client that plays Kokoro's story (``bench.interruptions.STORY``, the reply's voice
``af_alloy``) as it arrives and sends its microphone in 20 ms appends, 60 ms after capture.

- **talkers** (no echo): the human recordings whole, and each corpus voice saying the corpus's
  interruptions and requests in a row (about 10 s), from 0.5 s and 2.0 s into the story,
  clean and in pink noise at 20 dB SNR; **false start**: the canceller started;
- **echo**: the story through each echo path of the corpus, for 8 s, clean and at 20 dB SNR;
  **found**: the canceller started, and when; **false speech**: a ``SpeechStarted``;
- **begun over** (no echo): a human recording already under way when the story begins, the
  microphone starting every 0.1 s into it, the story from its start, 1.5 s and 3 s in; **hit**:
  the canceller started or speech was removed as echo (a reply's first probe, on 30 ms of such a
  voice, took it for the playback: an e2e JFK lost "what your country can", BENCHMARKS.md 14s).

The split is the corpus's (``bench.interruption_corpus``): voices and echo paths of ``tune`` set
the rule, ``held_out`` reports it. ``--settings`` overrides the stage's echo constants
(``pool.pipeline.stages.vad``, e.g. ``{"ECHO_AGREED_SIMILARITY": 0.2}``) for a run.
"""

import argparse
import base64
import json
import queue
import re
import time
import zlib
from pathlib import Path

import numpy as np

from realtime.audio import InputAudioDecoder, float_to_pcm16

from .common import emit
from .interruption_corpus import (
    ECHO_PATHS,
    ESPEAK,
    HUMAN,
    INTERRUPTIONS,
    KOKORO,
    RATE,
    REPLY_VOICE,
    REQUESTS,
    Case,
    Renderer,
    active_rms,
    corpus_folder,
    pink_noise,
    recording,
    room,
)

SENT_AT = 100.0  # the server's clock when it sent the reply (a fake monotonic clock)
STARTS_S = (0.5, 2.0)  # where in the story a talker begins
SNRS = (None, 20.0)
ECHO_S = 8.0
BEGUN_STEP_S = 0.1  # begun over: where in the recording the microphone starts, every this often
BEGUN_REPLY_S = (0.0, 1.5, 3.0)  # begun over: where in the story the reply starts


def listen(backends, mic, reply, keeps_audio=True, latency_s=0.06, stt_inbox=None, step_ms=40, on_append=None):
    """The VAD stage's events for a client that was sent ``reply`` (float32 @ 24 kHz) at
    SENT_AT and plays it at once, and whose microphone (``mic``, float32 @ 24 kHz from SENT_AT
    on) reaches the server in ``step_ms`` appends, ``latency_s`` after each was captured.
    ``stt_inbox``: gets what the stage hands the STT; ``on_append(stage, seconds)``: called
    after each append with the seconds of ``mic`` sent."""
    from pool.pipeline import messages as m
    from pool.pipeline.playback import Playback
    from pool.pipeline.stages.vad import VADStage

    now = [SENT_AT]
    playback = Playback(keeps_audio=keeps_audio, clock=lambda: now[0])
    playback.sent(len(reply) / RATE, reply)
    events = []
    ctx = m.SessionContext(events.append, playback=playback)
    stage = VADStage(backends, stt_inbox or queue.Queue())
    stage.handle(ctx, m.ConfigureInput(InputAudioDecoder({"type": "audio/pcm", "rate": RATE}),
                                       m.TurnDetection(0.5, 300, 500), "en"))
    step = RATE * step_ms // 1000
    for i in range(0, len(mic), step):
        now[0] = SENT_AT + (i + step) / RATE + latency_s
        audio = base64.b64encode(float_to_pcm16(mic[i:i + step])).decode()
        stage.handle(ctx, m.AppendInput(audio, received_at=now[0]))
        if on_append is not None:
            on_append(stage, (i + step) / RATE)
    return events


def echo_of(played, delay_ms, gain_db, rt60_s):
    """What a microphone beside the speakers hears of ``played`` (float32 @ 24 kHz): ``delay_ms``
    late, ``gain_db`` quieter, through a room of RT60 ``rt60_s`` (``interruption_corpus.room``)."""
    wet = np.convolve(played, room(rt60_s, 7))[: len(played)] * 10 ** (gain_db / 20)
    delay = int(delay_ms * RATE / 1000)
    return np.concatenate([np.zeros(delay, np.float32), wet[: len(played) - delay]]).astype(np.float32)


def story(tts):
    """Kokoro's story in the reply's voice, synthesised a sentence at a time: float32 @ 24 kHz
    (kept on disk beside ``bench.interruptions``' cached reply)."""
    from .interruptions import STORY, CachedTTS

    cached = CachedTTS(tts, corpus_folder() / "reply")
    sentences = re.findall(r"[^.]+\.", STORY)
    return np.concatenate([cached.synthesize(s.strip(), REPLY_VOICE) for s in sentences]).astype(np.float32)


def talkers(split):
    """``[(name, Case or (path, channel))]``: the split's long speakers, with no echo."""
    text = " ".join(INTERRUPTIONS["en"] + REQUESTS["en"])
    out = [(f"kokoro:{v}", Case("interruption", text, f"kokoro:{v}", "en", None, split)) for v in KOKORO["en"][split]]
    out += [(f"espeak:{v}", Case("interruption", text, f"espeak:{v}:{p}:{s}", "en", None, split))
            for v, p, s in ESPEAK["en"][split]]
    recordings = {(path, channel) for _, path, channel, *_, part in HUMAN if part == split}
    out += [(f"human:{Path(path).stem}{'' if channel is None else f'#{channel}'}", (path, channel))
            for path, channel in sorted(recordings, key=str)]
    return out


def run(backends, renderer, reply, split):
    """Every case of ``split``: a row each (see the module's docstring)."""
    from pool.pipeline import messages as m
    from pool.pipeline.stages import vad

    # Each comparison with the playback is kept: [score, samples compared] of every match, and
    # the likeness of each confirmation (a stage without one, run from an earlier checkout, has none).
    probes, likenesses = [], []
    real_best_match = vad.best_match
    real_likeness = getattr(vad.VADStage, "_playback_likeness", None)

    def best_match(heard, reference, *args):
        score, offset = real_best_match(heard, reference, *args)
        probes.append([round(float(score), 3), len(heard)])
        return score, offset

    def playback_likeness(stage, *args):
        likeness = real_likeness(stage, *args)
        likenesses.append(round(likeness, 3))
        return likeness

    vad.best_match = best_match
    if real_likeness is not None:
        vad.VADStage._playback_likeness = playback_likeness
    rows = []
    try:
        def one(row, mic, played=reply):
            probes.clear()
            likenesses.clear()
            found = []

            def follow(stage, seconds):
                if stage._in.echo_found and not found:
                    found.append(seconds)

            events = listen(backends, mic, played, step_ms=20, on_append=follow)
            row.update(found_s=found[0] if found else None,
                       removed_ms=sum(e.end_ms - e.start_ms for e in events if isinstance(e, m.EchoRemoved)),
                       speech_started=[e.audio_start_ms for e in events if isinstance(e, m.SpeechStarted)],
                       probes=list(probes), likenesses=list(likenesses))
            rows.append(row)

        for name, source in talkers(split):
            if isinstance(source, Case):
                voice = renderer.utterance(source)  # at Renderer.LEVEL
            else:
                voice = recording(*source)
                voice = voice * (Renderer.LEVEL / active_rms(voice))
            for start in STARTS_S:
                for snr in SNRS:
                    at = int(start * RATE)
                    mic = np.zeros(at + len(voice) + int(1.5 * RATE), np.float32)
                    mic[at:at + len(voice)] = voice[: len(mic) - at]
                    mic += _noise(len(mic), snr, zlib.crc32(f"{name}/{start}".encode()))
                    one({"kind": "talker", "name": name, "start_s": start, "snr_db": snr}, mic)
        for delay, gain, rt60, part in ECHO_PATHS:
            if part != split:
                continue
            for snr in SNRS:
                mic = echo_of(reply[: int(ECHO_S * RATE)], delay, gain, rt60)
                mic += _noise(len(mic), snr, delay)
                one({"kind": "echo", "name": f"{delay}ms {gain:g}dB RT60 {rt60}", "snr_db": snr}, mic)
        for path, channel in sorted({(path, channel) for _, path, channel, *_, part in HUMAN if part == split}, key=str):
            voice = recording(path, channel)
            voice = voice * (Renderer.LEVEL / active_rms(voice))
            name = f"human:{Path(path).stem}{'' if channel is None else f'#{channel}'}"
            for into in np.arange(0.0, len(voice) / RATE - 1.5, BEGUN_STEP_S):
                for reply_from in BEGUN_REPLY_S:
                    one({"kind": "begun_over", "name": name, "into_s": round(float(into), 1), "reply_from_s": reply_from},
                        voice[int(into * RATE):], reply[int(reply_from * RATE):])
    finally:
        vad.best_match = real_best_match
        if real_likeness is not None:
            vad.VADStage._playback_likeness = real_likeness
    return rows


def _noise(samples, snr_db, seed):
    if snr_db is None:
        return np.zeros(samples, np.float32)
    return pink_noise(samples, seed) * Renderer.LEVEL * 10 ** (-snr_db / 20)


def summary(rows):
    """One split's figures from its ``run`` rows: false starts of the talkers and the speech
    removed from them (ms), echo paths found and when (seconds into the reply), echo taken for speech."""
    talk = [r for r in rows if r["kind"] == "talker"]
    echo = [r for r in rows if r["kind"] == "echo"]
    begun = [r for r in rows if r["kind"] == "begun_over"]
    hits = [r for r in begun if r["found_s"] is not None or r["removed_ms"]]
    found = sorted(r["found_s"] for r in echo if r["found_s"] is not None)
    return {
        "talkers": len(talk),
        "false_starts": sum(r["found_s"] is not None for r in talk),
        "false_start_cases": [f"{r['name']} @{r['start_s']}s {r['snr_db']}" for r in talk if r["found_s"] is not None],
        "talker_ms_removed": sum(r["removed_ms"] for r in talk),
        "echo_cases": len(echo),
        "echo_found": len(found),
        "echo_found_at_s_p50": found[len(found) // 2] if found else None,
        "echo_found_at_s_max": found[-1] if found else None,
        "echo_false_speech": sum(bool(r["speech_started"]) for r in echo),
        "begun_over": len(begun),
        "begun_over_hits": len(hits),
        "begun_over_ms_removed": sum(r["removed_ms"] for r in begun),
        "begun_over_hit_cases": [f"{r['name']} from {r['into_s']}s, story from {r['reply_from_s']}s" for r in hits],
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--split", default="held_out", choices=["held_out", "tune", "all"])
    parser.add_argument("--settings", default="{}", help="the VAD stage's echo constants, as JSON")
    parser.add_argument("--rows", help="write every case's row to this JSON file")
    args = parser.parse_args(argv)
    from pool.backends.cache import default_paths
    from pool.backends.scripted import load_scripted
    from pool.backends.tts import KokoroTTS
    from pool.conf import DEFAULTS
    from pool.pipeline.stages import vad

    settings = json.loads(args.settings)
    for name, value in settings.items():
        if not name.startswith("ECHO_") or not hasattr(vad, name):
            parser.error(f"{name} is not an echo constant of pool.pipeline.stages.vad")
        setattr(vad, name, value)
    paths = default_paths(DEFAULTS["MODEL_CACHE_DIR"])
    tts = KokoroTTS(paths["tts_model"], paths["tts_voices"], threads=2)
    renderer = Renderer(tts, corpus_folder() / "utterances")
    reply = story(tts)
    backends = load_scripted({**DEFAULTS, "BACKEND": "scripted"})
    started = time.perf_counter()
    splits = ["tune", "held_out"] if args.split == "all" else [args.split]
    rows = [dict(row, split=split) for split in splits for row in run(backends, renderer, reply, split)]
    if args.rows:
        Path(args.rows).write_text(json.dumps(rows, indent=1))
    emit("double_talk", {"split": args.split, "settings": settings, "seconds": round(time.perf_counter() - started),
                         **{split: summary([r for r in rows if r["split"] == split]) for split in splits}})


if __name__ == "__main__":
    main()

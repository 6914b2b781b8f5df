"""Each stage's model on its own, old way against new way, in one process and one run:

- STT: Whisper tiny.en through faster-whisper's 30 s window against the short window, on the
  recordings (and the first 3 s of jfk.flac);
- LLM: the default SmolLM2-135M GGUF through transformers (fp32, de-quantized at load) against
  llama.cpp: time to the first 4 words of a reply (a new prompt, then the same prompt again for
  llama.cpp's prompt cache) and decoding speed; plus any ``--gguf`` a user brings, on llama.cpp;
- TTS: Kokoro's variants (int8, fp32, int8-gemm), on 2 threads and on 1, on first phrases of 1 to 4 words and a
  sentence: compute time and audio length; and two phrases due at once, one run after the other
  on both cores against both at once on a core each (with the variant the server loads here);
- stt-multilingual (the multilingual preset, when prepared): Whisper base with the short window,
  the language given against detected, on jfk.flac and on Kokoro's speech in each preset language;
- stt-tail: what a speculation hears. The STT transcribes a turn at the first pause of its
  silence (``pool.pipeline.stages.vad.SPECULATE_MS``) and the commit reuses that transcript: the
  word error rate of Whisper tiny.en on the interruption corpus's synthetic requests
  (``bench.interruption_corpus``, every voice, with their noise) cut 100, 200 and 500 ms after
  the speech ends;
- stt-batch: four turns' transcriptions (Whisper tiny.en, short window) one after the other
  against as one batch (one encode of four windows, one greedy decode of four): what item 2 of
  #26 calls batching where the backend batches, for turns that end at the same moment;
- tts-priority: an adopted speculative reply's first phrase in the compute queue's background
  lane, on Kokoro's low-priority copy: its compute time at the lowest priority (nice 19) and
  raised to normal, alone and beside light work at normal priority on both cores (a process
  per core, busy 25 % or 50 % of each 12 ms: the VAD windows and event-loop wake-ups of other
  sessions). Raising needs CAP_SYS_NICE;
- peek-beside: a peek (Whisper tiny.en's ``hear`` on 0.6 s of jfk.flac) alone and beside a
  story's syntheses (Kokoro, the variant served, one phrase after another as at a reply's
  start), the story at the process's own priority and ``STORY_NICE_STEP`` below it, round by
  round; and a synthesis alone at each (BENCHMARKS.md 14n);
- tts-backlog: four replies' later phrases through the compute queue (``ComputeQueue``, the
  server's) when every client has run out of audio (an overloaded pool: each piece due already),
  one synthesis at a time on both cores against two at once on one core each
  (``COMPUTE_SIDE_BY_SIDE``), round by round: seconds of speech per second, and the calls that
  ran side by side (BENCHMARKS.md 5j).

    python -m bench.stages [--repeats 5] [--gguf PATH ...] [--skip-transformers]
                           [--stages stt,llm,tts,stt-multilingual,stt-tail,stt-batch,tts-priority,peek-beside,tts-backlog]

Medians of ``--repeats`` runs after one warm-up. Nothing else runs: these are the models' own
costs on this machine, to set beside the server's (bench.turn_latency).
"""

import argparse
import re
import statistics
import time

import numpy as np
import soxr

from pool.backends.base import LLMRequest
from pool.backends.cache import TTS_VARIANT_PATHS, default_paths, tts_variant
from pool.backends.llm import LlamaCppLLM, TransformersLLM
from pool.backends.stt import WhisperSTT
from pool.backends.tts import KokoroTTS
from pool.conf import DEFAULTS
from realtime.client import load_audio

from .common import RECORDINGS, emit, stats

MESSAGES = [{"role": "system", "content": DEFAULTS["DEFAULT_INSTRUCTIONS"]},
            {"role": "user", "content": "What can I cook tonight with rice and two eggs?"}]
# What Kokoro says in each language of the multilingual preset, and with which voice.
SPOKEN = {"es": ("ef_dora", "Buenos días, quiero reservar una mesa para esta noche."),
          "fr": ("ff_siwis", "Bonjour, je voudrais réserver une table pour ce soir."),
          "it": ("if_sara", "Buongiorno, vorrei prenotare un tavolo per stasera."),
          "pt": ("pf_dora", "Bom dia, eu gostaria de reservar uma mesa para esta noite."),
          "hi": ("hf_alpha", "नमस्ते, मैं आज रात के लिए एक मेज़ बुक करना चाहता हूँ।")}
PHRASES = ["Sure.", "Sure, I", "Sure, I can", "Sure, I can help", "Sure, I can help with that. What would you like?"]


def served_tts_path(paths):
    """``(path, variant)``: the Kokoro file the server loads here by default (``TTS_VARIANT``
    "auto": the variant prepare_models timed fastest on this CPU). Rendering a corpus keeps the
    int8 file (the same input on every CPU); timing what users get takes this one."""
    variant = tts_variant(DEFAULTS["MODEL_CACHE_DIR"], DEFAULTS["THREADS"]["tts"])["chosen"]
    return paths[TTS_VARIANT_PATHS[variant]], variant


def timed(function, repeats):
    """Median seconds of ``repeats`` calls after one warm-up call, and the last result."""
    result = function()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        result = function()
        times.append(time.perf_counter() - started)
    return round(statistics.median(times), 3), result


def stt_rows(paths, repeats):
    stt = WhisperSTT(paths["stt"], DEFAULTS["THREADS"]["stt"])
    clips = {name: soxr.resample(load_audio(path), 24_000, 16_000).astype(np.float32)
             for name, path in RECORDINGS.items()}
    clips["jfk_first_3s"] = clips["jfk"][: 3 * 16_000]
    rows = []
    for name, audio in clips.items():
        full, _ = timed(lambda audio=audio: stt._transcribe_30s(audio, "en", None), repeats)
        short, (text, _language) = timed(lambda audio=audio: stt.transcribe_detect(audio, "en"), repeats)
        rows.append({"audio": name, "seconds": round(len(audio) / 16_000, 1), "window_30s_s": full,
                     "short_window_s": short, "ratio": round(short / full, 2), "transcript": text})
    return rows


def first_words(llm, request, words=4):
    """(seconds to the first ``words`` words, tokens per second over the whole reply, reply)."""
    text, marks = [], {}
    started = time.perf_counter()

    def on_text(chunk):
        text.append(chunk)
        if "first" not in marks and len("".join(text).split()) > words:  # the 4th word is whole
            marks["first"] = time.perf_counter() - started

    usage = llm.generate(request, on_text, lambda: False)
    total = time.perf_counter() - started
    return marks.get("first", total), usage["output_tokens"] / total, "".join(text)


def llm_row(name, llm, repeats, cached):
    request = LLMRequest(MESSAGES, 60)
    firsts, rates = [], []
    first_words(llm, request)  # warm-up
    for i in range(repeats):
        # A new prompt each time (a different user message) unless the prompt cache is measured.
        varied = request if cached else LLMRequest(
            [MESSAGES[0], {"role": "user", "content": MESSAGES[1]["content"] + " " * (i + 1) + str(i)}], 60)
        first, rate, reply = first_words(llm, varied)
        firsts.append(first)
        rates.append(rate)
    return {"model": name, "prompt": "cached" if cached else "new", "first_4_words_s": round(statistics.median(firsts), 3),
            "tokens_per_s": round(statistics.median(rates), 1), "reply": reply}


def stt_batch_rows(paths, repeats):
    """Four transcriptions one after the other against one batch of four
    (``WhisperSTT.transcribe_batch``, what the compute queue runs for transcriptions that wait
    together): medians, seconds, and whether the batch wrote the same transcripts."""
    stt = WhisperSTT(paths["stt"], DEFAULTS["THREADS"]["stt"])
    clips = [soxr.resample(load_audio(path), 24_000, 16_000).astype(np.float32) for path in RECORDINGS.values()]
    clips = [clips[1], clips[2], clips[0][:4 * 16_000], clips[0][4 * 16_000:8 * 16_000]]  # 4-5 s turns
    turns = [(clip, "en", None) for clip in clips]
    one_by_one, texts = timed(lambda: [stt.transcribe_detect(*turn) for turn in turns], repeats)
    batched, batch_texts = timed(lambda: stt.transcribe_batch(turns), repeats)
    return {"turns": len(clips), "seconds_each": [round(len(c) / 16_000, 1) for c in clips],
            "one_after_the_other_s": one_by_one, "one_batch_s": batched, "ratio": round(batched / one_by_one, 2),
            "same_transcripts": texts == batch_texts}


def llm_rows(paths, repeats, ggufs, skip_transformers):
    threads = DEFAULTS["THREADS"]["llm"]
    rows = []
    llama = LlamaCppLLM(paths["llm"], threads, slots=1)
    rows += [llm_row("SmolLM2-135M Q4_1, llama.cpp", llama, repeats, cached) for cached in (False, True)]
    del llama
    if not skip_transformers:
        transformers = TransformersLLM(paths["llm"], threads)
        rows.append(llm_row("SmolLM2-135M, transformers fp32", transformers, repeats, False))
        del transformers
    for path in ggufs:
        other = LlamaCppLLM(path, threads, slots=1)
        rows.append(llm_row(f"{path.rsplit('/', 1)[-1]}, llama.cpp", other, repeats, False))
        del other
    return rows


def tts_rows(paths, repeats):
    """Kokoro's variants (the same weights, pool.backends.quantized), on 2 threads and on 1. The
    variants take turns on each phrase: this kind of machine drifts by tens of percent within
    minutes, which timing one variant after the other would read as a difference."""
    rows = []
    for threads in (DEFAULTS["THREADS"]["tts"], 1):
        models = {variant: KokoroTTS(paths[key], paths["tts_voices"], threads) for variant, key in TTS_VARIANT_PATHS.items()}
        for text in PHRASES:
            for variant, tts in models.items():
                seconds, audio = timed(lambda text=text, tts=tts: tts.synthesize(text, "af_heart"), repeats)
                audio_s = len(audio) / 24_000
                rows.append({"variant": variant, "threads": threads, "text": text, "audio_s": round(audio_s, 2),
                             "compute_s": seconds, "real_time_factor": round(seconds / audio_s, 2)})
        del models
    return rows


def tts_at_once_rows(paths, repeats, text=PHRASES[-1]):
    """Two replies' phrases due at once: one Kokoro run after the other on both cores, against
    both at once on one core each (pool.pipeline.compute's choice). Seconds until the first is
    done and until both are, medians of ``repeats``."""
    from concurrent.futures import ThreadPoolExecutor

    rows = []
    path, variant = served_tts_path(paths)
    for runs_at_once, threads in ((1, DEFAULTS["THREADS"]["tts"]), (2, 1)):
        tts = KokoroTTS(path, paths["tts_voices"], threads)
        tts.synthesize(text, "af_heart")
        firsts, boths = [], []
        with ThreadPoolExecutor(runs_at_once) as pool:
            for _ in range(repeats):
                started = time.perf_counter()
                futures = [pool.submit(tts.synthesize, text, "af_heart") for _ in range(2)]
                done = []
                for future in futures:
                    future.result()
                    done.append(time.perf_counter() - started)
                firsts.append(min(done))
                boths.append(max(done))
        rows.append({"variant": variant, "runs_at_once": runs_at_once, "threads_each": threads, "text": text,
                     "first_done_s": round(statistics.median(firsts), 3),
                     "both_done_s": round(statistics.median(boths), 3)})
        del tts
    return rows


def multilingual_rows(repeats, threads):
    """Whisper base, short window: seconds with the language given and detected, and what it heard."""
    paths = default_paths(DEFAULTS["MODEL_CACHE_DIR"], "multilingual")
    stt = WhisperSTT(paths["stt"], threads)
    tts = KokoroTTS(paths["tts_model"], paths["tts_voices"], threads)
    clips = {"en": ("jfk.flac", soxr.resample(load_audio(RECORDINGS["jfk"]), 24_000, 16_000).astype(np.float32))}
    for language, (voice, text) in SPOKEN.items():
        clips[language] = (voice, soxr.resample(tts.synthesize(text, voice), 24_000, 16_000).astype(np.float32))
    rows = []
    for language, (source, audio) in clips.items():
        given, _ = timed(lambda audio=audio, language=language: stt.transcribe_detect(audio, language), repeats)
        detected, (text, heard_as) = timed(lambda audio=audio: stt.transcribe_detect(audio), repeats)
        rows.append({"language": language, "speech": source, "seconds": round(len(audio) / 16_000, 1),
                     "language_given_s": given, "detected_s": detected, "detected": heard_as, "transcript": text})
    return rows


TAILS_MS = (100, 200, 500)  # silence after the speech: a speculation's at 100 and 200 ms, a commit's


def _words(text):
    return re.findall(r"[a-z']+", text.lower().replace("-", " "))


def word_errors(reference, hypothesis):
    """``(edits, reference words)``: the word-level Levenshtein distance."""
    ref, hyp = _words(reference), _words(hypothesis)
    row = list(range(len(hyp) + 1))
    for i in range(1, len(ref) + 1):
        diagonal, row[0] = row[0], i
        for j in range(1, len(hyp) + 1):
            diagonal, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, diagonal + (ref[i - 1] != hyp[j - 1]))
    return row[len(hyp)], len(ref)


def tail_rows(paths, threads):
    """Word error rate and exact transcripts of the corpus's synthetic interruptions, each cut
    TAILS_MS after its speech (its last 20 ms frame above a tenth of its level)."""
    from .interruption_corpus import Renderer, cases, corpus_folder

    stt = WhisperSTT(paths["stt"], threads)
    renderer = Renderer(KokoroTTS(paths["tts_model"], paths["tts_voices"], threads), corpus_folder())
    chosen = [c for c in cases() if c.kind == "interruption" and not c.voice.startswith("human")]
    errors, words, exact = dict.fromkeys(TAILS_MS, 0), dict.fromkeys(TAILS_MS, 0), dict.fromkeys(TAILS_MS, 0)
    lead = 24_000 * 3 // 10  # 300 ms of the case's noise before the speech, as the VAD's prefix
    for case in chosen:
        speech = renderer.utterance(case)
        frames = speech[:len(speech) // 480 * 480].reshape(-1, 480)
        loud = np.flatnonzero(np.sqrt((frames ** 2).mean(axis=1)) > renderer.LEVEL / 10)
        end = lead + ((loud[-1] + 1) * 480 if len(loud) else len(speech))
        heard = np.concatenate([np.zeros(lead, np.float32), speech, np.zeros(24_000, np.float32)])
        heard = heard + renderer.noise(case, len(heard))
        for tail in TAILS_MS:
            audio = soxr.resample(heard[:end + tail * 24], 24_000, 16_000).astype(np.float32)
            edits, count = word_errors(case.phrase, stt.transcribe(audio, "en"))
            errors[tail] += edits
            words[tail] += count
            exact[tail] += edits == 0
    return [{"tail_ms": tail, "utterances": len(chosen), "word_error_rate": round(errors[tail] / words[tail], 3),
             "exact": exact[tail]} for tail in TAILS_MS]


def _duty_cycle(busy_ms, period_ms, stop):
    """Spin ``busy_ms`` of every ``period_ms`` until ``stop`` is set (a process of its own)."""
    while not stop.is_set():
        until = time.perf_counter() + busy_ms / 1000
        while time.perf_counter() < until:
            pass
        time.sleep((period_ms - busy_ms) / 1000)


def priority_rows(paths, repeats, text=PHRASES[-1]):
    """Seconds of one synthesis by Kokoro's low-priority copy (``KokoroTTS.at_lowest_priority``)
    from a thread at the lowest priority, left there or raised with its runtime's threads to
    normal (as ``pool.pipeline.compute`` raises an adopted run), beside 0, 25 % or 50 % load of
    each core at normal priority. The two alternate run by run (this machine's speed drifts by a
    third within minutes); medians of ``repeats`` each. ``compute_s`` None: raising was refused."""
    import multiprocessing
    import threading

    from pool.backends.base import LOWEST_PRIORITY_NICE, lower_thread_priority, set_threads_priority

    path, variant = served_tts_path(paths)
    low = KokoroTTS(path, paths["tts_voices"], DEFAULTS["THREADS"]["tts"]).at_lowest_priority()
    rows = []
    for duty in (0, 25, 50):
        stop = multiprocessing.Event()
        load = [multiprocessing.Process(target=_duty_cycle, args=(duty * 12 // 100, 12, stop), daemon=True)
                for _ in range(2 if duty else 0)]
        for process in load:
            process.start()
        seconds = {"lowest": [], "raised": []}

        def lane(seconds=seconds):
            lower_thread_priority()
            threads = (threading.get_native_id(), *low.runtime_threads)
            low.synthesize(text, "af_heart")  # warm-up
            for priority in ["lowest", "raised"] * repeats:
                if not set_threads_priority(threads, 0 if priority == "raised" else LOWEST_PRIORITY_NICE):
                    return
                started = time.perf_counter()
                low.synthesize(text, "af_heart")
                seconds[priority].append(time.perf_counter() - started)
            set_threads_priority(threads, LOWEST_PRIORITY_NICE)

        thread = threading.Thread(target=lane)
        thread.start()
        thread.join()
        stop.set()
        for process in load:
            process.join()
        rows += [{"variant": variant, "load_per_core_percent": duty, "priority": priority,
                  "compute_s": round(statistics.median(runs), 3) if runs else None}
                 for priority, runs in seconds.items()]
    return rows


STORY_NICE_STEP = 5  # peek-beside: how far below the process's priority the story runs the second way
STORY = ["Once upon a time, in a small village by the sea,", "there lived an old fisherman who told stories.",
         "Every evening the children gathered around him", "to hear about the storms he had seen."]


def peek_beside_rows(paths, repeats, peeks_per_round=10):
    """Milliseconds of a peek (``WhisperSTT.hear``, 0.6 s of jfk.flac, two backchannel phrases)
    alone, and beside a story's syntheses whose thread and Kokoro runtime run at the process's
    own nice value or STORY_NICE_STEP above it: one phrase after another, as in the first
    seconds of a reply, when a listener's backchannel or barge-in comes and each phrase falls due
    while the client holds little audio. ``repeats`` rounds of ``peeks_per_round`` peeks each
    way, alternating (this machine's speed drifts); ``stats`` of all peeks, and the median
    seconds of one synthesis alone at each nice value."""
    import os
    import threading

    from pool.backends.base import LOWEST_PRIORITY_NICE, at_priority, lower_thread_priority

    path, variant = served_tts_path(paths)
    threads = DEFAULTS["THREADS"]
    stt = WhisperSTT(paths["stt"], threads["stt"])
    peek = soxr.resample(load_audio(RECORDINGS["jfk"]), 24_000, 16_000).astype(np.float32)[: int(0.6 * 16_000)]
    own = os.getpriority(os.PRIO_PROCESS, os.getpid())
    nices = {"process": own, "lower": min(LOWEST_PRIORITY_NICE, own + STORY_NICE_STEP)}
    tts = {"process": KokoroTTS(path, paths["tts_voices"], threads["tts"]),
           "lower": at_priority(lambda: KokoroTTS(path, paths["tts_voices"], threads["tts"]), nices["lower"])[0]}

    def hear():
        started = time.perf_counter()
        stt.hear(peek, None, None, ("Mm-hmm.", "Yeah."))
        return (time.perf_counter() - started) * 1000

    def synthesis_alone(way):
        box = {}

        def run():
            lower_thread_priority(nices[way])
            started = time.perf_counter()
            tts[way].synthesize(STORY[1], "af_heart")
            box["seconds"] = time.perf_counter() - started
        thread = threading.Thread(target=run)
        thread.start()
        thread.join()
        return box["seconds"]

    def beside(way):
        stop, times = threading.Event(), []

        def story():
            lower_thread_priority(nices[way])
            for i in range(10**6):
                if stop.is_set():
                    return
                tts[way].synthesize(STORY[i % len(STORY)], "af_heart")

        thread = threading.Thread(target=story)
        thread.start()
        time.sleep(0.5)
        for _ in range(peeks_per_round):
            times.append(hear())
            time.sleep(0.17)
        stop.set()
        thread.join()
        return times

    for way in ("process", "lower"):
        hear(), synthesis_alone(way)  # warm-up
    peeks, alone = {"alone": [], "process": [], "lower": []}, {"process": [], "lower": []}
    for _ in range(repeats):
        peeks["alone"] += [hear() for _ in range(peeks_per_round)]
        for way in ("process", "lower"):
            alone[way].append(synthesis_alone(way))
            peeks[way] += beside(way)

    return [{"variant": variant, "story": way if way != "alone" else None, "story_nice": nices.get(way),
             "peek_ms": stats(times),
             "synthesis_alone_s": round(statistics.median(alone[way]), 3) if way in alone else None}
            for way, times in peeks.items()]


# Pieces of about 9 words, as a sentence is cut while other work waits (pool.pipeline.pacing's
# CONTENDED_PIECE_SECONDS on a CPU where Kokoro runs at ~0.35x real time).
BACKLOG_PIECES = ("The rainforest holds more kinds of life than anywhere else,",
                  "and most of them live high in the canopy above.",
                  "Frogs, birds and insects spend their whole lives up there,",
                  "while the forest floor stays dark and quiet all day.",
                  "Rivers carry the rain away to the sea each season,",
                  "and the trees breathe much of it back into the sky.")


def tts_backlog_rows(paths, repeats, units=4):
    """``units`` threads, each a reply speaking BACKLOG_PIECES in order through one ComputeQueue,
    every piece due already (its client has no audio left): one synthesis at a time against two
    at once on one core each, alternating ``repeats`` times. Per way: seconds of speech
    synthesized per wall second (median), and how many calls ran side by side. Each reply asks
    for its next piece once the last is done, as the TTS stage does, so it takes three replies or
    more for two to wait while a third runs."""
    import threading

    from pool.pipeline.compute import ComputeQueue

    path, variant = served_tts_path(paths)
    tts = KokoroTTS(path, paths["tts_voices"], DEFAULTS["THREADS"]["tts"])
    pair = tts.on_one_thread()
    for model in (tts, pair):
        model.synthesize(BACKLOG_PIECES[0], "af_heart")
    speeds, paired = {"one_at_a_time": [], "side_by_side": []}, {"one_at_a_time": 0, "side_by_side": 0}
    for _ in range(repeats):
        for way in speeds:
            queue, spoken = ComputeQueue(f"backlog-{way}"), []

            def reply(queue=queue, spoken=spoken, way=way):
                for text in BACKLOG_PIECES:
                    future = queue.submit(0.0, tts.synthesize, text, "af_heart", expected_seconds=1.0,
                                          pair=pair.synthesize if way == "side_by_side" else None)
                    spoken.append((len(future.result()) / 24_000, future.paired))

            started = time.perf_counter()
            threads = [threading.Thread(target=reply) for _ in range(units)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            speeds[way].append(sum(seconds for seconds, _ in spoken) / (time.perf_counter() - started))
            paired[way] += sum(was for _, was in spoken)
    return [{"variant": variant, "way": way, "replies": units, "pieces": units * len(BACKLOG_PIECES) * repeats,
             "side_by_side_calls": paired[way],
             "speech_s_per_s": round(statistics.median(values), 2),
             "each_round": [round(v, 2) for v in values]} for way, values in speeds.items()]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--gguf", action="append", default=[], help="another GGUF to time on llama.cpp")
    parser.add_argument("--skip-transformers", action="store_true")
    parser.add_argument("--stages", default="stt,llm,tts")
    args = parser.parse_args(argv)
    paths = default_paths(DEFAULTS["MODEL_CACHE_DIR"])
    stages = args.stages.split(",")
    result = {"repeats": args.repeats}
    if "stt" in stages:
        result["stt"] = stt_rows(paths, args.repeats)
    if "llm" in stages:
        result["llm"] = llm_rows(paths, args.repeats, args.gguf, args.skip_transformers)
    if "tts" in stages:
        result["tts"] = tts_rows(paths, args.repeats)
        result["tts_two_at_once"] = tts_at_once_rows(paths, args.repeats)
    if "stt-multilingual" in stages:
        result["stt_multilingual"] = multilingual_rows(args.repeats, DEFAULTS["THREADS"]["stt"])
    if "stt-tail" in stages:
        result["stt_tail"] = tail_rows(paths, DEFAULTS["THREADS"]["stt"])
    if "stt-batch" in stages:
        result["stt_batch"] = stt_batch_rows(paths, args.repeats)
    if "tts-priority" in stages:
        result["tts_priority"] = priority_rows(paths, args.repeats)
    if "peek-beside" in stages:
        result["peek_beside"] = peek_beside_rows(paths, args.repeats)
    if "tts-backlog" in stages:
        result["tts_backlog"] = tts_backlog_rows(paths, args.repeats)
    emit("stages", result)


if __name__ == "__main__":
    main()

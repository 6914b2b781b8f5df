"""Turn latency breakdown and answered turns: real recordings streamed in real time to the real
server, with the default session (barge-in on) for each turn detection type.

    python -m bench.turn_latency [--runs 3] [--turn-detection server_vad,semantic_vad]
                                 [--threads '{"llm": 2, "tts": 2}'] [--settings '{"SPECULATIVE_REPLIES": false}']
                                 [--project-dir CHECKOUT]

For each completed response: milliseconds from the end of the user's speech to speech_stopped,
committed, the transcript, response.created, the first LLM text and phrase, the first TTS audio
and the first response.output_audio.delta received by the client; and the overhead: first audio
minus the transcript minus the stages' own compute after it (LLM up to the first phrase, TTS of
the first phrase). The STT runs at the first 200 ms of a pause (speculatively), so its compute is
reported but is not all on the critical path: "transcript" - "committed" is. Per conversation:
whether its last user turn got a completed reply ("answered turns"). Per run: how many
speculative transcripts, and speculative replies, were used by a commit and how many were thrown
away.
"""

import argparse
import asyncio
import json

import psutil

from .common import RECORDINGS, TOKEN, counters, emit, start_server, stats, turn_timings
from .driver import converse, last_turn_answered, turns

SILENCE_MS = 500  # server_vad's default silence_duration_ms
# semantic_vad waits up to 4 s (eagerness auto) when the end-of-turn model says "unfinished".
TRAILING_SILENCE_S = {"server_vad": 3.0, "semantic_vad": 5.0}


def measure(server, recordings, runs, turn_detection="server_vad"):
    """Returns ``(rows, answered)``: one row per completed response, and one bool per
    conversation (its last turn was answered by a completed reply)."""
    session = {"audio": {"input": {"turn_detection": {"type": turn_detection}}}}
    rows, answered = [], []
    for _ in range(runs):
        for name, path in recordings.items():
            conversation = asyncio.run(converse(f"{server.base_url}/realtime", path, session,
                                                trailing_silence_s=TRAILING_SILENCE_S[turn_detection]))
            answered.append(last_turn_answered(conversation))
            for turn in turns(conversation):
                rows.append({"recording": name, **turn})
    server_side = turn_timings(server, [row["response"] for row in rows])
    for row in rows:
        marks = server_side.get(row["response"], {})
        offset = row["speech_stopped"]  # server marks count from its speech_stopped
        for key in ("llm_first_text_ms", "llm_first_phrase_ms", "tts_first_audio_ms"):
            if marks.get(key) is not None:
                row[key.removesuffix("_ms")] = round(offset + marks[key], 1)
        llm_compute = marks.get("llm_compute_ms") or 0
        row["stt_compute"] = marks.get("stt_compute_ms")
        row["stt_speculative"] = bool(marks.get("stt_speculative"))
        row["stt_wait"] = round(row["transcript"] - row["committed"], 1)
        row["llm_first_phrase_compute"] = round(llm_compute, 1)
        row["tts_first_compute"] = marks.get("tts_first_compute_ms")
        row["tts_first_phrase_audio"] = marks.get("tts_first_phrase_audio_ms")
        if row["tts_first_compute"] and row["tts_first_phrase_audio"]:
            row["tts_first_real_time_factor"] = round(row["tts_first_compute"] / row["tts_first_phrase_audio"], 2)
        compute = llm_compute + (row["tts_first_compute"] or 0)
        row["overhead"] = round(row["first_audio"] - row["transcript"] - compute, 1)
    return rows, answered


def speculations(server):
    """The server's speculative transcripts and replies so far: {"used": n, "discarded": n,
    "replies_used": n, "replies_discarded": n} (GET /metrics)."""
    transcripts = counters(server, "s2s_stt_speculations_total", "outcome")
    replies = counters(server, "s2s_speculative_replies_total", "outcome")
    return {"used": transcripts.get("used", 0), "discarded": transcripts.get("discarded", 0),
            "replies_used": replies.get("used", 0), "replies_discarded": replies.get("discarded", 0)}


def summary(rows, answered, turn_detection="server_vad"):
    keys = ["speech_stopped", "committed", "transcript", "response_created", "llm_first_text",
            "llm_first_phrase", "tts_first_audio", "first_audio", "stt_compute", "stt_wait",
            "llm_first_phrase_compute", "tts_first_compute", "tts_first_phrase_audio",
            "tts_first_real_time_factor", "overhead", "playback_stall"]
    table = {key: stats([r[key] for r in rows if r.get(key) is not None]) for key in keys}
    first_audio_p50 = table["first_audio"]["p50"] if table["first_audio"] else None
    return {"turn_detection": turn_detection, "turns": len(rows),
            "speculative_transcripts": sum(bool(r.get("stt_speculative")) for r in rows),
            "answered_turns": f"{sum(answered)}/{len(answered)}", "ms_from_end_of_speech": table,
            "targets": {"overhead_p50_under_20ms": bool(table["overhead"] and table["overhead"]["p50"] < 20),
                        "first_audio_p50_within_silence_plus_350ms":
                            bool(first_audio_p50 is not None and first_audio_p50 <= SILENCE_MS + 350),
                        "every_last_turn_answered": all(answered)}}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--turn-detection", default="server_vad,semantic_vad")
    parser.add_argument("--threads", type=json.loads, default=None, help="S2S THREADS override, JSON")
    parser.add_argument("--recordings", default=",".join(RECORDINGS))
    parser.add_argument("--settings", type=json.loads, default={}, help="more S2S settings, JSON "
                        "(e.g. '{\"SPECULATIVE_REPLIES\": false}' for the measure without speculative replies)")
    parser.add_argument("--project-dir", default=None, help="serve another checkout (a \"before\" of a change)")
    args = parser.parse_args(argv)
    settings = {"STATUS_TOKEN": TOKEN, **({"THREADS": args.threads} if args.threads else {}), **args.settings}
    server = start_server(1, settings, project_dir=args.project_dir)
    results = []
    try:
        recordings = {name: RECORDINGS[name] for name in args.recordings.split(",")}
        process = psutil.Process(server.process.pid)
        for turn_detection in args.turn_detection.split(","):
            before, cpu = speculations(server), sum(process.cpu_times()[:2])
            rows, answered = measure(server, recordings, args.runs, turn_detection)
            after, cpu = speculations(server), sum(process.cpu_times()[:2]) - cpu
            results.append({**summary(rows, answered, turn_detection),
                            "speculations": {k: after[k] - before[k] for k in after},
                            "server_cpu_seconds_per_turn": round(cpu / max(1, len(rows)), 2), "rows": rows})
    finally:
        server.stop()
    emit("turn_latency", {"threads": args.threads or "default", "settings": args.settings,
                          "project_dir": args.project_dir, "results": results})


if __name__ == "__main__":
    main()

"""Turn latency breakdown: real recordings streamed in real time to the real server.

    python -m bench.turn_latency [--runs 3] [--silence-ms 500] [--threads '{"llm": 2, "tts": 2}']

For each completed response: milliseconds from the end of the user's speech to speech_stopped,
committed, the transcript, response.created, the first LLM text and phrase, the first TTS audio
and the first response.output_audio.delta received by the client; and the overhead: first audio
minus the configured silence minus the stages' own compute (STT, LLM up to the first phrase, TTS
of the first phrase).
"""

import argparse
import asyncio
import json

from .common import RECORDINGS, emit, start_server, stats, turn_timings
from .driver import converse, turns


def measure(server, recordings, runs, silence_ms):
    session = {"audio": {"input": {"turn_detection": {"silence_duration_ms": silence_ms,
                                                      "interrupt_response": False}}}}
    rows = []
    for _ in range(runs):
        for name, path in recordings.items():
            conversation = asyncio.run(converse(f"{server.base_url}/realtime", path, session))
            for turn in turns(conversation):
                rows.append({"recording": name, **turn})
    server_side = turn_timings(server.log)
    for row in rows:
        marks = server_side.get(row["response"], {})
        offset = row["speech_stopped"]  # server marks count from its speech_stopped
        for key in ("llm_first_text_ms", "llm_first_phrase_ms", "tts_first_audio_ms"):
            if marks.get(key) is not None:
                row[key.removesuffix("_ms")] = round(offset + marks[key], 1)
        llm_compute = (marks.get("llm_first_phrase_ms") or 0) - (marks.get("llm_start_ms") or 0)
        row["stt_compute"] = marks.get("stt_compute_ms")
        row["llm_first_phrase_compute"] = round(llm_compute, 1)
        row["tts_first_compute"] = marks.get("tts_first_compute_ms")
        compute = (row["stt_compute"] or 0) + llm_compute + (row["tts_first_compute"] or 0)
        row["overhead"] = round(row["first_audio"] - silence_ms - compute, 1)
    return rows


def summary(rows, silence_ms):
    keys = ["speech_stopped", "committed", "transcript", "response_created", "llm_first_text",
            "llm_first_phrase", "tts_first_audio", "first_audio", "stt_compute", "llm_first_phrase_compute",
            "tts_first_compute", "overhead"]
    table = {key: stats([r[key] for r in rows if r.get(key) is not None]) for key in keys}
    first_audio_p50 = table["first_audio"]["p50"] if table["first_audio"] else None
    return {"silence_ms": silence_ms, "turns": len(rows), "ms_from_end_of_speech": table,
            "targets": {"overhead_p50_under_20ms": bool(table["overhead"] and table["overhead"]["p50"] < 20),
                        "first_audio_p50_within_silence_plus_1500ms":
                            bool(first_audio_p50 is not None and first_audio_p50 <= silence_ms + 1500)}}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--silence-ms", type=int, default=500)
    parser.add_argument("--threads", type=json.loads, default=None, help="S2S THREADS override, JSON")
    parser.add_argument("--recordings", default=",".join(RECORDINGS))
    args = parser.parse_args(argv)
    settings = {"THREADS": args.threads} if args.threads else {}
    server = start_server(1, settings)
    try:
        recordings = {name: RECORDINGS[name] for name in args.recordings.split(",")}
        rows = measure(server, recordings, args.runs, args.silence_ms)
    finally:
        server.stop()
    emit("turn_latency", {"threads": args.threads or "default", **summary(rows, args.silence_ms),
                          "rows": rows})


if __name__ == "__main__":
    main()

"""The first turn a freshly started server answers: one short question with no pause in it, the
very first audio the server hears, so that nothing ran its models before (in `bench.turn_latency`
the speculations at a recording's earlier pauses have run every model by the time a reply is
kept). Each run starts its own server; the question is Kokoro's `am_michael` saying QUESTION,
made once from the model cache.

    python -m bench.first_turn [--runs 3] [--project-dir CHECKOUT]

Per run, milliseconds from the end of the question (the server's `audio_end_ms`): the first
`response.output_audio.delta` received, the transcript, the first LLM phrase ready (server); and
the compute of the STT, of the LLM to its first phrase and of the TTS of that phrase.
"""

import argparse
import asyncio
import tempfile
from pathlib import Path

import numpy as np
import soundfile as sf

from pool.backends.base import TTS_RATE
from pool.backends.cache import default_paths
from pool.conf import DEFAULTS

from .common import emit, start_server, stats, turn_timings
from .driver import converse, turns

QUESTION = "What is the tallest mountain in Europe?"
LEAD_IN_S = 0.3  # of silence before the question, as a microphone opens before speech


def question_wav(folder):
    """QUESTION spoken by Kokoro's ``am_michael`` after LEAD_IN_S of silence: a WAV at 24 kHz."""
    from pool.backends.tts import KokoroTTS

    paths = default_paths(DEFAULTS["MODEL_CACHE_DIR"])
    speech = KokoroTTS(paths["tts_model"], paths["tts_voices"]).synthesize(QUESTION, "am_michael")
    path = Path(folder) / "question.wav"
    sf.write(path, np.concatenate([np.zeros(int(LEAD_IN_S * TTS_RATE), np.float32), speech]), TTS_RATE)
    return path


def run(runs, project_dir=None):
    """``runs`` fresh servers, each asked QUESTION once: a row per answered question."""
    path = question_wav(tempfile.mkdtemp(prefix="s2s-first-turn-"))
    session = {"audio": {"input": {"turn_detection": {"type": "server_vad"}}}}
    rows = []
    for _ in range(runs):
        server = start_server(1, project_dir=project_dir)
        try:
            answered = turns(asyncio.run(converse(f"{server.base_url}/realtime", path, session)))
            marks = turn_timings(server, [turn["response"] for turn in answered])
        finally:
            server.stop()
        for turn in answered[:1]:
            server_side = marks.get(turn["response"], {})
            phrase = server_side.get("llm_first_phrase_ms")
            rows.append({"first_audio": turn["first_audio"], "transcript": turn["transcript"],
                         "llm_first_phrase": None if phrase is None else round(turn["speech_stopped"] + phrase, 1),
                         "stt_compute": server_side.get("stt_compute_ms"),
                         "llm_first_phrase_compute": server_side.get("llm_compute_ms"),
                         "tts_first_compute": server_side.get("tts_first_compute_ms")})
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--project-dir", default=None, help="serve another checkout (a \"before\" of a change)")
    args = parser.parse_args(argv)
    rows = run(args.runs, args.project_dir)
    emit("first_turn", {"project_dir": args.project_dir, "answered": f"{len(rows)}/{args.runs}",
                        "ms_from_end_of_speech": {key: stats([row[key] for row in rows if row[key] is not None])
                                                  for key in rows[0]} if rows else {}, "rows": rows})


if __name__ == "__main__":
    main()

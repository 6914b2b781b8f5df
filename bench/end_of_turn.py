"""Cost of one end-of-turn decision (semantic_vad): Smart Turn v3.2 on the last 8 s of a turn,
one onnxruntime thread, features included, beside one Silero VAD window for scale.

    python -m bench.end_of_turn [--calls 30]

It runs on the unit's VAD thread once per pause (at its first 200 ms), so it delays that unit's
VAD by this much, once per pause, and no other unit's.
"""

import argparse
import os
import time

import django

from pool.backends.base import VAD_WINDOW_SAMPLES
from pool.backends.cache import default_paths, prepare
from pool.backends.turn import SmartTurn
from pool.backends.vad import SileroVAD
from realtime.client import load_audio

from .common import RECORDINGS, emit, stats


def _timed(call, calls):
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        call()
        times.append((time.perf_counter() - started) * 1000)
    return stats(times)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=30)
    args = parser.parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "s2s_project.settings")
    django.setup()
    from pool.conf import get_config

    paths = prepare(get_config()["MODEL_CACHE_DIR"], progress=False)
    turn = SmartTurn(paths["turn"])
    stream = SileroVAD(default_paths("")["vad"]).new_stream()
    jfk = load_audio(RECORDINGS["jfk"], 16_000)
    turn.probability(jfk)  # warm-up
    emit("end_of_turn", {
        "smart_turn_ms_per_call": _timed(lambda: turn.probability(jfk[-8 * 16_000:]), args.calls),
        "smart_turn_ms_per_call_2s_of_audio": _timed(lambda: turn.probability(jfk[:2 * 16_000]), args.calls),
        "silero_vad_ms_per_32ms_window": _timed(lambda: stream.probability(jfk[:VAD_WINDOW_SAMPLES]), args.calls),
    })


if __name__ == "__main__":
    main()

"""A small run of every benchmark (a minute or two, small numbers) so the suite cannot rot.
Run by the test suite (tests/test_bench_smoke.py); figures from it mean nothing.

    python -m bench.smoke
"""
import asyncio
import tempfile

from pool.backends.cache import default_paths
from pool.conf import DEFAULTS
from tests.proxy import Caddy

from . import (
    answers,
    connect_storm,
    faults,
    first_turn,
    listening,
    noise,
    proxy,
    soak,
    stages,
    throughput,
    turn_latency,
    webrtc,
)
from .common import RECORDINGS, TOKEN, emit, rss_mb, start_server


def main():
    server = start_server(2, {"STATUS_TOKEN": TOKEN})
    try:
        rows, answered = turn_latency.measure(server, {"hotwords": RECORDINGS["hotwords"]}, 1)
        result = {
            "turn_latency": turn_latency.summary(rows, answered),
            "rss_mb_pool_2": round(rss_mb(server.process.pid), 1),
            "connect_storm": connect_storm.run(server, 12, 2),
            "listening": listening.run(server, [2], 6),
            "throughput": throughput.run(server, 2, 1),
            "soak": soak.run(server, 8, 20),
            "webrtc": webrtc.run(server, {"jfk": RECORDINGS["jfk"]}, 1, 3),
            "answers": answers.summary(asyncio.run(answers.run_all(server, {"memory", "tools"}, per_group=1))),
        }
        upstream = f"127.0.0.1:{server.port}"
        with Caddy(tempfile.mkdtemp(prefix="s2s-smoke-caddy-"), {"a:8000": upstream, "b:8000": upstream}) as caddy:
            result["proxy"] = proxy.run(server, caddy, {"hotwords": RECORDINGS["hotwords"]}, 1)
    finally:
        server.stop()
    paths = default_paths(DEFAULTS["MODEL_CACHE_DIR"])
    result["stages"] = {"stt": stages.stt_rows(paths, 1), "llm": stages.llm_rows(paths, 1, [], True),
                        "tts": stages.tts_rows(paths, 1), "stt_batch": stages.stt_batch_rows(paths, 1),
                        "peek_beside": stages.peek_beside_rows(paths, 1, peeks_per_round=2),
                        "tts_backlog": stages.tts_backlog_rows(paths, 1, units=3)}
    result["first_turn"] = first_turn.run(1)
    result["faults"] = asyncio.run(faults.run(["malformed_frames", "bad_http"], 1, 1.0))
    result["noise"] = noise.run(1.0)
    emit("smoke", result)


if __name__ == "__main__":
    main()

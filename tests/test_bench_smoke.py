"""The benchmark suite runs end to end on small numbers (its figures are not checked here:
speed is measured by bench/, never asserted by tests)."""

import json
import os
import signal
import subprocess
import sys

import pytest

from .helpers import PROJECT_DIR

ROOT = PROJECT_DIR
pytestmark = [pytest.mark.models, pytest.mark.live]


def test_bench_smoke_runs_every_benchmark():
    # A process group of its own: past the limit, its servers go too (a runpool left behind
    # would share the cores with every later test).
    run = subprocess.Popen([sys.executable, "-m", "bench.smoke"], cwd=ROOT, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = run.communicate(timeout=900)
    except subprocess.TimeoutExpired:
        os.killpg(run.pid, signal.SIGKILL)
        stdout, stderr = run.communicate()
        pytest.fail(f"bench.smoke ran past 900 s: {stderr[-3000:]}")
    assert run.returncode == 0, stderr[-3000:]
    result = json.loads(stdout)
    assert result["benchmark"] == "smoke" and result["machine"]["cores"] >= 1
    assert result["turn_latency"]["turns"] >= 1
    assert result["connect_storm"]["claims"] == 2 and result["connect_storm"]["clean_rejections"] == 10
    assert result["connect_storm"]["no_unit_claimed_twice"]
    assert result["listening"]["steps"][0]["active_units"] == 2
    assert result["throughput"]["turns"] >= 1
    assert result["soak"]["sessions_in_a_row"]["served"] == 20
    assert result["webrtc"]["first_audio_ms"]["webrtc_playback_started"]["n"] >= 1
    assert result["proxy"]["first_audio_ms"]["through_caddy"]["n"] >= 1
    assert "ask not what your country" in result["stages"]["stt"][0]["transcript"].lower()
    assert len(result["first_turn"]) == 1 and result["first_turn"][0]["first_audio"] > 0
    assert [row["fault"] for row in result["faults"]] == ["malformed_frames", "bad_http"]
    assert len(result["noise"]["rows"]) == 8 and result["noise"]["denoise_seconds_per_audio_second"] > 0
    assert result["stages"]["llm"][0]["tokens_per_s"] > 0 and result["stages"]["tts"][0]["audio_s"] > 0
    assert result["stages"]["stt_batch"]["turns"] == 4 and result["stages"]["stt_batch"]["one_batch_s"] > 0
    peek = {row["story"]: row for row in result["stages"]["peek_beside"]}
    assert peek[None]["peek_ms"]["n"] == peek["process"]["peek_ms"]["n"] == peek["lower"]["peek_ms"]["n"] == 2
    assert peek["lower"]["story_nice"] > peek["process"]["story_nice"] and peek["lower"]["peek_ms"]["p50"] > 0
    backlog = {row["way"]: row for row in result["stages"]["tts_backlog"]}
    assert backlog["one_at_a_time"]["side_by_side_calls"] == 0 and backlog["side_by_side"]["side_by_side_calls"] > 0
    assert result["throughput"]["compute_calls"]["alone"] > 0  # the server's s2s_compute_calls_total

"""The model cache checks itself: a file truncated or zeroed is noticed (its size at every start,
its sha256 with ``prepare_models --verify``) and rebuilt, and ``runpool`` refuses a damaged cache
in one line that names the file and the command that mends it."""

import json
import os
import shutil
import subprocess
import sys
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command

from pool.backends import cache as model_cache
from pool.backends.cache import (
    KOKORO_ONNX_SHA256,
    SMART_TURN_SHA256,
    TTS_VARIANT_PATHS,
    blas_threads,
    cpu_signature,
    default_paths,
    peek_window_floor,
    prepare,
    sha256_file,
    tts_speed,
    tts_variant,
)
from pool.backends.stt import MIN_WINDOW_SECONDS
from pool.testing import free_port

from .helpers import PROJECT_DIR

pytestmark = pytest.mark.models


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    cache = tmp_path_factory.mktemp("prepared")
    prepare(cache, progress=False)
    return cache


@pytest.fixture
def cache(prepared, tmp_path):
    """A copy of a prepared English cache, to damage."""
    copy = tmp_path / "cache"
    shutil.copytree(prepared, copy)
    return copy


def prepare_models(cache, *args):
    out = StringIO()
    call_command("prepare_models", "--cache-dir", str(cache), *args, stdout=out)
    return out.getvalue()


def truncate(path):
    with open(path, "r+b") as file:
        file.truncate(path.stat().st_size // 2)


def zero(path):
    path.write_bytes(bytes(path.stat().st_size))


def test_a_truncated_file_is_noticed_by_its_size_and_rebuilt(cache):
    kokoro = default_paths(cache)["tts_model"]
    truncate(kokoro)
    said = prepare_models(cache)
    assert f"Damaged: {kokoro} has" in said and "nothing to do" not in said
    assert sha256_file(kokoro) == KOKORO_ONNX_SHA256
    assert "nothing to do" in prepare_models(cache)


def test_a_zeroed_file_is_noticed_by_verify_and_rebuilt(cache):
    turn = default_paths(cache)["turn"]
    zero(turn)
    assert "nothing to do" in prepare_models(cache)  # the size is right: only the sha256 can tell
    said = prepare_models(cache, "--verify")
    assert f"Damaged: {turn} has changed" in said
    assert sha256_file(turn) == SMART_TURN_SHA256
    assert "every sha256 checked); nothing to do" in prepare_models(cache, "--verify")


def runpool(cache, tmp_path):
    """``runpool`` on ``cache``, which must fail before it serves; returns its output."""
    env = {"S2S_CACHE_DIR": str(cache), "S2S_SQLITE_PATH": str(tmp_path / "db.sqlite3"), "PATH": "/usr/bin:/bin",
           "HOME": str(Path.home())}
    run = subprocess.run([sys.executable, "manage.py", "runpool", "--port", str(free_port())], cwd=PROJECT_DIR,
                         env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode != 0
    return run.stderr


@pytest.mark.parametrize("damage, file, mend", [
    (truncate, "tts_model", "Run `manage.py prepare_models` to rebuild it"),
    (zero, "turn", "`manage.py prepare_models --verify` checks every model file"),
])
def test_runpool_refuses_a_damaged_cache_in_one_line(cache, tmp_path, damage, file, mend):
    path = default_paths(cache)[file]
    damage(path)
    said = runpool(cache, tmp_path)
    assert "Traceback" not in said, said[-3000:]
    last = said.strip().splitlines()[-1]
    assert last.startswith("CommandError: ") and str(path) in last and mend in last, last


def test_prepare_times_every_kokoro_variant_on_this_cpu_and_records_the_fastest(prepared):
    choice = json.loads((prepared / "manifest.json").read_text())["tts_variant"]
    assert choice["cpu"] == cpu_signature() and set(choice["compute_s"]) == {"int8", "fp32", "int8-gemm"}
    assert choice["chosen"] == min(choice["compute_s"], key=choice["compute_s"].get)
    assert choice["audio_s"] > 3  # the timing phrases were spoken
    assert tts_variant(prepared) == choice  # a recorded choice is reused, not timed again


def test_the_speed_of_each_variant_is_read_from_its_timing_on_this_cpu_only(prepared, monkeypatch):
    choice = tts_variant(prepared)
    for variant, compute in choice["compute_s"].items():
        assert tts_speed(prepared, variant) == pytest.approx(choice["audio_s"] / compute)
    assert tts_speed(prepared, "int8") > 1  # Kokoro keeps ahead of one listener on any CPU CI runs on
    monkeypatch.setattr(model_cache, "cpu_signature", lambda: "Another CPU avx2")
    assert tts_speed(prepared, choice["chosen"]) is None  # timed on another CPU: unknown here


def test_a_cache_moved_to_another_cpu_is_timed_again_there(cache, monkeypatch):
    monkeypatch.setattr(model_cache, "cpu_signature", lambda: "Another CPU avx2")
    choice = tts_variant(cache)
    assert choice["cpu"] == "Another CPU avx2"
    assert json.loads((cache / "manifest.json").read_text())["tts_variant"] == choice
    assert "nothing to do" in prepare_models(cache)  # the choice is not part of what makes the cache intact


def test_prepare_times_a_peeks_window_with_and_without_the_floor_and_keeps_it_within_budget(prepared):
    choice = json.loads((prepared / "manifest.json").read_text())["peek_window"]
    encode_s = choice["encode_s"]
    assert choice["cpu"] == cpu_signature() and 0 < encode_s["no_floor"] < encode_s["floor"]
    assert choice["floor_s"] == (MIN_WINDOW_SECONDS if encode_s["floor"] <= model_cache.PEEK_ENCODE_BUDGET_S else 0)
    assert peek_window_floor(prepared) == choice  # a recorded choice is reused, not timed again


def test_a_cpu_too_slow_for_the_floor_peeks_without_it_and_the_server_loads_that(cache, monkeypatch, settings):
    """The same rule on a CPU where the floor's window costs more than the budget (a budget of
    0 s stands for that CPU): the choice is recorded, and the loaded STT peeks without the floor
    unless S2S["PEEK_WINDOW_FLOOR_S"] says otherwise."""
    from pool.backends import load_default
    from pool.conf import get_config

    monkeypatch.setattr(model_cache, "PEEK_ENCODE_BUDGET_S", 0.0)
    assert peek_window_floor(cache, retime=True)["floor_s"] == 0
    settings.S2S = {"MODEL_CACHE_DIR": str(cache)}
    assert load_default(get_config()).stt.peek_floor == 0
    settings.S2S = {"MODEL_CACHE_DIR": str(cache), "PEEK_WINDOW_FLOOR_S": 10}
    assert load_default(get_config()).stt.peek_floor == 10


def test_prepare_times_a_transcription_with_numpys_blas_on_its_own_threads_and_on_one(prepared):
    choice = json.loads((prepared / "manifest.json").read_text())["blas_threads"]
    seconds = choice["transcribe_s"]
    assert choice["cpu"] == cpu_signature() and seconds["own"] > 0 and seconds["one"] > 0
    assert choice["blas"] == (1 if seconds["one"] <= seconds["own"] * model_cache.BLAS_ONE_THREAD_SLOWDOWN else None)
    assert blas_threads(prepared) == choice  # a recorded choice is reused, not timed again


def test_the_server_holds_numpys_blas_to_the_count_timed_for_this_cpu(cache, monkeypatch):
    """THREADS["blas"] "auto" (the default): where one BLAS thread slows a transcription (a
    slowdown allowed of 0 stands for that CPU) the BLAS keeps its own threads, elsewhere (any
    slowdown allowed) it runs on one; the server's process loads the recorded choice."""
    monkeypatch.setattr(model_cache, "BLAS_ONE_THREAD_SLOWDOWN", 0.0)
    assert blas_threads(cache, retime=True)["blas"] is None
    monkeypatch.setattr(model_cache, "BLAS_ONE_THREAD_SLOWDOWN", float("inf"))
    assert blas_threads(cache, retime=True)["blas"] == 1
    script = (
        "import json, os, django\n"
        "os.environ['DJANGO_SETTINGS_MODULE'] = 's2s_project.settings'\n"
        "django.setup()\n"
        "from threadpoolctl import threadpool_info\n"
        "from pool.backends import load_backends\n"
        "from pool.conf import get_config\n"
        "load_backends(get_config())\n"
        "print(json.dumps([i['num_threads'] for i in threadpool_info() if i['user_api'] == 'blas']))\n")
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "2", "S2S_JSON": json.dumps({"MODEL_CACHE_DIR": str(cache)})}
    out = subprocess.run([sys.executable, "-c", script], cwd=PROJECT_DIR, env=env, capture_output=True, text=True,
                         check=True)
    blas = json.loads(out.stdout.strip().splitlines()[-1])
    assert blas and all(n == 1 for n in blas)


def test_the_onnx_sessions_threads_sleep_between_parallel_sections():
    """onnxruntime's intra-op threads spin by default while they wait for work: a story's Kokoro
    threads then took the cores from a peek's Whisper beside them (BENCHMARKS.md 14o). Every
    session the backends open (``cpu_session``: Silero, Kokoro, Smart Turn) lets them sleep."""
    from pool.backends.cache import package_dir
    from pool.backends.onnx import cpu_session

    session = cpu_session(package_dir("silero_vad") / "data" / "silero_vad.onnx", threads=2)
    assert session.get_session_options().get_session_config_entry("session.intra_op.allow_spinning") == "0"


def test_every_kokoro_variant_says_what_int8_says(prepared):
    import soxr

    from pool.backends.stt import WhisperSTT
    from pool.backends.tts import KokoroTTS

    paths = default_paths(prepared)
    stt = WhisperSTT(paths["stt"], threads=2)
    text = "The museum opens at nine on Tuesday morning."
    spoken = {variant: KokoroTTS(paths[key], paths["tts_voices"], threads=2).synthesize(text, "am_michael")
              for variant, key in TTS_VARIANT_PATHS.items()}
    assert len(spoken) == 3
    for samples in spoken.values():
        assert abs(len(samples) - len(spoken["int8"])) < 0.05 * len(spoken["int8"])
        heard = stt.transcribe(soxr.resample(samples, 24_000, 16_000)).lower()
        assert all(word in heard for word in ("museum", "opens", "tuesday", "morning")), heard


def test_kokoro_stops_a_synthesis_when_asked_and_its_low_priority_copy_speaks_alike(prepared):
    """A cancelled reply's phrase is stopped mid-run (onnxruntime's terminate flag), and the copy
    of the model the compute queue's background lane runs at the lowest priority says the same."""
    import os
    import threading

    import soxr

    from pool.backends.base import LOWEST_PRIORITY_NICE, RunStop, RunStoppedError
    from pool.backends.stt import WhisperSTT
    from pool.backends.tts import KokoroTTS

    paths = default_paths(prepared)
    tts = KokoroTTS(paths["tts_model"], paths["tts_voices"], threads=2)
    story = ("Once upon a time, in a small village by the sea, there lived an old fisherman who told "
             "stories every evening to the children of the town, and they listened until the stars came out.")
    stop = RunStop()
    threading.Timer(0.2, stop.request).start()  # this synthesis takes more than a second on 2 cores
    with pytest.raises(RunStoppedError):
        tts.synthesize(story, "am_michael", stop=stop)
    text = "The museum opens at nine on Tuesday morning."
    stt = WhisperSTT(paths["stt"], threads=2)
    low = tts.at_lowest_priority()
    # its runtime's thread pool was found, at the lowest priority (the lane raises it when adopted)
    assert low.runtime_threads and {os.getpriority(os.PRIO_PROCESS, t) for t in low.runtime_threads} == {LOWEST_PRIORITY_NICE}
    spoken = [tts.synthesize(text, "am_michael", stop=RunStop()), low.synthesize(text, "am_michael")]
    assert abs(len(spoken[0]) - len(spoken[1])) < 0.05 * len(spoken[0])
    for samples in spoken:
        heard = stt.transcribe(soxr.resample(samples, 24_000, 16_000)).lower()
        assert all(word in heard for word in ("museum", "opens", "tuesday", "morning")), heard

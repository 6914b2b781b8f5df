"""What the benchmarks share: the live server, the recordings, statistics, the machine."""

import contextlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

from pool.pipeline.timings import FIELDS
from pool.testing import LiveServer, free_port
from tests.helpers import AUDIO_DIR

TOKEN = "bench-status-token"  # the servers' STATUS_TOKEN: /metrics and /v1/pool for the benchmark
RECORDINGS = {"jfk": AUDIO_DIR / "jfk.flac", "hotwords": AUDIO_DIR / "hotwords.mp3",
              "stereo": AUDIO_DIR / "stereo_diarization.wav"}


def start_server(pool_size=1, settings=None, backend=None, project_dir=None):
    """A runpool server with the real default models (or ``backend``) and extra ``S2S`` settings;
    ``project_dir``: another checkout to run (a "before" of the same benchmark)."""
    # Benchmarks drive the server from one address, far above a client's CONNECTS_PER_MINUTE.
    env = {"S2S_JSON": json.dumps({"CONNECTS_PER_MINUTE": None, **(settings or {})})}
    if backend:
        env["S2S_BACKEND"] = backend
    return LiveServer(Path(tempfile.mkdtemp(prefix="s2s-bench-")), pool_size=pool_size, env=env,
                      project_dir=project_dir)


def counters(server, sample, label):
    """``{label value: count}`` of the Prometheus counter ``sample`` (its ``_total`` sample name)
    on ``server``'s ``GET /metrics`` (a server started with ``STATUS_TOKEN``: TOKEN); empty
    when it has none (an older checkout)."""
    from prometheus_client.parser import text_string_to_metric_families

    request = urllib.request.Request(f"{server.http_url}/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(request, timeout=5) as reply:
        text = reply.read().decode()
    counts = {}
    for family in text_string_to_metric_families(text):
        for found in family.samples:
            if found.name == sample:
                counts[found.labels[label]] = counts.get(found.labels[label], 0) + int(found.value)
    return counts


# llama.cpp's own server as a process of its own, as an operator would run it (`llama-server`).
_LLAMA_SERVER = """
import sys, time, xllamacpp
params = xllamacpp.CommonParams()
params.model.path = sys.argv[1]
params.hostnames = ["127.0.0.1"]
params.port = int(sys.argv[2])
params.n_ctx = 4096
params.n_parallel = 1
params.use_jinja = True  # the GGUF's own chat template, tools included
params.cpuparams.n_threads = params.cpuparams_batch.n_threads = 2
params.verbosity = 1
server = xllamacpp.Server(params)
while True:
    time.sleep(3600)
"""


@contextlib.contextmanager
def llama_endpoint(gguf, timeout=120):
    """``http://127.0.0.1:PORT/v1``: an OpenAI-compatible chat-completions endpoint, llama.cpp's
    server (the xllamacpp wheel) serving ``gguf`` on a loopback port, in a process of its own."""
    port = free_port()
    process = subprocess.Popen([sys.executable, "-c", _LLAMA_SERVER, str(gguf), str(port)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                raise RuntimeError(f"llama.cpp's server did not start: {process.stderr.read()[-2000:]!r}")
            time.sleep(0.3)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()


def stats(values):
    """p50, p95, p99, mean, n of a list of numbers (None for an empty list)."""
    if not values:
        return None
    array = np.asarray(values, dtype=float)
    return {"p50": round(float(np.percentile(array, 50)), 1), "p95": round(float(np.percentile(array, 95)), 1),
            "p99": round(float(np.percentile(array, 99)), 1), "mean": round(float(array.mean()), 1),
            "n": len(values)}


def rss_mb(pid):
    """Resident memory of a process (MiB), from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def machine():
    """The machine a result was measured on."""
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    memory = int(next(line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines()
                      if line.startswith("MemTotal"))) // 1024 // 1024
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gib": memory, "python": platform.python_version(),
            "date": time.strftime("%Y-%m-%d")}


def emit(name, result):
    """Print one benchmark's result as JSON (the machine included)."""
    print(json.dumps({"benchmark": name, "machine": machine(), **result}, indent=2))


def turn_timings(server, response_ids, timeout=10.0):
    """The server's ``pool.pipeline.timings.TurnTimings`` of each response in ``response_ids``, as dicts,
    from its session history (``pool_sessionresponse``); waits for the recorder to write them."""
    query = f"select response_id, {', '.join(FIELDS)} from pool_sessionresponse"
    deadline = time.monotonic() + timeout
    while True:
        found = {row[0]: dict(zip(FIELDS, row[1:], strict=True)) for row in server.query(query)}
        if set(response_ids) <= set(found) or time.monotonic() > deadline:
            return found
        time.sleep(0.2)

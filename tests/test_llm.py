"""The real local LLM backends on the default SmolLM2-135M GGUF: llama.cpp (the default) and
transformers (for checkpoint folders and GPUs)."""

import stat
from pathlib import Path

import psutil
import pytest

from pool.backends.base import LLMRequest
from pool.backends.cache import default_paths
from pool.backends.llm import LlamaCppLLM, TransformersLLM, load_llm
from pool.conf import DEFAULTS

SYSTEM = {"role": "system", "content": "You are a helpful assistant. Answer in full sentences."}
QUESTION = {"role": "user", "content": "Tell me about the city of Paris."}


def _request(max_tokens=60, prefix=""):
    return LLMRequest([SYSTEM, QUESTION], max_tokens, prefix=prefix)


def _run(llm, request, stop_after=None):
    """(text chunks, usage); ``stop_after``: a cancel once that many chunks have streamed."""
    chunks = []
    usage = llm.generate(request, chunks.append,
                         lambda: stop_after is not None and len(chunks) >= stop_after)
    return chunks, usage


@pytest.fixture(scope="module")
def gguf():
    return default_paths(DEFAULTS["MODEL_CACHE_DIR"])["llm"]


@pytest.fixture(scope="module")
def llama(gguf):
    return LlamaCppLLM(gguf, threads=2, slots=2)


def test_the_default_gguf_runs_on_llama_cpp(gguf):
    assert gguf.suffix == ".gguf" and gguf.exists()
    assert isinstance(load_llm({**DEFAULTS, "LLM_MODEL": None}, gguf), LlamaCppLLM)


def test_backends_share_one_server_and_dropping_one_does_not_hang(gguf):
    """xllamacpp 2026.10 can deadlock destroying a server right after it started (CI hung in
    this module): a model loads once per process, and every backend with the same parameters
    uses that server."""
    first = LlamaCppLLM(gguf, threads=2, slots=2)
    for _ in range(5):
        assert LlamaCppLLM(gguf, threads=2, slots=2)._server is first._server


def test_llama_cpp_streams_a_reply(llama):
    chunks, usage = _run(llama, _request())
    text = "".join(chunks)
    assert len(chunks) > 5 and "paris" in text.lower(), text
    assert usage["input_tokens"] > 10 and 0 < usage["output_tokens"] <= 60


def test_llama_cpp_stops_within_one_token_of_a_cancel(llama):
    chunks, usage = _run(llama, _request(), stop_after=3)
    assert len(chunks) == 3 and usage["output_tokens"] == 3


def test_llama_cpp_honours_max_output_tokens(llama):
    chunks, usage = _run(llama, _request(max_tokens=5))
    assert usage["output_tokens"] == 5 and len(chunks) <= 5


def test_llama_cpp_resumes_a_stopped_reply_as_if_never_stopped(llama):
    whole = "".join(_run(llama, _request(max_tokens=40))[0])
    head, _ = _run(llama, _request(max_tokens=40), stop_after=6)
    tail, usage = _run(llama, _request(max_tokens=34, prefix="".join(head)))
    assert "".join(head) + "".join(tail) == whole
    assert usage["output_tokens"] <= 34


def test_llama_cpp_memory_levels_off_over_a_long_conversation(llama):
    """Each response of a growing conversation is a new prompt; llama.cpp's host-RAM prompt
    cache (on by default, up to 8 GiB) grew by ~40 MB per response. Measured as the growth over
    the last 15 of 40 responses, after 25 have warmed everything up."""
    rss = psutil.Process().memory_info
    history, samples = [], []
    for turn in range(40):
        history.append({"role": "user", "content": f"Question {turn}: tell me about city number {turn}."})
        chunks, _ = _run(llama, LLMRequest([SYSTEM, *history[-11:]], 24))  # the newest items
        history.append({"role": "assistant", "content": "".join(chunks)})
        if turn in (9, 24, 39):
            samples.append(rss().rss / 2**20)
    assert samples[2] - samples[1] < 30, samples  # MiB over the last 15 responses


def test_llama_cpp_listens_on_no_tcp_port(gguf):
    """xllamacpp's HTTP listener is a Unix socket in a folder only this user can open."""
    def tcp_listeners():
        return {c.laddr for c in psutil.Process().net_connections("tcp") if c.status == psutil.CONN_LISTEN}

    before = tcp_listeners()
    llm = LlamaCppLLM(gguf, threads=1, slots=1)
    assert tcp_listeners() == before
    folder = Path(llm._socket_dir)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert [p.name for p in folder.iterdir() if stat.S_ISSOCK(p.stat().st_mode)] == ["llama.sock"]


def test_llama_cpp_reports_a_prompt_too_long_as_an_error(llama):
    huge = LLMRequest([SYSTEM, {"role": "user", "content": "word " * (LlamaCppLLM.CONTEXT_TOKENS + 100)}], 10)
    with pytest.raises(RuntimeError, match="context"):
        _run(llama, huge)


@pytest.fixture(scope="module")
def transformers_llm(gguf):
    return TransformersLLM(gguf, threads=2)  # de-quantizes the GGUF at load (about 30 s)


def test_transformers_streams_stops_and_honours_max_output_tokens(transformers_llm):
    chunks, usage = _run(transformers_llm, _request(max_tokens=30))
    assert "paris" in "".join(chunks).lower() and 0 < usage["output_tokens"] <= 30
    stopped, _ = _run(transformers_llm, _request(), stop_after=3)
    assert len(stopped) <= 4  # the streamer may hold back one partial word
    assert _run(transformers_llm, _request(max_tokens=5))[1]["output_tokens"] == 5

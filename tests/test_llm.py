"""The real local LLM backends on the default SmolLM2-135M GGUF: llama.cpp (the default) and
transformers (for checkpoint folders and GPUs)."""

import json
import stat
from concurrent.futures import ThreadPoolExecutor
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


def test_llama_cpp_warm_up_leaves_the_instructions_in_every_slots_prompt_cache(gguf):
    """A fresh server's slots hold nothing: of requests sent at once, one at least prefills its
    whole prompt. After ``warm_up`` every slot holds the instructions, and each of three
    requests at once reads them from its slot's cache (llama.cpp's ``cached_tokens``)."""
    llm = LlamaCppLLM(gguf, threads=2, slots=3)  # a server of its own, which no other test warms
    system = {"role": "system", "content": f"{DEFAULTS['VOICE_STYLE']}\n\n{DEFAULTS['DEFAULT_INSTRUCTIONS']}"}
    llm.warm_up([system, {"role": "user", "content": "Hello!"}])

    def ask(question):
        return _run(llm, LLMRequest([system, {"role": "user", "content": question}], 4))[1]

    with ThreadPoolExecutor(3) as at_once:
        usages = list(at_once.map(ask, ["What is two plus two?", "Name a colour.", "Where is Paris?"]))
    assert all(usage["cached_tokens"] > usage["input_tokens"] / 2 for usage in usages), usages


def test_llama_cpp_stops_within_one_token_of_a_cancel(llama):
    chunks, usage = _run(llama, _request(), stop_after=3)
    assert len(chunks) == 3 and usage["output_tokens"] == 3
    # A stopped stream gets no usage chunk; its input is counted all the same, as a whole one's.
    whole = _run(llama, _request(max_tokens=3))[1]
    assert usage["input_tokens"] == whole["input_tokens"] > 10


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


# --- function tools: the model's own way (native) and the prompt protocol ----------------------

WEATHER = {"type": "function", "name": "get_weather", "description": "The weather of a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
# A tools block in the form Qwen2.5's and Hermes' templates use, for the packaged model (whose
# own template has none): llama.cpp renders the tools into the prompt and parses the model's
# <tool_call> as a call.
HERMES_TEMPLATE = """{%- if tools %}<|im_start|>system
{{ messages[0]['content'] }}

# Tools

You are provided with function signatures within <tools></tools> XML tags:
<tools>{% for tool in tools %}
{{ tool | tojson }}{% endfor %}
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call><|im_end|>
{% else %}<|im_start|>system
{{ messages[0]['content'] }}<|im_end|>
{% endif %}{%- for message in messages[1:] %}{%- if message.role == "tool" %}<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% elif message.tool_calls %}<|im_start|>assistant
{% for call in message.tool_calls %}<tool_call>{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}</tool_call>{% endfor %}<|im_end|>
{% else %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""


def _asked_before(*cities):
    """Earlier turns in which the assistant called get_weather for each of ``cities``: SmolLM2-135M
    makes a call in the template's form after three of them (greedy decoding), not from the
    tools block alone."""
    turns = []
    for n, city in enumerate(cities):
        turns += [{"role": "user", "content": f"What is the weather in {city}?"},
                  {"role": "assistant", "content": None, "tool_calls": [{"id": f"call_{n}", "type": "function",
                   "function": {"name": "get_weather", "arguments": json.dumps({"city": city})}}]},
                  {"role": "tool", "tool_call_id": f"call_{n}", "content": '{"forecast": "sunny"}'},
                  {"role": "assistant", "content": f"It is sunny in {city}."}]
    return turns


ASSISTANT = {"role": "system", "content": "You are a helpful assistant."}
ASK_PARIS = [ASSISTANT, *_asked_before("Rome", "Berlin", "Madrid"),
             {"role": "user", "content": "What is the weather in Paris?"}]


def _run_tools(llm, messages, tools=(WEATHER,)):
    """(text, [(name, arguments dict, call id)], usage)"""
    chunks, calls = [], []
    usage = llm.generate(LLMRequest(messages, 60, list(tools)), chunks.append, lambda: False,
                         lambda name, arguments, call_id=None: calls.append((name, json.loads(arguments), call_id)))
    return "".join(chunks), calls, usage


def test_which_templates_take_tools(gguf):
    from pool.backends.llm import gguf_chat_template, template_takes_tools

    assert not template_takes_tools(gguf_chat_template(gguf))  # SmolLM2's: no tools block
    assert template_takes_tools(HERMES_TEMPLATE)
    assert not LlamaCppLLM(gguf, threads=2, slots=2).native_tools


@pytest.fixture(scope="module")
def hermes_template(tmp_path_factory):
    path = tmp_path_factory.mktemp("template") / "hermes.jinja"
    path.write_text(HERMES_TEMPLATE)
    return path


def test_native_tool_calls_go_through_llama_cpps_template_and_parser(gguf, hermes_template):
    llm = load_llm({**DEFAULTS, "LLM_MODEL": str(gguf), "LLM_CHAT_TEMPLATE": str(hermes_template),
                    "THREADS": {"llm": 2}, "POOL_SIZE": 2}, gguf)
    assert llm.native_tools
    text, calls, usage = _run_tools(llm, ASK_PARIS)
    assert [(name, arguments) for name, arguments, _ in calls] == [("get_weather", {"city": "Paris"})]
    assert text == "" and calls[0][2]  # parsed by llama.cpp, which gives the call its id
    # The tools are in the prompt the template rendered: it is longer by their JSON.
    _, _, without = _run_tools(llm, ASK_PARIS, tools=())
    assert usage["input_tokens"] > without["input_tokens"] + 30


def test_the_prompt_protocol_stays_when_asked_for(gguf, hermes_template):
    """The same model and template with LLM_TOOL_CALLS "prompt": the tools are offered in the
    system prompt, the conversation's calls are flattened to text, and the call the model
    writes is read by the server."""
    llm = LlamaCppLLM(gguf, threads=2, slots=2, tool_calls="prompt", chat_template=hermes_template)
    assert not llm.native_tools
    text, calls, _ = _run_tools(llm, ASK_PARIS)
    assert [(name, arguments) for name, arguments, _ in calls] == [("get_weather", {"city": "Paris"})]
    assert text == ""

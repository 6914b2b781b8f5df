"""The LLM stage's models: a GGUF run by llama.cpp (the default), a transformers checkpoint, or an
OpenAI-compatible endpoint.

All take the same request and stream through callbacks, so the LLM stage does not care which one
runs. ``messages`` are chat-completions messages: ``{"role", "content"}``, assistant messages
with ``tool_calls``, and ``{"role": "tool", "tool_call_id", "content"}`` function results.
``tools`` are Realtime function tools (``{"type": "function", "name", "description",
"parameters"}``).
"""

import atexit
import json
import logging
import re
import shutil
import tempfile
import threading
from pathlib import Path

log = logging.getLogger(__name__)


def load_llm(config, default_path):
    """The LLM backend the settings ask for: an endpoint by ``LLM_BASE_URL``, else a local model,
    a ``.gguf`` file by llama.cpp and a checkpoint folder by transformers."""
    if config["LLM_BASE_URL"]:
        return OpenAICompatibleLLM(config["LLM_BASE_URL"], config["LLM_API_KEY"], config["LLM_API_MODEL"],
                                   timeout=config["LLM_TIMEOUT_SECONDS"])
    path = Path(config["LLM_MODEL"] or default_path)
    if path.suffix == ".gguf":
        return LlamaCppLLM(path, config["THREADS"]["llm"], slots=min(config["POOL_SIZE"], LlamaCppLLM.MAX_SLOTS),
                           tool_calls=config["LLM_TOOL_CALLS"], chat_template=config["LLM_CHAT_TEMPLATE"])
    return TransformersLLM(path, config["THREADS"]["llm"])


def gguf_chat_template(path):
    """The Jinja chat template a GGUF file carries (its ``tokenizer.chat_template``), or ""."""
    from gguf import GGUFReader

    field = GGUFReader(str(path)).fields.get("tokenizer.chat_template")
    return bytes(field.parts[field.data[0]]).decode("utf-8", "replace") if field is not None else ""


def template_takes_tools(template):
    """Whether a Jinja chat template renders the request's ``tools`` (Qwen2.5, Llama 3.x,
    SmolLM3, Hermes and other templates with a tools block); SmolLM2's has none."""
    return re.search(r"\btools\b", template) is not None


def _chat_messages(request, tools):
    """The request's messages for a model without tool roles, with ``tools`` offered in the
    system prompt."""
    messages = flatten_tool_messages(request.messages)
    if tools:
        messages[0] = {**messages[0], "content": messages[0]["content"] + tools_prompt(tools)}
    return messages


TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
CALL_OPENINGS = (TOOL_CALL_OPEN, "{", "```")  # how a reply that is a tool call begins
_FENCE = re.compile(r"^```[a-z]*\s*")


def tools_prompt(tools):
    """System-prompt text that offers ``tools`` to a model without native tool support.

    The format (a JSON object between ``<tool_call>`` tags) is the one SmolLM2 and Qwen2.5 chat
    templates use for tool calls.
    """
    specs = "\n".join(json.dumps({"name": t["name"], "description": t.get("description", ""),
                                  "parameters": t.get("parameters", {})}) for t in tools)
    return ("\n\nYou can call these functions:\n" + specs + "\nTo call one, answer with only "
            f'{TOOL_CALL_OPEN}{{"name": "<function name>", "arguments": {{...}}}}{TOOL_CALL_CLOSE}')


def flatten_tool_messages(messages):
    """Chat messages with tool calls and results rewritten as plain text, for chat templates
    without tool roles."""
    flat = []
    for message in messages:
        if message.get("tool_calls"):
            calls = "".join(f'{TOOL_CALL_OPEN}{{"name": {json.dumps(c["function"]["name"])}, "arguments": '
                            f'{c["function"]["arguments"]}}}{TOOL_CALL_CLOSE}' for c in message["tool_calls"])
            flat.append({"role": "assistant", "content": calls})
        elif message["role"] == "tool":
            flat.append({"role": "user", "content": f"Function result: {message['content']}"})
        else:
            flat.append({"role": message["role"], "content": message.get("content") or ""})
    return flat


class _ToolCallCatcher:
    """Passes streamed text on, unless the reply opens as a tool call: ``<tool_call>`` (the
    prompt protocol, Hermes-style templates), a bare JSON object (Qwen2.5's ``<tool_call>`` is
    a special token, which llama.cpp leaves out of the text it streams) or one in a markdown
    code fence (Qwen2.5-Coder's habit). Such a reply is held and parsed at the end; a call names
    one of ``names`` (the tools offered). Text that only looks like a call is passed on as text."""

    def __init__(self, on_text, on_function_call, names):
        self.on_text, self.on_function_call, self.names = on_text, on_function_call, set(names)
        self.held = ""
        self.deciding = True

    def text(self, text):
        if not self.deciding:
            self.on_text(text)
            return
        self.held += text
        head = self.held.lstrip()[: len(TOOL_CALL_OPEN)]
        if head and not any(opening.startswith(head) or head.startswith(opening) for opening in CALL_OPENINGS):
            # not a call: speak it
            self.deciding = False
            self.on_text(self.held)
            self.held = ""

    def finish(self):
        if not self.held:
            return
        call = parse_tool_call(self.held, self.names)
        if call is None:
            self.on_text(self.held)
            return
        self.on_function_call(*call)


def parse_tool_call(text, names):
    """``(name, arguments JSON)`` of the first call in ``text`` (``<tool_call>{"name": ...,
    "arguments": {...}}</tool_call>``, the tags optional, or in a markdown code fence) to one of
    ``names``, or None."""
    body = _FENCE.sub("", text.strip())
    if body.startswith(TOOL_CALL_OPEN):
        body = body[len(TOOL_CALL_OPEN):].lstrip()
    try:
        call, _ = json.JSONDecoder().raw_decode(body)
        name, arguments = call["name"], call.get("arguments", {})
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    if name not in names:
        return None
    return str(name), arguments if isinstance(arguments, str) else json.dumps(arguments)


class _StreamedCalls:
    """Tool calls streamed in chat-completions deltas, assembled by their ``index``."""

    def __init__(self):
        self.calls = {}  # index -> {"id", "name", "arguments"}

    def add(self, index, call_id, name, arguments):
        entry = self.calls.setdefault(index, {"id": None, "name": "", "arguments": ""})
        entry["id"] = call_id or entry["id"]
        entry["name"] += name or ""
        entry["arguments"] += arguments or ""

    def finish(self, on_function_call):
        for index in sorted(self.calls):
            call = self.calls[index]
            on_function_call(call["name"], call["arguments"] or "{}", call["id"])


def chat_tools(tools, tool_choice):
    """Realtime function ``tools`` and ``tool_choice`` as chat-completions ``tools`` and
    ``tool_choice``."""
    listed = [{"type": "function", "function": {
        "name": t["name"], "description": t.get("description", ""),
        "parameters": t.get("parameters") or {"type": "object", "properties": {}}}} for t in tools]
    choice = ({"type": "function", "function": {"name": tool_choice["name"]}}
              if isinstance(tool_choice, dict) else tool_choice)
    return listed, choice


class LlamaCppLLM:
    """A GGUF model run by llama.cpp (``xllamacpp``'s embedded server), greedy decoding.

    ``path``: a ``.gguf`` file; ``threads``: llama.cpp's CPU threads; ``slots``: requests decoded
    together (continuous batching), each with ``CONTEXT_TOKENS`` of context and its own prompt
    cache (``generate``'s usage says how many ``cached_tokens`` it read from it; ``warm_up``
    fills them); more wait their turn. ``chat_template``: a Jinja file that replaces the GGUF's
    own template (``LLM_CHAT_TEMPLATE``), or None. Measured on SmolLM2-135M Q4_1 on 2 cores
    (BENCHMARKS.md, 1a): the first 4 words in 0.12 s instead of transformers fp32's 0.80 s, 71
    tokens/s instead of 9, and no fp32 copy of the weights.

    Function tools (``tool_calls``, ``LLM_TOOL_CALLS``): ``"native"`` gives them to llama.cpp,
    whose Jinja chat template shows them to the model in the form it was trained on (and whose
    parser streams the model's calls as ``tool_calls``); ``"prompt"`` offers them in the system
    prompt (``tools_prompt``), for templates without tools such as SmolLM2's; ``"auto"``: native
    when the template takes tools (``template_takes_tools``). ``native_tools`` says which.

    xllamacpp always starts llama.cpp's HTTP listener. It is bound to a Unix socket in a private
    temporary folder (mode 0700, removed at exit) instead of a loopback TCP port, so no other
    user of the machine can reach it. Backends with the same parameters share one server.

    ``resumes``: the LLM stage pauses a reply by stopping it and continuing later from
    ``LLMRequest.prefix``; the prompt cache makes the continuation cost only the new tokens.
    Blocking the stream callback instead would stall llama.cpp's one decoding loop, every slot.
    """

    resumes = True
    MAX_SLOTS = 4
    CONTEXT_TOKENS = 4096  # per slot: LLM_CONTEXT_CHARS of chat, the instructions and the reply
    REPEAT_PENALTY = 1.1  # as TransformersLLM's repetition_penalty

    def __init__(self, path, threads=2, slots=2, tool_calls="auto", chat_template=None):
        template = Path(chat_template).read_text() if chat_template else None
        self.native_tools = tool_calls == "native" or (
            tool_calls == "auto" and template_takes_tools(template if template is not None else gguf_chat_template(path)))
        self.slots = slots
        self._server, self._socket_dir = _llama_server(str(path), threads, slots, self.CONTEXT_TOKENS, template)

    def warm_up(self, messages):
        """Prefill ``messages`` (chat messages) in every slot, one after the other, and make one
        token: each slot's prompt cache then holds their prefix (``pool.backends.warm_up``).
        Pinned by ``id_slot``: requests sent at once may share one slot, and a slot that llama.cpp
        picks for being least recently used starts with an empty cache (with ``cache_ram_mib``
        0, nothing is kept to load back)."""
        for slot in range(self.slots):
            body = {"messages": messages, "stream": True, "cache_prompt": True, "max_tokens": 1,
                    "temperature": 0.0, "id_slot": slot}
            self._server.handle_chat_completions(body, lambda chunk: False)

    def generate(self, request, on_text, should_stop, on_function_call=None):
        tools = request.offered_tools() if on_function_call else []
        native = self.native_tools and bool(tools)
        # A continued reply has begun as text: it is no longer a tool call. (Its request offers
        # the same tools, so that its prompt, and llama.cpp's cache of it, stay the same.)
        catching = bool(tools) and not request.prefix
        sink = _ToolCallCatcher(on_text, on_function_call, [t["name"] for t in tools]) if catching else None
        if native:
            messages = [{**message, "content": message.get("content") or ""} for message in request.messages]
        else:
            messages = _chat_messages(request, tools)
        if request.prefix:  # llama.cpp continues a final assistant message ("prefill")
            messages.append({"role": "assistant", "content": request.prefix})
        # timings_per_token: every chunk says how the prompt was read (prompt_n new tokens after
        # cache_n from the slot's cache), so a stream stopped before its end, which gets no usage
        # chunk, still knows its input.
        body = {"messages": messages, "stream": True, "cache_prompt": True,
                "max_tokens": request.max_output_tokens, "temperature": 0.0,
                "repeat_penalty": self.REPEAT_PENALTY, "stream_options": {"include_usage": True},
                "timings_per_token": True}
        if native:
            body["tools"], body["tool_choice"] = chat_tools(tools, request.tool_choice)
        usage = {"input_tokens": 0, "output_tokens": 0}
        errors = []
        calls = _StreamedCalls()

        def on_chunk(chunk):
            if "error" in chunk:
                errors.append(chunk["error"])
                return True
            timings = chunk.get("timings")
            if timings and not usage["input_tokens"]:
                usage["input_tokens"] = timings.get("cache_n", 0) + timings.get("prompt_n", 0)
                usage["cached_tokens"] = timings.get("cache_n", 0)
            if chunk.get("usage"):
                usage["input_tokens"] = chunk["usage"]["prompt_tokens"]
                usage["output_tokens"] = chunk["usage"]["completion_tokens"]
                usage["cached_tokens"] = (chunk["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0)
            for choice in chunk.get("choices") or []:
                delta = choice.get("delta") or {}
                text = delta.get("content")
                if text:
                    usage["streamed"] = usage.get("streamed", 0) + 1
                    (sink.text if sink else on_text)(text)
                for call in (delta.get("tool_calls") or ()) if catching else ():
                    usage["streamed"] = usage.get("streamed", 0) + 1
                    function = call.get("function") or {}
                    calls.add(call.get("index", 0), call.get("id"), function.get("name"), function.get("arguments"))
            return should_stop()  # True stops decoding before the next token

        self._server.handle_chat_completions(body, on_chunk)
        if errors:
            error = errors[0].get("error", errors[0])
            raise RuntimeError(f"llama.cpp: {error.get('message', error)}")
        if sink:
            sink.finish()
        calls.finish(on_function_call)
        # A stopped stream sends no usage: each streamed chunk is one token, the input is the timings'.
        usage["output_tokens"] = max(usage["output_tokens"], usage.pop("streamed", 0))
        return usage


_LLAMA_SERVERS = {}  # (path, threads, slots, context, template) -> (xllamacpp.Server, socket folder)
_LLAMA_LOCK = threading.Lock()


def _llama_server(path, threads, slots, context_tokens, chat_template=None):
    """The process's llama.cpp server for these parameters, started on first use and kept for
    the life of the process: a model loads once per process, and xllamacpp 2026.10 can deadlock
    in its destructor when a server is dropped soon after it started (seen in CI).
    ``chat_template``: Jinja source that replaces the GGUF's template, or None."""
    key = (path, threads, slots, context_tokens, chat_template)
    with _LLAMA_LOCK:
        if key not in _LLAMA_SERVERS:
            import xllamacpp

            params = xllamacpp.CommonParams()
            params.model.path = path
            params.n_parallel = slots
            params.n_ctx = context_tokens * slots
            params.cpuparams.n_threads = params.cpuparams_batch.n_threads = threads
            params.verbosity = 1  # errors only: llama.cpp logs every request at its default level
            # llama.cpp keeps the KV state of past prompts in host RAM (--cache-ram, 8 GiB by
            # default): about 40 MB more for every response of a long call (bench/soak). Each
            # unit's session stays on a slot whose own prompt cache serves the resumes.
            params.cache_ram_mib = 0
            if chat_template is not None:
                params.chat_template = chat_template
            socket_dir = tempfile.mkdtemp(prefix="s2s-llama-")
            params.hostnames = [str(Path(socket_dir) / "llama.sock")]
            atexit.register(shutil.rmtree, socket_dir, True)
            try:
                server = xllamacpp.Server(params)
            except Exception as exc:  # xllamacpp says only "Failed to init server"
                what = "is it a GGUF model?" if chat_template is None else "is it a GGUF model, and LLM_CHAT_TEMPLATE a chat template llama.cpp can parse (its log above says)?"
                raise RuntimeError(f"llama.cpp could not load {path}: {what}") from exc
            _LLAMA_SERVERS[key] = (server, socket_dir)
        return _LLAMA_SERVERS[key]


class TransformersLLM:
    """A causal LM run by transformers on the CPU, greedy decoding, fp32.

    ``path``: a checkpoint folder, or a ``.gguf`` file (de-quantized at every load: slow; the
    default GGUF runs on ``LlamaCppLLM``). ``threads``: torch intra-op threads, a process-wide
    setting. The weights are shared read-only by all units; each call keeps its own KV cache.
    Function tools are offered in the system prompt (``tools_prompt``).
    """

    resumes = False

    def __init__(self, path, threads=2):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        torch.set_num_threads(threads)
        path = Path(path)
        kwargs = {"gguf_file": path.name} if path.suffix == ".gguf" else {}
        folder = path.parent if kwargs else path
        self.tokenizer = AutoTokenizer.from_pretrained(folder, **kwargs)
        self.model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, **kwargs).eval()
        self._torch = torch

    def generate(self, request, on_text, should_stop, on_function_call=None):
        from transformers import StoppingCriteria, StoppingCriteriaList, TextStreamer

        tools = request.offered_tools() if on_function_call else []
        sink = _ToolCallCatcher(on_text, on_function_call, [t["name"] for t in tools]) if tools else None

        class _Stream(TextStreamer):
            def on_finalized_text(self, text, stream_end=False):
                if text:
                    (sink.text if sink else on_text)(text)

        class _Stop(StoppingCriteria):
            def __call__(self, input_ids, scores, **kwargs):
                return should_stop()

        messages = _chat_messages(request, tools)
        inputs = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
        )
        prompt_tokens = inputs["input_ids"].shape[1]
        with self._torch.inference_mode():
            output = self.model.generate(
                **inputs,
                max_new_tokens=request.max_output_tokens,
                do_sample=False,
                repetition_penalty=1.1,
                streamer=_Stream(self.tokenizer, skip_prompt=True, skip_special_tokens=True),
                stopping_criteria=StoppingCriteriaList([_Stop()]),
                pad_token_id=self.tokenizer.eos_token_id,
            )
        if sink:
            sink.finish()
        return {"input_tokens": prompt_tokens, "output_tokens": output.shape[1] - prompt_tokens}


class OpenAICompatibleLLM:
    """Chat completions from a server that speaks OpenAI's API (vLLM, llama.cpp, Ollama).

    ``base_url`` like ``http://127.0.0.1:11434/v1``; ``model`` the server's model name. Tools are
    passed as chat-completions function tools; streamed tool calls are assembled by index. A
    session's ``reasoning.effort`` goes as ``reasoning_effort``, its ``parallel_tool_calls`` as
    is (with tools only), when set.

    A call the endpoint's model writes as text (a ``<tool_call>`` tag, bare JSON or a markdown
    fence: llama.cpp's server streams Qwen2.5-Coder's fenced calls as content, BENCHMARKS.md 13a)
    is caught as the local model's are (``_ToolCallCatcher``), not spoken.

    ``timeout``: seconds the endpoint may take to accept the connection (at most 5) and to send
    each next part of its stream; past it the response fails (``model_error``) and the session
    goes on. A cancel is seen between parts, so a silent endpoint holds it up to ``timeout``.
    """

    resumes = False  # not every such server continues a final assistant message
    images = True  # input_image parts go as image_url parts (the endpoint's model may read them)

    def __init__(self, base_url, api_key, model, timeout=30.0):
        import openai

        # The SDK's own default waits 600 s for a silent endpoint, with the unit's LLM thread held.
        self.client = openai.OpenAI(base_url=base_url, api_key=api_key or "unused", max_retries=1,
                                    timeout=openai.Timeout(timeout, connect=min(timeout, 5.0)))
        self.model = model

    def generate(self, request, on_text, should_stop, on_function_call=None):
        extra = {}
        tools = request.offered_tools() if on_function_call else []
        if tools:
            extra["tools"], extra["tool_choice"] = chat_tools(tools, request.tool_choice)
            if request.parallel_tool_calls is not None:
                extra["parallel_tool_calls"] = request.parallel_tool_calls
        if request.reasoning_effort is not None:
            extra["reasoning_effort"] = request.reasoning_effort
        stream = self.client.chat.completions.create(
            model=self.model, messages=request.messages, stream=True,
            max_tokens=request.max_output_tokens, stream_options={"include_usage": True}, **extra,
        )
        usage = {"input_tokens": 0, "output_tokens": 0}
        calls = _StreamedCalls()
        sink = _ToolCallCatcher(on_text, on_function_call, [t["name"] for t in tools]) if tools else None
        with stream:
            for chunk in stream:
                if chunk.usage:
                    details = chunk.usage.prompt_tokens_details  # None where the endpoint does not say
                    usage = {"input_tokens": chunk.usage.prompt_tokens,
                             "output_tokens": chunk.usage.completion_tokens,
                             "cached_tokens": (details.cached_tokens if details else None) or 0}
                for choice in chunk.choices:
                    delta = choice.delta
                    if delta and delta.content:
                        (sink.text if sink else on_text)(delta.content)
                    for call in (delta.tool_calls or []) if delta else []:
                        function = call.function
                        calls.add(call.index, call.id, function and function.name, function and function.arguments)
                if should_stop():
                    break
        if sink:
            sink.finish()
        calls.finish(on_function_call)
        return usage

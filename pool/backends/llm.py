"""The LLM stage's models: a local transformers checkpoint, or an OpenAI-compatible endpoint.

Both take the same request and stream through callbacks, so the LLM stage does not care which one
runs. ``messages`` are chat-completions messages: ``{"role", "content"}``, assistant messages
with ``tool_calls``, and ``{"role": "tool", "tool_call_id", "content"}`` function results.
``tools`` are Realtime function tools (``{"type": "function", "name", "description",
"parameters"}``).
"""

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)


@dataclass
class LLMRequest:
    """One response to generate. ``max_output_tokens``: a positive int (already capped)."""

    messages: list
    max_output_tokens: int
    tools: list = field(default_factory=list)
    tool_choice: object = "auto"

    def offered_tools(self):
        """The tools the model may call under ``tool_choice`` (none, all, or the named one)."""
        if self.tool_choice == "none":
            return []
        if isinstance(self.tool_choice, dict):
            return [t for t in self.tools if t.get("name") == self.tool_choice.get("name")]
        return list(self.tools)


def load_llm(config, default_path):
    """The LLM backend the settings ask for: an endpoint by ``LLM_BASE_URL``, else a local model."""
    if config["LLM_BASE_URL"]:
        return OpenAICompatibleLLM(config["LLM_BASE_URL"], config["LLM_API_KEY"], config["LLM_API_MODEL"])
    return TransformersLLM(config["LLM_MODEL"] or default_path, config["THREADS"]["llm"])


TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"


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
    """Passes streamed text on, unless the reply opens with ``<tool_call>``: then it is held and
    parsed as a call at the end. Text that only looks like a call is passed on as text."""

    def __init__(self, on_text, on_function_call):
        self.on_text, self.on_function_call = on_text, on_function_call
        self.held = ""
        self.deciding = True

    def text(self, text):
        if not self.deciding:
            self.on_text(text)
            return
        self.held += text
        head = self.held.lstrip()[: len(TOOL_CALL_OPEN)]
        if not TOOL_CALL_OPEN.startswith(head):  # the reply is not a call: speak it
            self.deciding = False
            self.on_text(self.held)
            self.held = ""

    def finish(self):
        if not self.held:
            return
        body = self.held.strip()[len(TOOL_CALL_OPEN):].split(TOOL_CALL_CLOSE)[0]
        try:
            call = json.loads(body)
            name, arguments = call["name"], call.get("arguments", {})
        except (ValueError, KeyError, TypeError):
            self.on_text(self.held)
            return
        self.on_function_call(str(name), arguments if isinstance(arguments, str) else json.dumps(arguments))


class TransformersLLM:
    """A causal LM run by transformers on the CPU, greedy decoding, fp32.

    ``path``: a checkpoint folder, or a ``.gguf`` file (de-quantized at every load: slow; prefer
    converting once as ``prepare_models`` does). ``threads``: torch intra-op threads, a process-wide
    setting. The weights are shared read-only by all units; each call keeps its own KV cache.
    Function tools are offered in the system prompt (``tools_prompt``).
    """

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
        sink = _ToolCallCatcher(on_text, on_function_call) if tools else None

        class _Stream(TextStreamer):
            def on_finalized_text(self, text, stream_end=False):
                if text:
                    (sink.text if sink else on_text)(text)

        class _Stop(StoppingCriteria):
            def __call__(self, input_ids, scores, **kwargs):
                return should_stop()

        messages = flatten_tool_messages(request.messages)
        if tools:
            messages[0] = {**messages[0], "content": messages[0]["content"] + tools_prompt(tools)}
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
    passed as chat-completions function tools; streamed tool calls are assembled by index.
    """

    def __init__(self, base_url, api_key, model):
        import openai

        self.client = openai.OpenAI(base_url=base_url, api_key=api_key or "unused", max_retries=1)
        self.model = model

    def generate(self, request, on_text, should_stop, on_function_call=None):
        extra = {}
        tools = request.offered_tools() if on_function_call else []
        if tools:
            extra["tools"] = [{"type": "function", "function": {
                "name": t["name"], "description": t.get("description", ""),
                "parameters": t.get("parameters") or {"type": "object", "properties": {}}}} for t in tools]
            choice = request.tool_choice
            extra["tool_choice"] = ({"type": "function", "function": {"name": choice["name"]}}
                                    if isinstance(choice, dict) else choice)
        stream = self.client.chat.completions.create(
            model=self.model, messages=request.messages, stream=True,
            max_tokens=request.max_output_tokens, stream_options={"include_usage": True}, **extra,
        )
        usage = {"input_tokens": 0, "output_tokens": 0}
        calls = {}  # index -> {"id", "name", "arguments"}
        with stream:
            for chunk in stream:
                if chunk.usage:
                    usage = {"input_tokens": chunk.usage.prompt_tokens,
                             "output_tokens": chunk.usage.completion_tokens}
                for choice in chunk.choices:
                    delta = choice.delta
                    if delta and delta.content:
                        on_text(delta.content)
                    for call in (delta.tool_calls or []) if delta else []:
                        entry = calls.setdefault(call.index, {"id": None, "name": "", "arguments": ""})
                        entry["id"] = call.id or entry["id"]
                        if call.function:
                            entry["name"] += call.function.name or ""
                            entry["arguments"] += call.function.arguments or ""
                if should_stop():
                    break
        for index in sorted(calls):
            call = calls[index]
            on_function_call(call["name"], call["arguments"] or "{}", call["id"])
        return usage

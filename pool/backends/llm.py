"""The LLM stage's models: a local transformers checkpoint, or an OpenAI-compatible endpoint.

Both take the same request and stream text through a callback, so the LLM stage does not care
which one runs. ``messages`` are chat-completions messages (``{"role", "content"}``).
"""

import logging
import threading
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


def load_llm(config, default_path):
    """The LLM backend the settings ask for: an endpoint by ``LLM_BASE_URL``, else a local model."""
    if config["LLM_BASE_URL"]:
        return OpenAICompatibleLLM(config["LLM_BASE_URL"], config["LLM_API_KEY"], config["LLM_API_MODEL"])
    return TransformersLLM(config["LLM_MODEL"] or default_path, config["THREADS"]["llm"])


class TransformersLLM:
    """A causal LM run by transformers on the CPU, greedy decoding, fp32.

    ``path``: a checkpoint folder, or a ``.gguf`` file (de-quantized at every load: slow; prefer
    converting once as ``prepare_models`` does). ``threads``: torch intra-op threads, a process-wide
    setting. The weights are shared read-only by all units; each call keeps its own KV cache.
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

    def generate(self, request, on_text, should_stop):
        from transformers import StoppingCriteria, StoppingCriteriaList, TextStreamer

        class _Stream(TextStreamer):
            def on_finalized_text(self, text, stream_end=False):
                if text:
                    on_text(text)

        class _Stop(StoppingCriteria):
            def __call__(self, input_ids, scores, **kwargs):
                return should_stop()

        inputs = self.tokenizer.apply_chat_template(
            request.messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
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
        return {"input_tokens": prompt_tokens, "output_tokens": output.shape[1] - prompt_tokens}


class OpenAICompatibleLLM:
    """Chat completions from a server that speaks OpenAI's API (vLLM, llama.cpp, Ollama).

    ``base_url`` like ``http://127.0.0.1:11434/v1``; ``model`` the server's model name.
    """

    def __init__(self, base_url, api_key, model):
        import openai

        self.client = openai.OpenAI(base_url=base_url, api_key=api_key or "unused", max_retries=1)
        self.model = model
        self._lock = threading.Lock()

    def generate(self, request, on_text, should_stop):
        stream = self.client.chat.completions.create(
            model=self.model, messages=request.messages, stream=True,
            max_tokens=request.max_output_tokens, stream_options={"include_usage": True},
        )
        usage = {"input_tokens": 0, "output_tokens": 0}
        with stream:
            for chunk in stream:
                if chunk.usage:
                    usage = {"input_tokens": chunk.usage.prompt_tokens,
                             "output_tokens": chunk.usage.completion_tokens}
                for choice in chunk.choices:
                    if choice.delta and choice.delta.content:
                        on_text(choice.delta.content)
                if should_stop():
                    break
        return usage

"""LLM: vLLM's offline API. Every call runs its whole list as one continuous batch."""

from __future__ import annotations

import dataclasses
import random
from typing import Any, Optional, Sequence, Union

from . import _vesper
from .lora_request import LoRARequest
from .outputs import RequestOutput, _final_output
from .sampling_params import SamplingParams

# vLLM engine arguments that describe a setup Vesper has by construction: accepted when they
# ask for that setup (so vLLM scripts run unchanged), refused otherwise.
_FIXED_ARGS = {"tensor_parallel_size": 1, "pipeline_parallel_size": 1, "dtype": "auto"}
# vLLM engine arguments with nothing to do here: no remote code (GGUF files only), no CUDA
# graphs to turn off, statistics are always counted.
_NO_OP_ARGS = ("trust_remote_code", "enforce_eager", "disable_log_stats")


def _engine_setup(model: Any, engine_args: dict) -> tuple:
    """What LLM and AsyncLLM do with their arguments: the model checked, vLLM's `seed` taken
    out (_RequestSeeds), and the engine arguments the extension takes."""
    if not isinstance(model, str):
        raise TypeError(f"model must be a str (a GGUF file), got {type(model).__name__}")
    seeds = _RequestSeeds(engine_args.pop("seed", None))
    return seeds, _engine_args(engine_args)


def _engine_args(engine_args: dict) -> dict:
    out = {}
    for key, value in engine_args.items():
        if key in _FIXED_ARGS:
            if value != _FIXED_ARGS[key]:
                raise ValueError(
                    f"{key}={value!r} is not supported: the Python package runs one process on "
                    f"the weights as the model file stores them ({key}={_FIXED_ARGS[key]!r}); "
                    f"split a model across processes with `mpirun -n N vesper serve MODEL -tp N` "
                    f"and call it with an OpenAI client")
        elif key not in _NO_OP_ARGS:
            out[key] = value
    return out


class _RequestSeeds:
    """vLLM's engine argument `seed`: the seeds of requests whose SamplingParams set none, drawn
    in order from one generator seeded with it, so that a script gives the same samples run after
    run. Without it (None) such requests draw from the engine's random seeds."""

    def __init__(self, seed: Any) -> None:
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
            raise TypeError(f"seed must be an int or None, got {type(seed).__name__}")
        self._rng = None if seed is None else random.Random(seed)

    def complete(self, params: SamplingParams) -> SamplingParams:
        if self._rng is None or params.seed is not None:
            return params
        return dataclasses.replace(params, seed=self._rng.getrandbits(63))


def _prompt_list(prompts: Any) -> list:
    """One prompt or a list of them: str, a list of token ids, a {"prompt"} or
    {"prompt_token_ids"} dict."""
    if isinstance(prompts, (str, dict)):
        return [prompts]
    if isinstance(prompts, (list, tuple)):
        if prompts and all(isinstance(t, int) and not isinstance(t, bool) for t in prompts):
            return [list(prompts)]  # one prompt of token ids
        return list(prompts)
    raise TypeError(
        "prompts must be a str, a list of token ids, a prompt dict or a list of these, got "
        f"{type(prompts).__name__}")


def _per_prompt(value: Any, n: int, name: str) -> list:
    if isinstance(value, (list, tuple)):
        if len(value) != n:
            raise ValueError(f"{name} has {len(value)} items for {n} prompts")
        return list(value)
    return [value] * n


def _lora_pairs(lora_request: Any, n: int) -> list:
    requests = _per_prompt(lora_request, n, "lora_request")
    pairs = []
    for i, r in enumerate(requests):
        if r is not None and not isinstance(r, LoRARequest):
            raise TypeError(f"lora_request[{i}] must be a LoRARequest or None, got {type(r).__name__}")
        pairs.append(None if r is None else r._pair())
    return requests, pairs


class LLM:
    """An engine for offline inference: `LLM(model, **engine_args)`.

    `model` is a GGUF file. Engine arguments take vLLM's names (max_model_len, max_num_seqs,
    max_num_batched_tokens, block_size, kv_cache_dtype, enable_prefix_caching,
    speculative_config, enable_lora, max_loras, ...) and Vesper's (threads, kv_cache_memory):
    every flag of `vesper generate` with dashes written as underscores (vesper.ENGINE_ARGS).
    `seed` (vLLM's): requests whose SamplingParams have no seed get seeds drawn from it in order,
    so a script samples the same run after run; unset, they are random.
    """

    def __init__(self, model: str, **engine_args: Any) -> None:
        self._seeds, args = _engine_setup(model, engine_args)
        self.model = model
        self._engine = _vesper.LlmEngine(model, args)
        self._tokenizer = _Tokenizer(self._engine)

    def get_tokenizer(self) -> "_Tokenizer":
        return self._tokenizer

    def generate(
        self,
        prompts: Any,
        sampling_params: Optional[Union[SamplingParams, Sequence[SamplingParams]]] = None,
        use_tqdm: bool = True,
        lora_request: Optional[Union[LoRARequest, Sequence[Optional[LoRARequest]]]] = None,
        priority: Optional[Sequence[int]] = None,
    ) -> list:
        """Generates for every prompt, as one continuous batch, and returns a RequestOutput per
        prompt in input order. A progress bar is shown on a terminal (use_tqdm). Ctrl-C aborts
        the call's requests and raises KeyboardInterrupt."""
        prompt_list = _prompt_list(prompts)
        return self._run(prompt_list, [_prompt_text(p) for p in prompt_list], sampling_params,
                         use_tqdm, lora_request, priority)

    def chat(
        self,
        messages: Any,
        sampling_params: Optional[Union[SamplingParams, Sequence[SamplingParams]]] = None,
        use_tqdm: bool = True,
        lora_request: Optional[Union[LoRARequest, Sequence[Optional[LoRARequest]]]] = None,
        chat_template: Optional[str] = None,
        add_generation_prompt: bool = True,
        tools: Optional[list] = None,
        chat_template_kwargs: Optional[dict] = None,
    ) -> list:
        """Renders each conversation (a list of {"role", "content"} messages, or a list of such
        lists) with the chat template (the model's, or `chat_template`), offering `tools` to
        it, and generates as generate() does. The output is the model's text (tool calls in it
        are not parsed, as in vLLM's LLM.chat)."""
        if isinstance(messages, (list, tuple)) and messages and isinstance(messages[0], (list, tuple)):
            conversations = list(messages)
        else:
            conversations = [messages]
        rendered = [
            self._engine.render_chat(c, tools, add_generation_prompt, chat_template,
                                     chat_template_kwargs)
            for c in conversations
        ]
        prompts = [self._engine.chat_prompt_ids(text) for text in rendered]
        return self._run(prompts, rendered, sampling_params, use_tqdm, lora_request, None)

    def _run(self, prompts: list, texts: list, sampling_params: Any, use_tqdm: bool,
             lora_request: Any, priority: Any) -> list:
        n = len(prompts)
        if sampling_params is None:
            sampling_params = SamplingParams()
        params = _per_prompt(sampling_params, n, "sampling_params")
        for i, p in enumerate(params):
            if not isinstance(p, SamplingParams):
                raise TypeError(
                    f"sampling_params[{i}] must be a SamplingParams, got {type(p).__name__}")
        params = [self._seeds.complete(p) for p in params]
        loras, pairs = _lora_pairs(lora_request, n)
        priorities = [0] * n if priority is None else _per_prompt(priority, n, "priority")
        if not isinstance(use_tqdm, bool):
            raise TypeError(f"use_tqdm must be a bool, got {type(use_tqdm).__name__}")
        if n == 0:
            return []
        raw = self._engine.generate(prompts, params, pairs, priorities, use_tqdm)
        return [
            _final_output(r, str(i), texts[i], params[i].logprobs is not None, loras[i])
            for i, r in enumerate(raw)
        ]

    def stats(self) -> dict:
        """The engine's counters (Vesper's): KV blocks in use, tokens, steps, prefix-cache and
        speculation counters."""
        return self._engine.stats()


def _prompt_text(prompt: Any) -> Optional[str]:
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, dict) and isinstance(prompt.get("prompt"), str):
        return prompt["prompt"]
    return None


class _Tokenizer:
    """The model's tokenizer, for the calls vLLM users make on llm.get_tokenizer()."""

    def __init__(self, engine: Any) -> None:
        self._engine = engine

    def encode(self, text: str, add_special_tokens: bool = True) -> list:
        return self._engine.encode(text, add_special_tokens)

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self._engine.decode(list(token_ids), skip_special_tokens)

    @property
    def vocab_size(self) -> int:
        return self._engine.vocab_size

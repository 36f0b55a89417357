"""vesper.LLM: greedy output equal to `vesper generate` (and llama.cpp), vLLM's output shape,
n > 1, seeds, logprobs, stops, structured output, chat, and Ctrl-C."""

import json
import math
import os
import re
import signal
import threading

import pytest

from conftest import ENGINE_ARGS, MODELS, STORIES, run_generate_json
from vesper import (LLM, CompletionOutput, GuidedDecodingParams, RequestOutput, SamplingParams,
                    StructuredOutputsParams)

GREEDY = SamplingParams(temperature=0, max_tokens=32)


def assert_no_blocks_held(llm):
    stats = llm.stats()
    assert stats["num_requests"] == 0, stats
    # Cached prefixes nobody references are not in use (they are evictable).
    assert stats["kv_blocks_used"] == 0, stats


def test_greedy_equals_vesper_generate_and_llama_cpp(llm, expected):
    prompts = [r["prompt"] for r in expected]
    outs = llm.generate(prompts, GREEDY, use_tqdm=False)
    cli = run_generate_json([STORIES, "--temperature", "0", "--max-tokens", "32",
                             "--max-model-len", "128"] +
                            [a for p in prompts for a in ("--prompt", p)])
    assert len(outs) == len(prompts) == len(cli)
    for out, ref, line in zip(outs, expected, cli):
        assert isinstance(out, RequestOutput) and out.finished
        assert out.prompt == ref["prompt"]
        assert out.prompt_token_ids == ref["prompt_ids"] == line["prompt_token_ids"]
        c = out.outputs[0]
        assert isinstance(c, CompletionOutput)
        assert c.token_ids == line["token_ids"]
        assert c.token_ids == ref["ids"][:32]
        assert c.text == line["text"]
        assert c.finish_reason == "length" and c.stop_reason is None
        assert c.cumulative_logprob is None and c.logprobs is None
        m = out.metrics
        assert m.arrival_time <= m.first_token_time <= m.finished_time
    assert_no_blocks_held(llm)


def test_a_hugging_face_checkpoint_directory_is_a_model(llm, expected):
    # vLLM's usual input: LLM(model=checkpoint directory). Same weights as stories260K.gguf, so
    # the same greedy ids.
    hf = LLM(str(MODELS / "hf" / "stories260K"), **ENGINE_ARGS)
    prompts = [r["prompt"] for r in expected]
    for out, ref in zip(hf.generate(prompts, GREEDY, use_tqdm=False), expected):
        assert out.prompt_token_ids == ref["prompt_ids"]
        assert out.outputs[0].token_ids == ref["ids"][:32]


def test_token_id_prompts_and_prompt_dicts(llm, expected):
    ids = expected[0]["prompt_ids"]
    by_ids = llm.generate(ids, GREEDY, use_tqdm=False)  # one prompt of token ids
    both = llm.generate([{"prompt_token_ids": ids}, {"prompt": expected[0]["prompt"]}], GREEDY,
                        use_tqdm=False)
    assert by_ids[0].prompt is None
    assert by_ids[0].outputs[0].token_ids == both[0].outputs[0].token_ids
    assert both[1].outputs[0].token_ids == both[0].outputs[0].token_ids


def test_n_samples_and_seeds(llm):
    params = SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=20)
    a = llm.generate("Once upon a time", params, use_tqdm=False)[0]
    b = llm.generate("Once upon a time", params, use_tqdm=False)[0]
    assert [o.index for o in a.outputs] == [0, 1, 2]
    assert [o.token_ids for o in a.outputs] == [o.token_ids for o in b.outputs]
    assert len({tuple(o.token_ids) for o in a.outputs}) > 1  # the samples differ
    other = llm.generate("Once upon a time", SamplingParams(temperature=1.0, seed=8, max_tokens=20),
                         use_tqdm=False)[0]
    assert other.outputs[0].token_ids != a.outputs[0].token_ids


def test_per_prompt_sampling_params(llm):
    outs = llm.generate(["Once upon a time", "The little dog"],
                        [SamplingParams(temperature=0, max_tokens=4),
                         SamplingParams(temperature=0, max_tokens=9)], use_tqdm=False)
    assert [len(o.outputs[0].token_ids) for o in outs] == [4, 9]


def test_logprobs(llm):
    out = llm.generate("Once upon a time", SamplingParams(temperature=0, max_tokens=6, logprobs=3),
                       use_tqdm=False)[0].outputs[0]
    assert len(out.logprobs) == 6
    total = 0.0
    for token, entry in zip(out.token_ids, out.logprobs):
        assert next(iter(entry)) == token  # the sampled token first
        assert 3 <= len(entry) <= 4
        assert entry[token].rank == 1  # greedy picks the most likely
        ranked = sorted((lp.rank, lp.logprob) for t, lp in entry.items())
        assert [r for r, _ in ranked] == [1, 2, 3]
        assert all(x[1] >= y[1] for x, y in zip(ranked, ranked[1:]))
        assert all(lp.logprob <= 0 for lp in entry.values())
        total += entry[token].logprob
    assert math.isclose(out.cumulative_logprob, total, rel_tol=1e-6)


def test_stop_strings_and_stop_tokens(llm, expected):
    full = llm.generate("Once upon a time", GREEDY, use_tqdm=False)[0].outputs[0]
    assert "Lily" in full.text
    stopped = llm.generate("Once upon a time", SamplingParams(temperature=0, max_tokens=32,
                                                              stop=["Lily"]),
                           use_tqdm=False)[0].outputs[0]
    assert stopped.text == full.text[:full.text.index("Lily")]
    assert stopped.finish_reason == "stop" and stopped.stop_reason == "Lily"
    token = full.token_ids[3]
    by_token = llm.generate("Once upon a time", SamplingParams(temperature=0, max_tokens=32,
                                                               stop_token_ids=[token]),
                            use_tqdm=False)[0].outputs[0]
    assert by_token.token_ids == full.token_ids[:4]
    assert by_token.finish_reason == "stop" and by_token.stop_reason == token


def test_structured_outputs(llm):
    choice = llm.generate("Once upon a time", SamplingParams(
        temperature=0.8, seed=1, max_tokens=10,
        structured_outputs=StructuredOutputsParams(choice=["dog", "cat"])), use_tqdm=False)
    assert choice[0].outputs[0].text in ("dog", "cat")
    regex = llm.generate("The little dog", SamplingParams(
        temperature=0.8, seed=2, max_tokens=10,
        guided_decoding=GuidedDecodingParams(regex="[0-9]{3}")), use_tqdm=False)
    assert re.fullmatch("[0-9]{3}", regex[0].outputs[0].text)
    schema = {"type": "object", "properties": {"age": {"type": "integer"}}, "required": ["age"],
              "additionalProperties": False}
    out = llm.generate("Lily is", SamplingParams(
        temperature=0.8, seed=3, max_tokens=40,
        structured_outputs=StructuredOutputsParams(json=schema)), use_tqdm=False)[0].outputs[0]
    if out.finish_reason == "stop":
        assert isinstance(json.loads(out.text)["age"], int)
    else:  # cut by max_tokens: still a prefix of such an object
        assert out.text.startswith("{")


def test_chat_renders_the_template(llm):
    messages = [{"role": "user", "content": "Tell me a story"}]
    out = llm.chat(messages, SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)[0]
    # stories260K ships no template: the default ChatML one.
    assert out.prompt == "<|im_start|>user\nTell me a story<|im_end|>\n<|im_start|>assistant\n"
    same = llm.generate({"prompt_token_ids": out.prompt_token_ids},
                        SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)[0]
    assert same.outputs[0].token_ids == out.outputs[0].token_ids
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}]
    template = "{% for t in tools %}{{ t.function.name }};{% endfor %}{{ messages[0].content }}"
    with_tools = llm.chat(messages, SamplingParams(temperature=0, max_tokens=2), use_tqdm=False,
                          tools=tools, chat_template=template)[0]
    assert with_tools.prompt == "get_weather;Tell me a story"


def test_ctrl_c_aborts_the_call_and_the_engine_goes_on(llm):
    prompts = ["Once upon a time"] * 64
    params = SamplingParams(temperature=1.0, max_tokens=100, ignore_eos=True)
    timer = threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            for _ in range(50):  # long enough for the signal to land inside a call
                llm.generate(prompts, params, use_tqdm=False)
    finally:
        timer.cancel()
    assert_no_blocks_held(llm)
    again = llm.generate("Once upon a time", GREEDY, use_tqdm=False)[0]
    assert len(again.outputs[0].token_ids) == 32


def test_engine_arguments_reach_the_engine():
    small = LLM(STORIES, max_model_len=64, block_size=32, enable_prefix_caching=False,
                kv_cache_memory="1M", threads=1, tensor_parallel_size=1, trust_remote_code=True)
    out = small.generate("Once upon a time", SamplingParams(temperature=0, max_tokens=None),
                         use_tqdm=False)[0]
    # max_tokens=None: the rest of the 64-token context.
    assert len(out.prompt_token_ids) + len(out.outputs[0].token_ids) == 64
    assert small.stats()["prefix_cache_queries"] == 0


def test_engine_seed_makes_unseeded_requests_repeat():
    # vLLM's engine argument: requests without a seed draw theirs from it, in order.
    params = SamplingParams(temperature=1.0, max_tokens=16)
    runs = []
    for _ in range(2):
        seeded = LLM(STORIES, seed=11, **ENGINE_ARGS)
        runs.append([o.outputs[0].token_ids
                     for o in seeded.generate(["Once upon a time"] * 4, params, use_tqdm=False)])
    assert runs[0] == runs[1]
    assert len({tuple(ids) for ids in runs[0]}) > 1  # one seed per request, not one for all


def test_kv_sparsity_per_request():
    # A 4 + 16 window changes 100 greedy tokens; SamplingParams(kv_sparsity="none") opts a request
    # out: the engine without a window gives the same ids. A bad value names the field.
    params = SamplingParams(temperature=0, max_tokens=100, ignore_eos=True)
    windowed = LLM(STORIES, kv_window=16, kv_sink_tokens=4, **ENGINE_ARGS)
    dense = LLM(STORIES, **ENGINE_ARGS)
    want = dense.generate("Once upon a time", params, use_tqdm=False)[0].outputs[0].token_ids
    got = windowed.generate("Once upon a time", params, use_tqdm=False)[0].outputs[0].token_ids
    assert got != want
    params.kv_sparsity = "none"
    out = windowed.generate("Once upon a time", params, use_tqdm=False)[0].outputs[0].token_ids
    assert out == want
    with pytest.raises(ValueError, match="kv_sparsity"):
        SamplingParams(kv_sparsity="sparse")

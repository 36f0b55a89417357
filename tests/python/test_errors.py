"""Bad arguments raise TypeError or ValueError naming the field; nothing crashes."""

import pytest

from conftest import STORIES
from vesper import LLM, SamplingParams, StructuredOutputsParams


@pytest.mark.parametrize("kwargs, error, words", [
    (dict(temperature=-1), ValueError, "temperature"),
    (dict(top_p=0), ValueError, "top_p"),
    (dict(top_k="5"), TypeError, "SamplingParams.top_k"),
    (dict(n=0), ValueError, "n must be"),
    (dict(max_tokens=-2), ValueError, "max_tokens"),
    (dict(min_tokens=10, max_tokens=5), ValueError, "min_tokens"),
    (dict(stop=[""]), ValueError, "stop"),
    (dict(stop=5), TypeError, "SamplingParams.stop"),
    (dict(seed=1.5), TypeError, "SamplingParams.seed"),
    (dict(logprobs=50), ValueError, "logprobs"),
    (dict(prompt_logprobs=1), ValueError, "prompt_logprobs"),
    (dict(logit_bias={3: 500}), ValueError, "logit_bias"),
    (dict(logit_bias={"a": 1}), TypeError, "logit_bias"),
    (dict(ignore_eos=1), TypeError, "ignore_eos"),
    (dict(best_of=3), ValueError, "best_of"),
    (dict(structured_outputs=StructuredOutputsParams(regex="(")), ValueError,
     "structured_outputs.regex"),
    (dict(structured_outputs=StructuredOutputsParams(choice=["a"], regex="b")), ValueError,
     "both constrain"),
    (dict(structured_outputs=StructuredOutputsParams(json={"type": "object", "x-bad": {1}})),
     TypeError, "structured_outputs.json"),
])
def test_bad_sampling_params(kwargs, error, words):
    with pytest.raises(error, match=words):
        SamplingParams(**kwargs)


@pytest.mark.parametrize("kwargs, error, words", [
    (dict(max_model_len=0), ValueError, "max_model_len"),
    (dict(block_size=7), ValueError, "block_size"),
    (dict(max_num_seqs="many"), TypeError, "max_num_seqs"),
    (dict(kv_cache_dtype="fp3"), ValueError, "kv_cache_dtype"),
    (dict(kv_cache_memory="lots"), ValueError, "kv_cache_memory"),
    (dict(no_such_argument=1), TypeError, "no_such_argument"),
    (dict(speculative_config={"method": "medusa2"}), ValueError, "speculative_config"),
    (dict(tensor_parallel_size=2), ValueError, "tensor_parallel_size"),
    (dict(pipeline_parallel_size=2), ValueError, "pipeline_parallel_size"),
    (dict(enable_prefix_caching="yes"), TypeError, "enable_prefix_caching"),
    (dict(seed="7"), TypeError, "seed"),
])
def test_bad_engine_arguments(kwargs, error, words):
    with pytest.raises(error, match=words):
        LLM(STORIES, **kwargs)


def test_bad_model_file():
    with pytest.raises(ValueError, match="nonexistent.gguf"):
        LLM("/nonexistent.gguf")


def test_bad_generate_arguments(llm):
    greedy = SamplingParams(temperature=0, max_tokens=4)
    cases = [
        (lambda: llm.generate(5, greedy), TypeError, "prompts"),
        (lambda: llm.generate([[1, 2], 3], greedy), TypeError, r"prompts\[1\]"),
        (lambda: llm.generate([[1, 99999]], greedy), ValueError, r"prompts\[0\]\[1\]"),
        (lambda: llm.generate([[]], greedy), ValueError, "empty"),
        (lambda: llm.generate([{"text": "x"}], greedy), ValueError, "text"),
        (lambda: llm.generate(["a", "b"], [greedy]), ValueError, "sampling_params"),
        (lambda: llm.generate(["a"], "greedy"), TypeError, "sampling_params"),
        (lambda: llm.generate(["a"], SamplingParams(stop_token_ids=[4096])), ValueError,
         "stop_token_ids"),
        (lambda: llm.generate(["a" * 2000], greedy), ValueError, "max_model_len"),
        (lambda: llm.chat([{"role": "wizard", "content": "x"}], greedy), ValueError,
         r"messages\[0\]\.role"),
        (lambda: llm.chat([{"role": "user"}], greedy), ValueError, "content"),
        (lambda: llm.chat([{"role": "user", "content": "x"}], greedy, chat_template="{% if %}"),
         ValueError, "chat_template"),
        (lambda: llm.chat([{"role": "user", "content": "x"}], greedy, tools=[{"type": "x"}]),
         ValueError, "tools"),
    ]
    for call, error, words in cases:
        with pytest.raises(error, match=words):
            call()
    # A field changed after construction is checked again when used.
    p = SamplingParams()
    p.temperature = "hot"
    with pytest.raises(TypeError, match="SamplingParams.temperature"):
        llm.generate("a", p)
    assert llm.stats()["num_requests"] == 0

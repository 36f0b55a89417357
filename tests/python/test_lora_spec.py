"""LoRA requests and speculative decoding through vesper.LLM, checked against `vesper generate`
and against the plain engine's greedy output."""

import json

import pytest

from conftest import BIM, ENGINE_ARGS, STORIES, ZED, run_generate_json
from vesper import LLM, LoRARequest, SamplingParams

PROMPTS = ["Once upon a time", "One day, a little girl named", "The little dog"]
GREEDY = SamplingParams(temperature=0, max_tokens=24)


@pytest.fixture(scope="module")
def lora_llm():
    return LLM(STORIES, enable_lora=True, max_loras=2, **ENGINE_ARGS)


def test_lora_requests_equal_vesper_generate(lora_llm, tmp_path):
    zed, bim = LoRARequest("zed", 1, ZED), LoRARequest("bim", 2, BIM)
    loras = [zed, bim, None]
    outs = lora_llm.generate(PROMPTS, GREEDY, use_tqdm=False, lora_request=loras)
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text("".join(json.dumps({"prompt": p, "model": m}) + "\n"
                            for p, m in zip(PROMPTS, ["zed", "bim", "stories260K"])))
    cli = run_generate_json([STORIES, "--enable-lora", "--max-loras", "2", "--lora-modules",
                             f"zed={ZED}", f"bim={BIM}", "--temperature", "0", "--max-tokens",
                             "24", "--max-model-len", "128", "--prompts-file", str(jobs)])
    assert [o.outputs[0].token_ids for o in outs] == [line["token_ids"] for line in cli]
    assert outs[0].lora_request is zed and outs[2].lora_request is None
    base = lora_llm.generate(PROMPTS[0], GREEDY, use_tqdm=False)[0]
    assert base.outputs[0].token_ids != outs[0].outputs[0].token_ids
    assert "Zed" in outs[0].outputs[0].text  # the adapter renames the stories' heroes
    # A second call reuses the registration.
    again = lora_llm.generate(PROMPTS[0], GREEDY, use_tqdm=False, lora_request=zed)[0]
    assert again.outputs[0].token_ids == outs[0].outputs[0].token_ids
    assert lora_llm.stats()["num_requests"] == 0


def test_lora_errors_name_the_request(lora_llm, llm):
    with pytest.raises(ValueError, match="enable_lora"):
        llm.generate("Once", GREEDY, use_tqdm=False, lora_request=LoRARequest("zed", 1, ZED))
    with pytest.raises(ValueError, match="'nope'"):
        lora_llm.generate("Once", GREEDY, use_tqdm=False,
                          lora_request=LoRARequest("nope", 3, "/nonexistent/adapter.gguf"))
    with pytest.raises(TypeError, match="lora_request"):
        lora_llm.generate("Once", GREEDY, use_tqdm=False, lora_request="zed")


def test_speculative_config_keeps_greedy_output(llm):
    spec = LLM(STORIES, speculative_config={"method": "ngram", "num_speculative_tokens": 3,
                                            "prompt_lookup_max": 3}, **ENGINE_ARGS)
    params = SamplingParams(temperature=0, max_tokens=48)
    plain = llm.generate(PROMPTS, params, use_tqdm=False)
    fast = spec.generate(PROMPTS, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in fast] == [o.outputs[0].token_ids for o in plain]
    assert spec.stats()["spec_num_draft_tokens"] > 0

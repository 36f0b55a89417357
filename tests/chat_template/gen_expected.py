#!/usr/bin/env python3
"""Regenerates the expected outputs of the chat template cases (cases.json) with Python's
jinja2, set up the way HF transformers' apply_chat_template sets it up
(transformers/utils/chat_template_utils.py): an ImmutableSandboxedEnvironment with
trim_blocks, lstrip_blocks and loop controls, tojson as json.dumps(ensure_ascii=False),
raise_exception() and strftime_now(). The C++ engine must reproduce these bytes exactly.

Also checks the outputs against the ones llama.cpp's tests/test-chat-template.cpp publishes
for the same templates and conversation, so the oracle itself is checked, and checks every
engine feature case of engine_cases.json (template, variables, expected output; an expected
output starting with '!' means the render must fail) against jinja2.

Usage (from the repository root): python3 tests/chat_template/gen_expected.py
Needs: python3 with jinja2 >= 3.1. Not run by the build or the tests.
"""
import json
import os
from datetime import datetime

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))
FIXED_NOW = datetime(2024, 7, 26, 12, 30, 0)  # the tests pass the same date to strftime_now


def make_env():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(fmt):
        return FIXED_NOW.strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


# llama.cpp's published outputs for its fixed conversation ("basic"), add_generation_prompt on.
LLAMA_CPP_REFERENCE = {
    "chatml.basic": "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\nHi there<|im_end|>\n<|im_start|>user\nWho are you<|im_end|>\n<|im_start|>assistant\n   I am an assistant   <|im_end|>\n<|im_start|>user\nAnother question<|im_end|>\n<|im_start|>assistant\n",
    "mistral-v1.basic": " [INST] You are a helpful assistant\n\nHello [/INST] Hi there</s> [INST] Who are you [/INST]    I am an assistant   </s> [INST] Another question [/INST]",
    "mistral-v7.basic": "[SYSTEM_PROMPT] You are a helpful assistant[/SYSTEM_PROMPT][INST] Hello[/INST] Hi there</s>[INST] Who are you[/INST]    I am an assistant   </s>[INST] Another question[/INST]",
    "phi-3-small.basic": "<|system|>\nYou are a helpful assistant<|end|>\n<|user|>\nHello<|end|>\n<|assistant|>\nHi there<|end|>\n<|user|>\nWho are you<|end|>\n<|assistant|>\n   I am an assistant   <|end|>\n<|user|>\nAnother question<|end|>\n<|assistant|>\n",
    "phi-4.basic": "<|im_start|>system<|im_sep|>You are a helpful assistant<|im_end|><|im_start|>user<|im_sep|>Hello<|im_end|><|im_start|>assistant<|im_sep|>Hi there<|im_end|><|im_start|>user<|im_sep|>Who are you<|im_end|><|im_start|>assistant<|im_sep|>   I am an assistant   <|im_end|><|im_start|>user<|im_sep|>Another question<|im_end|><|im_start|>assistant<|im_sep|>",
    "deepseek-llm-chat.basic": "You are a helpful assistant\n\nUser: Hello\n\nAssistant: Hi there<｜end▁of▁sentence｜>User: Who are you\n\nAssistant:    I am an assistant   <｜end▁of▁sentence｜>User: Another question\n\nAssistant:",
    "command-r-plus.basic": "<BOS_TOKEN><|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>You are a helpful assistant<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|USER_TOKEN|>Hello<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>Hi there<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|USER_TOKEN|>Who are you<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>I am an assistant<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|USER_TOKEN|>Another question<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>",
    "vicuna.basic": "You are a helpful assistant\n\nUSER: Hello\nASSISTANT: Hi there</s>\nUSER: Who are you\nASSISTANT:    I am an assistant   </s>\nUSER: Another question\nASSISTANT:",
    "vigogne-2-chat.basic": "[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello [/INST] Hi there </s>[INST] Who are you [/INST] I am an assistant </s>[INST] Another question [/INST]",
    "fusionnet-smaug.basic": "[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello [/INST] Hi there </s><s>[INST] Who are you [/INST]    I am an assistant    </s><s>[INST] Another question [/INST]",
    "granite-3.0.basic": "<|start_of_role|>system<|end_of_role|>You are a helpful assistant<|end_of_text|>\n<|start_of_role|>user<|end_of_role|>Hello<|end_of_text|>\n<|start_of_role|>assistant<|end_of_role|>Hi there<|end_of_text|>\n<|start_of_role|>user<|end_of_role|>Who are you<|end_of_text|>\n<|start_of_role|>assistant<|end_of_role|>   I am an assistant   <|end_of_text|>\n<|start_of_role|>user<|end_of_role|>Another question<|end_of_text|>\n<|start_of_role|>assistant<|end_of_role|>",
    "chatglm3.basic": "[gMASK]sop<|system|>\n You are a helpful assistant<|user|>\n Hello<|assistant|>\n Hi there<|user|>\n Who are you<|assistant|>\n    I am an assistant   <|user|>\n Another question<|assistant|>",
    "minicpm.basic": "You are a helpful assistant<用户>Hello<AI>Hi there<用户>Who are you<AI>I am an assistant<用户>Another question<AI>",
    "ling-lite.basic": "<role>SYSTEM</role>You are a helpful assistant<role>HUMAN</role>Hello<role>ASSISTANT</role>Hi there<role>HUMAN</role>Who are you<role>ASSISTANT</role>   I am an assistant   <role>HUMAN</role>Another question<role>ASSISTANT</role>",
    "seed-oss.basic": "<seed:bos>system\nYou are a helpful assistant<seed:eos><seed:bos>user\nHello<seed:eos><seed:bos>assistant\nHi there<seed:eos><seed:bos>user\nWho are you<seed:eos><seed:bos>assistant\nI am an assistant<seed:eos><seed:bos>user\nAnother question<seed:eos><seed:bos>assistant\n",
    "megrez-3b.basic": "<|role_start|>system<|role_end|>You are a helpful assistant<|turn_end|><|role_start|>user<|role_end|>Hello<|turn_end|><|role_start|>assistant<|role_end|>Hi there<|turn_end|><|role_start|>user<|role_end|>Who are you<|turn_end|><|role_start|>assistant<|role_end|>   I am an assistant   <|turn_end|><|role_start|>user<|role_end|>Another question<|turn_end|><|role_start|>assistant<|role_end|>",
    "gigachat-20b.basic": "<s>You are a helpful assistant<|message_sep|>user<|role_sep|>Hello<|message_sep|>available functions<|role_sep|>[]<|message_sep|>assistant<|role_sep|>Hi there<|message_sep|>user<|role_sep|>Who are you<|message_sep|>available functions<|role_sep|>[]<|message_sep|>assistant<|role_sep|>   I am an assistant   <|message_sep|>user<|role_sep|>Another question<|message_sep|>available functions<|role_sep|>[]<|message_sep|>assistant<|role_sep|>",
}


def verify_engine_cases(env):
    groups = json.load(open(os.path.join(HERE, "engine_cases.json"), encoding="utf-8"))
    failures = 0
    for group, cases in groups.items():
        for source, variables, expected in cases:
            try:
                out = env.from_string(source).render(**variables)
            except Exception as e:  # noqa: BLE001 - any jinja2 failure is a failure
                out = "!" + type(e).__name__ + ": " + str(e)
            ok = out.startswith("!") if expected.startswith("!") else out == expected
            if not ok:
                failures += 1
                print("MISMATCH", group, repr(source), "expected", repr(expected), "jinja2", repr(out))
    assert failures == 0, f"{failures} engine cases disagree with jinja2"
    print("engine cases agree with jinja2:", sum(len(c) for c in groups.values()))


def main():
    data = json.load(open(os.path.join(HERE, "conversations.json"), encoding="utf-8"))
    cases = json.load(open(os.path.join(HERE, "cases.json"), encoding="utf-8"))
    env = make_env()
    for case in cases:
        source = open(os.path.join(HERE, "templates", case["template"] + ".jinja"), encoding="utf-8").read()
        context = {"tools": None, "documents": None}
        for key, value in case.get("extra", {}).items():
            context[key] = data["tools"] if value == "$tools" else value
        context["messages"] = data["conversations"][case["conversation"]]
        context["add_generation_prompt"] = case["add_generation_prompt"]
        context["bos_token"] = case["bos_token"]
        context["eos_token"] = case["eos_token"]
        path = os.path.join(HERE, "templates", case["name"] + ".expected")
        try:
            out = env.from_string(source).render(**context)
        except jinja2.exceptions.TemplateError as e:
            assert "error" in case and case["error"] in str(e), (case["name"], str(e))
            if os.path.exists(path):
                os.remove(path)
            continue
        assert "error" not in case, case["name"] + " was expected to fail"
        reference = LLAMA_CPP_REFERENCE.get(case["name"])
        assert reference is None or reference == out, (case["name"], out)
        with open(path, "w", encoding="utf-8", newline="") as f:
            f.write(out)
    print("wrote expected outputs for", len(cases), "cases")
    verify_engine_cases(env)


if __name__ == "__main__":
    main()

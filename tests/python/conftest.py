"""Shared fixtures of the Python package's tests. They run from the repository root (ctest sets
the directory; the models are found by relative path, as the other suites find them), with
PYTHONPATH pointing at the build tree's package (<build>/python)."""

import json
import os
import pathlib
import subprocess

import pytest

import vesper

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODELS = ROOT.parent / "shared" / "models"
STORIES = str(MODELS / "stories260K.gguf")
ZED = str(MODELS / "lora" / "zed" / "adapter.gguf")
BIM = str(MODELS / "lora" / "bim" / "adapter.gguf")
# stories260K's context is 128 tokens; 16 sequences keep the KV cache (and its start) small.
ENGINE_ARGS = dict(max_model_len=128, max_num_seqs=16, threads=2)


def vesper_binary() -> str:
    """The CLI built beside the package: VESPER_BINARY (ctest sets it), else <build>/bin/vesper
    for the <build>/python/vesper the tests import."""
    if os.environ.get("VESPER_BINARY"):
        return os.environ["VESPER_BINARY"]
    return str(pathlib.Path(vesper.__file__).resolve().parents[2] / "bin" / "vesper")


def run_generate_json(args: list) -> list:
    """`vesper generate ... --json`: one dict per prompt."""
    r = subprocess.run([vesper_binary(), "generate", *args, "--json"], capture_output=True,
                       text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    return [json.loads(line) for line in r.stdout.splitlines() if line.strip()]


@pytest.fixture(scope="session")
def expected():
    """llama.cpp's greedy ids for the repository's stories260K prompts."""
    with open(ROOT / "bench" / "llamacpp" / "expected_stories260K.json") as f:
        return json.load(f)["results"]


@pytest.fixture(scope="session")
def llm():
    """One engine for the whole run (each test's requests leave no blocks behind)."""
    return vesper.LLM(STORIES, **ENGINE_ARGS)

#!/usr/bin/env python3
"""LLM.generate against `vesper bench throughput` on the same load, and the package's import time
and first-call latency.

    PYTHONPATH=build/python python3 bench/python/throughput.py MODEL.gguf [--num-prompts 256]
        [--output-len 64] [--threads 2] [--repetitions 3] [--vesper build/bin/vesper]

Both sides run the same prompts (a JSONL dataset written here, which `bench throughput --dataset`
reads) with temperature 1, ignore_eos and exact output lengths, and time from queueing the
requests to the last output (engine creation excluded on both sides; the Python side includes
turning every output into vLLM's RequestOutput). Runs alternate between the two so that drift on
a shared machine hits both; the ratio is of the medians.
"""

import argparse
import json
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

t0 = time.perf_counter()
import vesper  # noqa: E402

IMPORT_S = time.perf_counter() - t0

STORY_STARTS = ["Once upon a time", "The little dog", "Lily and Ben went to the park",
                "One day, a cat named Tom", "Joe loves writing stories", "Hi how are you"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--num-prompts", type=int, default=256)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repetitions", type=int, default=3)
    ap.add_argument("--vesper", default=str(pathlib.Path(vesper.__file__).resolve().parents[2] /
                                            "bin" / "vesper"))
    args = ap.parse_args()

    prompts = [f"{STORY_STARTS[i % len(STORY_STARTS)]} {i}" for i in range(args.num_prompts)]
    dataset = tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False)
    for p in prompts:
        dataset.write(json.dumps({"prompt": p, "output_len": args.output_len}) + "\n")
    dataset.close()

    t = time.perf_counter()
    llm = vesper.LLM(args.model, threads=args.threads)
    create_s = time.perf_counter() - t
    first = vesper.SamplingParams(temperature=0, max_tokens=16)
    t = time.perf_counter()
    llm.generate("Once upon a time", first, use_tqdm=False)
    first_call_s = time.perf_counter() - t
    t = time.perf_counter()
    llm.generate("Once upon a time", first, use_tqdm=False)
    second_call_s = time.perf_counter() - t

    params = vesper.SamplingParams(temperature=1.0, seed=0, ignore_eos=True,
                                   max_tokens=args.output_len)
    py_s, cli_s = [], []
    for _ in range(args.repetitions):
        r = subprocess.run([args.vesper, "bench", "throughput", args.model, "--dataset",
                            dataset.name, "--num-prompts", str(args.num_prompts), "--output-len",
                            str(args.output_len), "--threads", str(args.threads), "--json"],
                           capture_output=True, text=True, check=True)
        cli_s.append(json.loads(r.stdout.strip().splitlines()[-1])["elapsed_s"])
        t = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        py_s.append(time.perf_counter() - t)
        assert all(len(o.outputs[0].token_ids) == args.output_len for o in outs)
    pathlib.Path(dataset.name).unlink()
    tokens = args.num_prompts * args.output_len
    py, cli = statistics.median(py_s), statistics.median(cli_s)
    print(json.dumps({
        "model": args.model, "num_prompts": args.num_prompts, "output_len": args.output_len,
        "threads": args.threads,
        "python_elapsed_s": py_s, "cli_elapsed_s": cli_s,
        "python_output_tokens_per_s": tokens / py, "cli_output_tokens_per_s": tokens / cli,
        "python_over_cli_throughput": cli / py,
        "import_s": IMPORT_S, "llm_create_s": create_s,
        "first_generate_s": first_call_s, "second_generate_s": second_call_s,
    }, indent=1))


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env bash
# Multi-adapter serving, Vesper against llama.cpp's llama-server on the same GGUF, adapters and
# threads. Writes NUM (8) random f16 LoRA adapters (rank RANK, q, k, v, o) for MODEL; starts
# llama-server with them (--lora each, --lora-init-without-apply: a request picks its adapter
# with "lora": [{"id", "scale"}]) and then `vesper serve` with them (--lora-modules: a request
# picks one by "model"); drives each with `vesper bench serve` (CONCURRENCY concurrent requests,
# the same random prompts): on the base model, all on one adapter, and spread over the NUM
# adapters. Prints both engines' output tokens/s and Vesper / llama-server.
#
#   bench/lora/vs-llama-server.sh [MODEL.gguf] [--threads N]
#
# Environment: NUM (8), RANK (16), CONCURRENCY (32), INPUT_LEN (32), OUTPUT_LEN (64),
# LLAMA_SERVER (bench/llamacpp/build/llama-server; bench/llamacpp/build_llama_server.sh).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
vesper="${VESPER_BINARY:-$root/build/bin/vesper}"
llama_server="${LLAMA_SERVER:-$root/bench/llamacpp/build/llama-server}"
model="$root/bench/models/llama-1b-q4_k.gguf"
threads=2
while [ $# -gt 0 ]; do
  case "$1" in
    --threads) threads="$2"; shift 2 ;;
    -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "vs-llama-server.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) model="$1"; shift ;;
  esac
done
[ -x "$vesper" ] || { echo "vs-llama-server.sh: $vesper not found; build first (make build)" >&2; exit 1; }
[ -x "$llama_server" ] || { echo "vs-llama-server.sh: $llama_server not found (bench/llamacpp/build_llama_server.sh)" >&2; exit 1; }
[ -f "$model" ] || { echo "vs-llama-server.sh: model $model not found (bench/make-models 1b-q4_k)" >&2; exit 1; }
num="${NUM:-8}" rank="${RANK:-16}" conc="${CONCURRENCY:-32}" port=8473
in_len="${INPUT_LEN:-32}" out_len="${OUTPUT_LEN:-64}"
work="$(mktemp -d)"
trap 'kill "${pid:-0}" 2>/dev/null || true; rm -rf "$work"' EXIT

# shellcheck source=common.sh
. "$here/common.sh"
write_adapters "$work" "$model" "$num" "$rank"
llama_loras=()
for i in $(seq 0 $((num - 1))); do llama_loras+=(--lora "$work/a$i.gguf"); done
bench() {  # extra bench serve arguments
  "$vesper" bench serve --base-url "http://127.0.0.1:$port" --model "$(basename "$model" .gguf)" \
    --num-prompts "$conc" --max-concurrency "$conc" --input-len "$in_len" --output-len "$out_len" \
    --seed 1 --json "$@" 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["output_throughput"])'
}
declare -A llama vesper_tps

"$llama_server" -m "$model" --host 127.0.0.1 --port "$port" -t "$threads" -np "$conc" -cb \
  -c $((conc * 512)) "${llama_loras[@]}" --lora-init-without-apply >"$work/llama.log" 2>&1 &
pid=$!
wait_ready "$pid" "$work/llama.log" "http://127.0.0.1:$port/health"
llama[base]=$(bench)
llama[one]=$(bench --lora-ids 1)
llama[spread]=$(bench --lora-ids "$num")
kill "$pid"; wait "$pid" 2>/dev/null || true

"$vesper" serve "$model" --port "$port" --threads "$threads" --max-num-seqs "$conc" \
  --max-model-len 512 --enable-lora --max-loras "$num" --max-lora-rank "$rank" \
  --lora-modules "${adapter_modules[@]}" >"$work/vesper.log" 2>&1 &
pid=$!
wait_ready "$pid" "$work/vesper.log" "http://127.0.0.1:$port/health"
vesper_tps[base]=$(bench)
vesper_tps[one]=$(bench --lora-modules a0)
vesper_tps[spread]=$(bench --lora-modules "${adapter_names[@]}")
kill "$pid"; wait "$pid" 2>/dev/null || true

printf '%-26s %16s %16s %10s\n' load "llama-server" "Vesper" "ratio"
for load in base one spread; do
  label=$load
  [ "$load" = base ] && label="base model"
  [ "$load" = one ] && label="all on one adapter"
  [ "$load" = spread ] && label="over $num adapters"
  python3 -c "import sys; l, v = float(sys.argv[2]), float(sys.argv[3]); print(f'{sys.argv[1]:<26s} {l:12.1f} t/s {v:12.1f} t/s {v / l:9.2f}x')" \
    "$label" "${llama[$load]}" "${vesper_tps[$load]}"
done

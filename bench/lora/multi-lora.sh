#!/usr/bin/env bash
# Multi-adapter serving, measured (issue: S-LoRA-style batching of many adapters on a CPU).
# Writes random f16 LoRA adapters (rank R on q, k, v, o) for MODEL with `vesper synth --base`,
# starts one `vesper serve` with all of them registered, and runs `vesper bench serve` at
# CONCURRENCY concurrent requests: on the base model, all on one adapter, spread over 8 and over
# 32 distinct adapters; the loads alternate, REPS repetitions. Prints each load's output
# tokens/s (median), its ratio to the base-model load and the memory bound (base bytes /
# (base bytes + bytes of the distinct adapters a decode step reads)).
#
#   bench/lora/multi-lora.sh [MODEL.gguf] [--reps N] [--threads N]
#
# Environment: RANK (16), CONCURRENCY (32), INPUT_LEN (32), OUTPUT_LEN (64), PORT (8471).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
vesper="${VESPER_BINARY:-$root/build/bin/vesper}"
model="$root/bench/models/llama-1b-q4_k.gguf"
reps=2
threads=2
while [ $# -gt 0 ]; do
  case "$1" in
    --reps) reps="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "multi-lora.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) model="$1"; shift ;;
  esac
done
[ -x "$vesper" ] || { echo "multi-lora.sh: $vesper not found; build first (make build)" >&2; exit 1; }
[ -f "$model" ] || { echo "multi-lora.sh: model $model not found (bench/make-models 1b-q4_k)" >&2; exit 1; }
rank="${RANK:-16}"
conc="${CONCURRENCY:-32}"
port="${PORT:-8471}"
work="$(mktemp -d)"
trap 'kill "${server_pid:-0}" 2>/dev/null || true; rm -rf "$work"' EXIT

# shellcheck source=common.sh
. "$here/common.sh"
write_adapters "$work" "$model" 32 "$rank"
adapter_bytes=$(stat -c %s "$work/a0.gguf")
base_bytes=$(stat -c %s "$model")

"$vesper" serve "$model" --port "$port" --threads "$threads" --max-num-seqs "$conc" \
  --max-model-len 1024 --enable-lora --max-loras 32 --max-cpu-loras 32 --max-lora-rank "$rank" \
  --lora-modules "${adapter_modules[@]}" >"$work/server.log" 2>&1 &
server_pid=$!
wait_ready "$server_pid" "$work/server.log" "http://127.0.0.1:$port/health"

declare -A loads=([base]="" [one]="a0" [8]="${adapter_names[*]:0:8}" [32]="${adapter_names[*]}")
declare -A distinct=([base]=0 [one]=1 [8]=8 [32]=32)
declare -A results
for rep in $(seq 1 "$reps"); do
  for load in base one 8 32; do
    args=(bench serve --base-url "http://127.0.0.1:$port" --model "$(basename "$model" .gguf)"
          --num-prompts "$conc" --max-concurrency "$conc" --input-len "${INPUT_LEN:-32}"
          --output-len "${OUTPUT_LEN:-64}" --seed "$rep" --json)
    # shellcheck disable=SC2206
    [ -n "${loads[$load]}" ] && args+=(--lora-modules ${loads[$load]})
    tps=$("$vesper" "${args[@]}" 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["output_throughput"])')
    results[$load]="${results[$load]:-} $tps"
    echo "rep $rep, $load: $tps output tokens/s" >&2
  done
done
median() { python3 -c 'import statistics,sys; print(statistics.median(float(x) for x in sys.argv[1:]))' $1; }
base_tps=$(median "${results[base]}")
printf '%-28s %12s %10s %10s\n' load "output tok/s" "vs base" bound
for load in base one 8 32; do
  tps=$(median "${results[$load]}")
  python3 - "$load" "$tps" "$base_tps" "${distinct[$load]}" "$adapter_bytes" "$base_bytes" <<'PY'
import sys
load, tps, base, n, ab, bb = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
label = {"base": "base model", "one": "all on one adapter", "8": "over 8 adapters", "32": "over 32 adapters"}[load]
print(f"{label:<28s} {tps:12.1f} {tps / base:9.3f}x {bb / (bb + n * ab):9.3f}x")
PY
done

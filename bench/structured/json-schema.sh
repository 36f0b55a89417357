#!/usr/bin/env bash
# Structured output at serving load: output tokens/s of CONCURRENCY concurrent requests, free
# and constrained to a JSON schema (the same schema for all, as an application sends it), on
# Vesper and on llama.cpp's llama-server (its GBNF sampler), same GGUF, prompts and threads.
# Requests send llama.cpp's "json_schema" field, which both servers take. The schema
# (records.schema.json: an array of at least 40 small records) cannot be complete within
# OUTPUT_LEN tokens, so every request stays inside the grammar for its whole length and
# ignore_eos changes nothing.
# Prints each engine's free and constrained tokens/s and constrained / free, in alternating
# repetitions (REPS), medians.
#
#   bench/structured/json-schema.sh [MODEL.gguf] [--threads N]
#
# Environment: REPS (3), CONCURRENCY (32), INPUT_LEN (32), OUTPUT_LEN (128), SKIP_LLAMA (unset),
# LLAMA_SERVER (bench/llamacpp/build/llama-server; bench/llamacpp/build_llama_server.sh).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
vesper="${VESPER_BINARY:-$root/build/bin/vesper}"
llama_server="${LLAMA_SERVER:-$root/bench/llamacpp/build/llama-server}"
model="$root/bench/models/llama-110m-q4_0.gguf"
threads=2
while [ $# -gt 0 ]; do
  case "$1" in
    --threads) threads="$2"; shift 2 ;;
    -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "json-schema.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) model="$1"; shift ;;
  esac
done
[ -x "$vesper" ] || { echo "json-schema.sh: $vesper not found; build first (make build)" >&2; exit 1; }
[ -f "$model" ] || { echo "json-schema.sh: model $model not found (bench/make-models 110m-q4_0)" >&2; exit 1; }
reps="${REPS:-3}" conc="${CONCURRENCY:-32}" in_len="${INPUT_LEN:-32}" out_len="${OUTPUT_LEN:-128}"
port=8474
work="$(mktemp -d)"
trap 'kill "${pid:-0}" 2>/dev/null || true; rm -rf "$work"' EXIT
# shellcheck source=../common.sh
. "$root/bench/common.sh"

schema="$(cat "$here/records.schema.json")"
constrained="{\"json_schema\": $schema}"

bench() {  # extra bench serve arguments
  "$vesper" bench serve --base-url "http://127.0.0.1:$port" --model "$(basename "$model" .gguf)" \
    --num-prompts "$conc" --max-concurrency "$conc" --input-len "$in_len" --output-len "$out_len" \
    --seed 1 --json "$@" 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["output_throughput"])'
}
# run_engine NAME: alternating free / constrained runs against the server on $port.
run_engine() {
  local name="$1" r
  for r in $(seq 1 "$reps"); do
    echo "$name free $(bench)" >>"$work/results"
    echo "$name constrained $(bench --extra-body "$constrained")" >>"$work/results"
  done
}

if [ -z "${SKIP_LLAMA:-}" ]; then
  [ -x "$llama_server" ] || { echo "json-schema.sh: $llama_server not found (bench/llamacpp/build_llama_server.sh; SKIP_LLAMA=1 to skip)" >&2; exit 1; }
  "$llama_server" -m "$model" --host 127.0.0.1 --port "$port" -t "$threads" -np "$conc" -cb \
    -c $((conc * 256)) >"$work/llama.log" 2>&1 &
  pid=$!
  wait_ready "$pid" "$work/llama.log" "http://127.0.0.1:$port/health"
  run_engine llama-server
  kill "$pid"; wait "$pid" 2>/dev/null || true
fi

"$vesper" serve "$model" --port "$port" --threads "$threads" --max-num-seqs "$conc" \
  --max-model-len 256 >"$work/vesper.log" 2>&1 &
pid=$!
wait_ready "$pid" "$work/vesper.log" "http://127.0.0.1:$port/health"
run_engine Vesper
kill "$pid"; wait "$pid" 2>/dev/null || true

python3 - "$work/results" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    engine, mode, tps = line.split()
    rows.setdefault(engine, {}).setdefault(mode, []).append(float(tps))
print(f"{'engine':<14s} {'free t/s':>10s} {'schema t/s':>11s} {'schema/free':>12s}  (medians; runs: free / schema)")
for engine, r in rows.items():
    f, c = statistics.median(r["free"]), statistics.median(r["constrained"])
    runs = " ".join(f"{a:.1f}/{b:.1f}" for a, b in zip(r["free"], r["constrained"]))
    print(f"{engine:<14s} {f:10.1f} {c:11.1f} {c / f:11.3f}x  {runs}")
PY

#!/usr/bin/env bash
# Many registered adapters, few kept loaded: writes NUM (1000) random f16 LoRA adapters (rank
# RANK, q, k, v, o) for MODEL, starts `vesper serve` with all of them registered and
# --max-cpu-loras CPU_LORAS (64), and sends PROMPTS requests (CONCURRENCY at a time) that go to the
# adapters in turn (request i to adapter i mod NUM), so nearly every request needs an adapter
# read from disk. Prints output tokens/s against the same load on the base model, and the
# adapter loads per second (from /metrics).
#
#   bench/lora/many-adapters.sh [MODEL.gguf] [--threads N]
#
# Environment: NUM (1000), RANK (8), CPU_LORAS (64), CONCURRENCY (32), PROMPTS (256),
# INPUT_LEN (32), OUTPUT_LEN (32), PORT (8472).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
vesper="${VESPER_BINARY:-$root/build/bin/vesper}"
model="$root/bench/models/llama-110m-q4_0.gguf"
threads=2
while [ $# -gt 0 ]; do
  case "$1" in
    --threads) threads="$2"; shift 2 ;;
    -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "many-adapters.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) model="$1"; shift ;;
  esac
done
[ -x "$vesper" ] || { echo "many-adapters.sh: $vesper not found; build first (make build)" >&2; exit 1; }
[ -f "$model" ] || { echo "many-adapters.sh: model $model not found (bench/make-models 110m-q4_0)" >&2; exit 1; }
num="${NUM:-1000}" rank="${RANK:-8}" cpu_loras="${CPU_LORAS:-64}" conc="${CONCURRENCY:-32}"
prompts="${PROMPTS:-256}" port="${PORT:-8472}"
work="$(mktemp -d)"
trap 'kill "${server_pid:-0}" 2>/dev/null || true; rm -rf "$work"' EXIT

# shellcheck source=common.sh
. "$here/common.sh"
write_adapters "$work" "$model" "$num" "$rank"
echo "wrote $num adapters of $(stat -c %s "$work/a0.gguf") bytes" >&2
start=$(date +%s.%N)
"$vesper" serve "$model" --port "$port" --threads "$threads" --max-num-seqs "$conc" \
  --max-model-len 512 --enable-lora --max-loras "$conc" --max-cpu-loras "$cpu_loras" \
  --max-lora-rank "$rank" --lora-modules "${adapter_modules[@]}" >"$work/server.log" 2>&1 &
server_pid=$!
wait_ready "$server_pid" "$work/server.log" "http://127.0.0.1:$port/health"
echo "server up in $(python3 -c "print(round($(date +%s.%N) - $start, 1))") s (every adapter read once to check it)" >&2
loads() { curl -s "http://127.0.0.1:$port/metrics" | awk '/^vesper:lora_adapter_loads_total/ {print $2}'; }
run() {
  "$vesper" bench serve --base-url "http://127.0.0.1:$port" --model "$(basename "$model" .gguf)" \
    --num-prompts "$prompts" --max-concurrency "$conc" --input-len "${INPUT_LEN:-32}" \
    --output-len "${OUTPUT_LEN:-32}" --json "$@" 2>/dev/null
}
base=$(run | python3 -c 'import json,sys; print(json.load(sys.stdin)["output_throughput"])')
before=$(loads)
result=$(run --lora-modules "${adapter_names[@]}")
after=$(loads)
python3 - "$base" "$before" "$after" "$result" <<'PY'
import json, sys
base, before, after = float(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
r = json.loads(sys.argv[4])
loads = after - before
print(f"base model:            {base:8.1f} output tok/s")
print(f"round-robin adapters:  {r['output_throughput']:8.1f} output tok/s ({r['output_throughput'] / base:.3f}x), "
      f"{r['completed']} of {r['num_prompts'] if 'num_prompts' in r else r['completed']} requests completed")
print(f"adapter loads:         {loads:.0f} in {r['duration']:.1f} s = {loads / r['duration']:.1f} loads/s")
PY

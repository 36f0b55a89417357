#!/usr/bin/env bash
# Prefix caching, measured: runs `vesper bench throughput` on a shared-prefix workload and on a
# multi-turn chat workload with --enable-prefix-caching and --no-enable-prefix-caching,
# alternately, several repetitions, and prints each figure's median with caching on and off and
# the ratio (on / off for throughput, off / on for TTFT: above 1 means caching helps).
#
#   bench/prefix-caching.sh [MODEL.gguf] [--reps N] [--threads N] [--json]
#
# Workloads (override with environment variables):
#   shared prefix: PREFIX_PROMPTS requests (default 64), each one of PREFIX_NUM (4) shared
#                  prefixes of PREFIX_LEN (384) tokens plus PREFIX_INPUT (32) own tokens,
#                  OUTPUT_LEN (32) generated tokens;
#   multi-turn:    CHAT_CONVS conversations (16) of CHAT_TURNS turns (5); each turn adds
#                  CHAT_INPUT (48) user tokens to the history and generates OUTPUT_LEN tokens.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
vesper="${VESPER_BINARY:-$root/build/bin/vesper}"
model="$root/../shared/models/stories260K-f32.gguf"
reps=3
threads=2
json=0
while [ $# -gt 0 ]; do
  case "$1" in
    --reps) reps="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --json) json=1; shift ;;
    -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "prefix-caching.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) model="$1"; shift ;;
  esac
done
[ -x "$vesper" ] || { echo "prefix-caching.sh: $vesper not found; build first (make build)" >&2; exit 1; }
[ -f "$model" ] || { echo "prefix-caching.sh: model $model not found" >&2; exit 1; }

out_len="${OUTPUT_LEN:-32}"
shared=(--num-prompts "${PREFIX_PROMPTS:-64}" --prefix-len "${PREFIX_LEN:-384}" --num-prefixes "${PREFIX_NUM:-4}"
        --input-len "${PREFIX_INPUT:-32}" --output-len "$out_len")
chat=(--num-prompts "${CHAT_CONVS:-16}" --num-turns "${CHAT_TURNS:-5}" --input-len "${CHAT_INPUT:-48}"
      --output-len "$out_len")

results="$(mktemp)"
trap 'rm -f "$results"' EXIT
for ((r = 1; r <= reps; ++r)); do
  for workload in shared chat; do
    for cache in on off; do
      if [ "$workload" = shared ]; then args=("${shared[@]}"); else args=("${chat[@]}"); fi
      flag=--enable-prefix-caching
      [ "$cache" = off ] && flag=--no-enable-prefix-caching
      line="$("$vesper" bench throughput "$model" "${args[@]}" "$flag" --threads "$threads" --seed "$r" --json 2>/dev/null)"
      echo "{\"workload\":\"$workload\",\"cache\":\"$cache\",\"result\":$line}" >>"$results"
      [ "$json" = 1 ] || echo "rep $r/$reps $workload cache $cache done" >&2
    done
  done
done

node - "$results" "$json" "$model" "$threads" <<'JS'
const fs = require('fs');
const [file, json, model, threads] = process.argv.slice(2);
const rows = fs.readFileSync(file, 'utf8').trim().split('\n').map((l) => JSON.parse(l));
const median = (xs) => { const s = [...xs].sort((a, b) => a - b); return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2; };
const metrics = [
  ['requests_per_s', 'requests/s', (on, off) => on / off],
  ['total_tokens_per_s', 'total tokens/s', (on, off) => on / off],
  ['mean_ttft_ms', 'mean TTFT ms', (on, off) => off / on],
  ['p99_ttft_ms', 'p99 TTFT ms', (on, off) => off / on],
  ['prefill_tokens_computed', 'prefill tokens', (on, off) => off / on],
  ['prefix_cache_hit_rate', 'hit rate', () => null],
];
const report = { model, threads: Number(threads), reps: rows.length / 4, workloads: {} };
for (const w of ['shared', 'chat']) {
  report.workloads[w] = {};
  for (const [key, , ratio] of metrics) {
    const on = median(rows.filter((r) => r.workload === w && r.cache === 'on').map((r) => r.result[key]));
    const off = median(rows.filter((r) => r.workload === w && r.cache === 'off').map((r) => r.result[key]));
    report.workloads[w][key] = { on, off, ratio: ratio(on, off) };
  }
}
if (json === '1') { console.log(JSON.stringify(report)); process.exit(0); }
console.log(`model ${model}, ${threads} threads, medians of ${report.reps} repetitions`);
for (const w of ['shared', 'chat']) {
  console.log(`\n${w === 'shared' ? 'shared prefix' : 'multi-turn chat'}:`);
  console.log('  figure            cache on    cache off   ratio (>1: caching helps)');
  for (const [key, label] of metrics) {
    const { on, off, ratio } = report.workloads[w][key];
    const fmt = (x) => (Number.isInteger(x) ? String(x) : x.toFixed(key.includes('rate') ? 3 : 1)).padStart(10);
    console.log(`  ${label.padEnd(16)} ${fmt(on)}  ${fmt(off)}   ${ratio === null ? '' : ratio.toFixed(2) + 'x'}`);
  }
}
JS

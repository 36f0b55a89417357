#!/usr/bin/env bash
# bench/kv-sparsity/serve-long-prompts.sh: serving long documents under KV sparsity against dense,
# in one run: `vesper serve MODEL` started once per setting (dense, Quest at --budget, sinks +
# window), each loaded by `vesper bench serve` with the same random prompts of --input-len tokens
# (all sent at once by default), and the throughput and TTFT of each, with ratios to dense.
# Prompts are prefilled densely whatever the setting, so the gain is in the decode steps.
#
# usage: bench/kv-sparsity/serve-long-prompts.sh [options] MODEL.gguf
#   --input-len N     prompt tokens (default 8192)
#   --output-len N    generated tokens per request (default 256)
#   --num-prompts N   requests (default 8)
#   --request-rate R  requests per second (default inf: all at once)
#   --budget B        Quest's budget (default 1024)
#   --window "S W"    sinks and window (default "4 1020")
#   -t N              server threads (default 2)
#   --port P          the first server's port is P + 1, the next P + 2, ... (default 8190)
#   --vesper PATH     the binary (default build/bin/vesper)
# Relative paths are from the repository root. Prints a markdown table.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
# shellcheck source=../common.sh
source bench/common.sh

fail() { printf 'serve-long-prompts: error: %s\n' "$*" >&2; exit 1; }
usage() { sed -n '/^# usage:/,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }

input_len=8192
output_len=256
num_prompts=8
rate=inf
budget=1024
window="4 1020"
threads=2
port=8190
vesper=build/bin/vesper
model=""
while [ $# -gt 0 ]; do
    case "$1" in
        -h|--help) usage; exit 0 ;;
        --input-len) [ $# -ge 2 ] || fail "--input-len needs a number"; input_len="$2"; shift 2 ;;
        --output-len) [ $# -ge 2 ] || fail "--output-len needs a number"; output_len="$2"; shift 2 ;;
        --num-prompts) [ $# -ge 2 ] || fail "--num-prompts needs a number"; num_prompts="$2"; shift 2 ;;
        --request-rate) [ $# -ge 2 ] || fail "--request-rate needs a rate"; rate="$2"; shift 2 ;;
        --budget) [ $# -ge 2 ] || fail "--budget needs a number"; budget="$2"; shift 2 ;;
        --window) [ $# -ge 2 ] || fail "--window needs \"S W\""; window="$2"; shift 2 ;;
        -t) [ $# -ge 2 ] || fail "-t needs a number"; threads="$2"; shift 2 ;;
        --port) [ $# -ge 2 ] || fail "--port needs a number"; port="$2"; shift 2 ;;
        --vesper) [ $# -ge 2 ] || fail "--vesper needs a path"; vesper="$2"; shift 2 ;;
        -*) fail "unknown option $1 (see --help)" ;;
        *) [ -z "$model" ] || fail "one model"; model="$1"; shift ;;
    esac
done
[ -n "$model" ] || fail "name the model (a GGUF file with a context above --input-len + --output-len)"
[ -x "$vesper" ] || fail "$vesper not found: build vesper first or pass --vesper"
read -r sinks win <<<"$window"
max_len=$((input_len + output_len + 64))

log="$(mktemp)"
server=""
cleanup() { [ -n "$server" ] && kill "$server" 2>/dev/null; rm -f "$log"; }
trap cleanup EXIT

echo "| setting | output tok/s | vs dense | mean TTFT ms | median TTFT ms | mean TPOT ms | vs dense |"
echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"
dense_tput="" dense_tpot=""
for s in dense "quest $budget" "window $sinks + $win"; do
    port=$((port + 1))  # a port of its own: the last server's socket may linger
    case "$s" in
        dense) flags=() ;;
        quest*) flags=(--kv-sparsity quest --kv-sparse-budget "$budget") ;;
        window*) flags=(--kv-window "$win" --kv-sink-tokens "$sinks") ;;
    esac
    "$vesper" serve "$model" --port "$port" -t "$threads" --max-model-len "$max_len" \
        "${flags[@]}" >"$log" 2>&1 &
    server=$!
    wait_ready "$server" "$log" "http://127.0.0.1:$port/health"
    json="$("$vesper" bench serve --base-url "http://127.0.0.1:$port" --input-len "$input_len" \
        --output-len "$output_len" --num-prompts "$num_prompts" --request-rate "$rate" \
        --ignore-eos --json)"
    kill "$server"
    wait "$server" 2>/dev/null || true
    server=""
    read -r tput ttft_mean ttft_median tpot < <(printf '%s' "$json" | python3 -c '
import json, sys
j = json.load(sys.stdin)
print(j["output_throughput"], j["mean_ttft_ms"], j["median_ttft_ms"], j["mean_tpot_ms"])')
    [ -n "$dense_tput" ] || { dense_tput="$tput"; dense_tpot="$tpot"; }
    awk -v s="$s" -v t="$tput" -v dt="$dense_tput" -v a="$ttft_mean" -v m="$ttft_median" \
        -v p="$tpot" -v dp="$dense_tpot" \
        'BEGIN {printf "| %s | %.1f | %.2fx | %.0f | %.0f | %.1f | %.2fx |\n", s, t, t / dt, a, m, p, dp / p}'
done

#!/usr/bin/env bash
# bench/kv-sparsity/decode-speed.sh: decode speed under KV sparsity against dense, in one run on
# one machine: N sequences decoding at a context of D tokens (`vesper bench latency -d D
# --decode-seqs N --shared-prompt`: the sequences share one random prompt, prefilled once per
# setting and found in the prefix cache, so that a long context costs one prefill, not N), for
# dense attention, Quest (--kv-sparsity quest --kv-sparse-budget B) and sinks + window
# (--kv-sink-tokens S --kv-window W). The settings run one after another, REPS rounds
# interleaved; each row gives tokens/s of every round and the ratio of the medians to dense.
#
# The models are random-weight llama files with a context long enough for D: with --make, written
# by `vesper synth` (bench/make-models' shapes, Llama 2's vocabulary) as
# bench/models/llama-SIZE-TYPE-ctxC.gguf, C 32768 (or the next power of two at or above the
# largest D + 64).
#
# usage: bench/kv-sparsity/decode-speed.sh [options] SIZE-TYPE ...   (e.g. 110m-q4_0 1b-q4_0)
#   -d "LIST"        contexts (default "4096 16384")
#   -n N             tokens generated per sequence, timed (default 16)
#   --seqs N         sequences decoding at once (default 8)
#   --budget B       Quest's budget in tokens (default 1024)
#   --window "S W"   sinks and window (default "4 1020")
#   --reps R         interleaved rounds (default 1)
#   -t N             threads (default 2)
#   --vesper PATH    the binary (default build/bin/vesper)
#   --make           write missing models first
# Relative paths are from the repository root. Prints a markdown table.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"

fail() { printf 'decode-speed: error: %s\n' "$*" >&2; exit 1; }
usage() { sed -n '/^# usage:/,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }

depths="4096 16384"
n_gen=16
seqs=8
budget=1024
window="4 1020"
reps=1
threads=2
vesper=build/bin/vesper
make=0
models=()
while [ $# -gt 0 ]; do
    case "$1" in
        -h|--help) usage; exit 0 ;;
        -d) [ $# -ge 2 ] || fail "-d needs a list"; depths="$2"; shift 2 ;;
        -n) [ $# -ge 2 ] || fail "-n needs a number"; n_gen="$2"; shift 2 ;;
        --seqs) [ $# -ge 2 ] || fail "--seqs needs a number"; seqs="$2"; shift 2 ;;
        --budget) [ $# -ge 2 ] || fail "--budget needs a number"; budget="$2"; shift 2 ;;
        --window) [ $# -ge 2 ] || fail "--window needs \"S W\""; window="$2"; shift 2 ;;
        --reps) [ $# -ge 2 ] || fail "--reps needs a number"; reps="$2"; shift 2 ;;
        -t) [ $# -ge 2 ] || fail "-t needs a number"; threads="$2"; shift 2 ;;
        --vesper) [ $# -ge 2 ] || fail "--vesper needs a path"; vesper="$2"; shift 2 ;;
        --make) make=1; shift ;;
        -*) fail "unknown option $1 (see --help)" ;;
        *) models+=("$1"); shift ;;
    esac
done
[ ${#models[@]} -gt 0 ] || fail "name at least one model (SIZE-TYPE, e.g. 110m-q4_0)"
[ -x "$vesper" ] || fail "$vesper not found: build vesper first or pass --vesper"
read -r sinks win <<<"$window"

most=0
for d in $depths; do [ "$d" -gt "$most" ] && most="$d"; done
ctx=32768
while [ "$ctx" -lt $((most + 64)) ]; do ctx=$((ctx * 2)); done

median() { tr ' ' '\n' | grep . | sort -g | awk '{v[NR] = $1} END {print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2)}'; }

echo "| model | context | sequences | setting | tokens/s (each round) | vs dense |"
echo "| --- | ---: | ---: | --- | --- | ---: |"
for name in "${models[@]}"; do
    size="${name%%-*}"
    type="${name#*-}"
    case "$size" in
        110m) shape="--n-layer 12 --n-embd 768 --n-head 12 --n-head-kv 12 --n-ff 2048" ;;
        1b) shape="--n-layer 16 --n-embd 2048 --n-head 32 --n-head-kv 8 --n-ff 8192" ;;
        *) fail "unknown size in \"$name\" (110m or 1b)" ;;
    esac
    model="bench/models/llama-$name-ctx$ctx.gguf"
    if [ ! -s "$model" ]; then
        [ "$make" = 1 ] || fail "$model not found: pass --make to write it"
        mkdir -p bench/models
        # shellcheck disable=SC2086  # $shape is a list of flags
        "$vesper" synth --arch llama $shape --context-length "$ctx" --type "$type" \
            --vocab-from ../shared/models/llama-2-tiny-random.gguf -o "$model.tmp" >&2
        mv -f "$model.tmp" "$model"
    fi
    for d in $depths; do
        settings=("dense" "quest $budget" "window $sinks + $win")
        declare -A rates=()
        for ((r = 0; r < reps; ++r)); do
            for s in "${settings[@]}"; do
                case "$s" in
                    dense) flags=() ;;
                    quest*) flags=(--kv-sparsity quest --kv-sparse-budget "$budget") ;;
                    window*) flags=(--kv-window "$win" --kv-sink-tokens "$sinks") ;;
                esac
                json="$("$vesper" bench latency "$model" -p 0 -n "$n_gen" -d "$d" --decode-seqs "$seqs" \
                    --shared-prompt -r 1 -t "$threads" --max-model-len "$ctx" --json "${flags[@]}")"
                rate="$(printf '%s' "$json" | python3 -c \
                    "import json, sys; print('%.2f' % json.load(sys.stdin)['tg${n_gen}_seqs${seqs}_d${d}_tokens_per_s'])")"
                rates["$s"]="${rates["$s"]:-} $rate"
            done
        done
        dense="$(echo "${rates[dense]}" | median)"
        for s in "${settings[@]}"; do
            m="$(echo "${rates[$s]}" | median)"
            ratio="$(awk -v a="$m" -v b="$dense" 'BEGIN {printf "%.2fx", a / b}')"
            echo "| $name | $d | $seqs | $s | ${rates[$s]# } | $ratio |"
        done
        unset rates
    done
done

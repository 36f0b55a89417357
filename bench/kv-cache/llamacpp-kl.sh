#!/usr/bin/env bash
# bench/kv-cache/llamacpp-kl.sh: what llama.cpp's KV cache types cost in accuracy, measured as
# `vesper perplexity --kl-divergence-base/--kl-divergence` measures Vesper's (same chunks, same
# scored tokens, same statistics: bench/llamacpp/llama_kl.cpp), optionally with Vesper's own
# figures from the same text and settings beside them.
#
# llama.cpp runs (bench/llamacpp/build/llama_kl; build it with bench/llamacpp/setup.sh):
#   base   -ctk f32 -ctv f32 -fa off: the only full-precision path. With flash attention on,
#          llama.cpp casts an f32 K/V cache to f16 before the attention op (llama-graph.cpp,
#          build_attn_mha), so "f32 with FA" is numerically f16; and a quantized V cache needs FA.
#   rows   each --types entry against that base (default: f32 and f16 with FA, f16 without FA,
#          bf16, q8_0 and q4_0 with FA);
#   second table (unless --one-base): the quantized entries against the f16 + FA run as base,
#          closer to the cost of the cache type alone (both through the flash-attention kernel).
# With --vesper PATH: Vesper's f32 base and --vesper-types against it, and Vesper's f32 run scored
# against llama.cpp's base and the reverse (a cross-engine check; the tokenizations are compared too).
#
# usage: bench/kv-cache/llamacpp-kl.sh [options] MODEL.gguf CTX [CHUNKS]
#   -f TEXT              text to score (default ../shared/data/tinystories-heldout.txt)
#   -t N                 threads (default 2)
#   --types "LIST"       llama.cpp entries: T (-ctk T -ctv T) or K/V, each optionally :off (flash
#                        attention off; default on). Default "f32 f16 f16:off bf16 q8_0 q4_0"
#   --one-base           skip the second table (the f16 + FA base)
#   --vesper PATH        also run Vesper (e.g. build-ci/bin/vesper)
#   --vesper-types "L"   Vesper's --kv-cache-dtype values (default "f16 bf16 int8 fp8_e4m3")
#   --keep DIR           keep the base files and logs in DIR (default: a temp dir, removed)
# CHUNKS: at most this many chunks (default: the whole text). Relative paths are taken from the
# repository root. Example (from the repo root):
#   bench/kv-cache/llamacpp-kl.sh ../shared/models/stories260K-f32.gguf 128
#   bench/kv-cache/llamacpp-kl.sh --vesper build-ci/bin/vesper bench/models/llama-110m-q4_0.gguf 2048 4
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"

fail() { printf 'llamacpp-kl: error: %s\n' "$*" >&2; exit 1; }
usage() { sed -n '/^# usage:/,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }

TEXT=../shared/data/tinystories-heldout.txt
THREADS=2
TYPES="f32 f16 f16:off bf16 q8_0 q4_0"
ONE_BASE=0
VESPER=""
VESPER_TYPES="f16 bf16 int8 fp8_e4m3"
KEEP=""
args=()
while [ $# -gt 0 ]; do
    case "$1" in
        -h|--help) usage; exit 0 ;;
        -f) [ $# -ge 2 ] || fail "-f needs a value"; TEXT="$2"; shift 2 ;;
        -t) [ $# -ge 2 ] || fail "-t needs a value"; THREADS="$2"; shift 2 ;;
        --types) [ $# -ge 2 ] || fail "--types needs a value"; TYPES="$2"; shift 2 ;;
        --one-base) ONE_BASE=1; shift ;;
        --vesper) [ $# -ge 2 ] || fail "--vesper needs a value"; VESPER="$2"; shift 2 ;;
        --vesper-types) [ $# -ge 2 ] || fail "--vesper-types needs a value"; VESPER_TYPES="$2"; shift 2 ;;
        --keep) [ $# -ge 2 ] || fail "--keep needs a value"; KEEP="$2"; shift 2 ;;
        -*) fail "unknown option $1 (see --help)" ;;
        *) args+=("$1"); shift ;;
    esac
done
[ "${#args[@]}" -ge 2 ] && [ "${#args[@]}" -le 3 ] || { usage >&2; fail "expected MODEL.gguf CTX [CHUNKS]"; }
MODEL="${args[0]}"
CTX="${args[1]}"
CHUNKS="${args[2]:-}"
[ -f "$MODEL" ] || fail "model $MODEL not found (relative paths are from $ROOT)"
[ -f "$TEXT" ] || fail "-f $TEXT not found (relative paths are from $ROOT)"
[[ "$CTX" =~ ^[0-9]+$ ]] && [ "$CTX" -ge 4 ] || fail "CTX must be an integer >= 4, got '$CTX'"
[ -z "$CHUNKS" ] || [[ "$CHUNKS" =~ ^[1-9][0-9]*$ ]] || fail "CHUNKS must be a positive integer, got '$CHUNKS'"
[[ "$THREADS" =~ ^[1-9][0-9]*$ ]] || fail "-t must be a positive integer, got '$THREADS'"
KL=bench/llamacpp/build/llama_kl
[ -x "$KL" ] || fail "$KL not built: run bench/llamacpp/setup.sh"
[ -z "$VESPER" ] || [ -x "$VESPER" ] || fail "--vesper $VESPER is not an executable"

if [ -n "$KEEP" ]; then
    mkdir -p "$KEEP"
    WORK="$KEEP"
else
    WORK="$(mktemp -d "${TMPDIR:-/tmp}/llamacpp-kl.XXXXXX")"
    trap 'rm -rf "$WORK"' EXIT
fi
chunk_args=()
[ -z "$CHUNKS" ] || chunk_args=(--chunks "$CHUNKS")

# run NAME CMD...: runs CMD, its stdout+stderr to $WORK/NAME.log; echoes the command; returns its rc.
run() {
    local name="$1"; shift
    printf '$ %s\n' "$*" >&2
    "$@" >"$WORK/$name.log" 2>&1
}

# The figures of a log, as "ppl ppl_err ratio mean mean_err median p99 max same%" or the error.
figures() {
    local log="$1"
    awk '
        /^Final estimate: PPL = / { ppl = $5; err = $7 }
        /^Base PPL = / { ratio = $NF }
        /^Mean KLD = / { gsub(/;/, ""); mean = $4; merr = $6; med = $8; p99 = $11; mx = $13 }
        /^Same top token: / { same = $4 }
        END { printf "%s %s %s %s %s %s %s %s %s\n", ppl, err, ratio, mean, merr, med, p99, mx, same }
    ' "$log"
}

# row ENGINE LABEL LOG RC: one markdown table row.
row() {
    local engine="$1" label="$2" log="$3" rc="$4"
    if [ "$rc" -ne 0 ]; then
        local why
        why="$(grep -m1 -E 'error' "$log" | sed 's/^[a-z_]*: error: //' || true)"
        printf '| %s | %s | not supported: %s | | | | | | |\n' "$engine" "$label" "${why:-exit $rc}"
        return
    fi
    local ppl err ratio mean merr med p99 mx same
    read -r ppl err ratio mean merr med p99 mx same <<<"$(figures "$log")"
    local vs
    vs="$(awk -v r="$ratio" 'BEGIN { printf "%+.3f%%", (r - 1) * 100 }')"
    printf '| %s | %s | %s | %s | %s ± %s | %s | %s | %s | %s |\n' \
        "$engine" "$label" "$ppl" "$vs" "$mean" "$merr" "$med" "$p99" "$mx" "$same"
}
base_row() {
    local engine="$1" label="$2" log="$3"
    local ppl err rest
    read -r ppl err rest <<<"$(figures "$log")"
    printf '| %s | %s (base) | %s ± %s | - | 0 | 0 | 0 | 0 | 100%% |\n' "$engine" "$label" "$ppl" "$err"
}
header() {
    printf '| engine | KV cache (K/V, flash attn) | PPL | vs base | mean KLD ± se | median | 99th pct | max | same top token |\n'
    printf '| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n'
}

# An entry T, K/V, T:off or K/V:off -> "K V FA" (FA on|off).
parse_entry() {
    local e="$1" fa=on kv k v
    case "$e" in *:off) fa=off; e="${e%:off}" ;; *:on) e="${e%:on}" ;; esac
    kv="$e"
    k="${kv%%/*}"; v="${kv#*/}"
    printf '%s %s %s\n' "$k" "$v" "$fa"
}
label_of() {  # K V FA -> "q8_0, FA on" or "q8_0/f16, FA off"
    local kv="$1"
    [ "$1" = "$2" ] || kv="$1/$2"
    printf '%s, FA %s' "$kv" "$3"
}

common=(-t "$THREADS" --ctx "$CTX" "${chunk_args[@]}")
printf 'model %s, ctx %s, chunks %s, text %s, %s threads\n' "$MODEL" "$CTX" "${CHUNKS:-all}" "$TEXT" "$THREADS" >&2

# ---- llama.cpp against its full-precision base ------------------------------------------------
LBASE="$WORK/llama-f32.kld"
run llama-base "$KL" "$MODEL" -f "$TEXT" "${common[@]}" -ctk f32 -ctv f32 -fa off \
    --kl-divergence-base "$LBASE" || { cat "$WORK/llama-base.log" >&2; fail "llama.cpp's base run failed"; }
table1="$(header; base_row llama.cpp "f32, FA off" "$WORK/llama-base.log")"
quantized=()
for e in $TYPES; do
    read -r k v fa <<<"$(parse_entry "$e")"
    name="llama-$k-$v-$fa"
    rc=0
    run "$name" "$KL" "$MODEL" "${common[@]}" -ctk "$k" -ctv "$v" -fa "$fa" --kl-divergence "$LBASE" || rc=$?
    table1+=$'\n'"$(row llama.cpp "$(label_of "$k" "$v" "$fa")" "$WORK/$name.log" "$rc")"
    if [[ "$k$v" == *q* ]] && [ "$fa" = on ] && [ "$rc" -eq 0 ]; then quantized+=("$k $v"); fi
done

# ---- llama.cpp: the cache type alone (base f16 with FA, the kernel every quantized run uses) ----
table2=""
if [ "$ONE_BASE" = 0 ] && [ "${#quantized[@]}" -gt 0 ]; then
    FBASE="$WORK/llama-f16fa.kld"
    run llama-base-f16fa "$KL" "$MODEL" -f "$TEXT" "${common[@]}" -ctk f16 -ctv f16 -fa on \
        --kl-divergence-base "$FBASE" || { cat "$WORK/llama-base-f16fa.log" >&2; fail "llama.cpp's f16 base run failed"; }
    table2="$(header; base_row llama.cpp "f16, FA on" "$WORK/llama-base-f16fa.log")"
    for kv in "${quantized[@]}"; do
        read -r k v <<<"$kv"
        name="llama-$k-$v-vs-f16fa"
        rc=0
        run "$name" "$KL" "$MODEL" "${common[@]}" -ctk "$k" -ctv "$v" -fa on --kl-divergence "$FBASE" || rc=$?
        table2+=$'\n'"$(row llama.cpp "$(label_of "$k" "$v" on)" "$WORK/$name.log" "$rc")"
    done
fi

# ---- Vesper ------------------------------------------------------------------------------------
table3=""
if [ -n "$VESPER" ]; then
    VBASE="$WORK/vesper-f32.kld"
    vcommon=(perplexity "$MODEL" -t "$THREADS" --ctx "$CTX" "${chunk_args[@]}")
    run vesper-base "$VESPER" "${vcommon[@]}" -f "$TEXT" --kv-cache-dtype f32 --kl-divergence-base "$VBASE" ||
        { cat "$WORK/vesper-base.log" >&2; fail "Vesper's base run failed"; }
    table3="$(header; base_row vesper f32 "$WORK/vesper-base.log")"
    for t in $VESPER_TYPES; do
        rc=0
        run "vesper-$t" "$VESPER" "${vcommon[@]}" --kv-cache-dtype "$t" --kl-divergence-base "$VBASE" --kl-divergence || rc=$?
        table3+=$'\n'"$(row vesper "$t" "$WORK/vesper-$t.log" "$rc")"
    done
    # Cross-engine: both files hold the same header and token ids when the tokenizers agree.
    read -r _ _ nch < <(od -An -t d8 -j 8 -N 24 "$LBASE")
    if cmp -s -n $((32 + nch * CTX * 4)) "$LBASE" "$VBASE"; then
        tok="same token ids in both engines' base files"
    else
        tok="the two engines' base files differ in their header or token ids"
    fi
    rc=0
    run vesper-vs-llama "$VESPER" "${vcommon[@]}" --kv-cache-dtype f32 --kl-divergence-base "$LBASE" --kl-divergence || rc=$?
    table3+=$'\n'"$(row vesper "f32 vs llama.cpp's f32 FA-off base" "$WORK/vesper-vs-llama.log" "$rc")"
    rc=0
    run llama-vs-vesper "$KL" "$MODEL" "${common[@]}" -ctk f32 -ctv f32 -fa off --kl-divergence "$VBASE" || rc=$?
    table3+=$'\n'"$(row llama.cpp "f32, FA off vs Vesper's f32 base" "$WORK/llama-vs-vesper.log" "$rc")"
fi

echo
echo "llama.cpp against its f32 cache without flash attention (full precision):"
echo "$table1"
if [ -n "$table2" ]; then
    echo
    echo "llama.cpp's quantized caches against its f16 cache, both with flash attention (the cache type alone):"
    echo "$table2"
fi
if [ -n "$table3" ]; then
    echo
    echo "Vesper against its f32 cache ($tok):"
    echo "$table3"
fi
[ -z "$KEEP" ] || echo "logs and base files in $KEEP"

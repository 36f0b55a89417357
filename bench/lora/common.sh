# Shared by the bench/lora scripts (sourced, not run): writing random adapters, and (from
# bench/common.sh) waiting for a server. Needs $vesper set.

# write_adapters DIR MODEL COUNT RANK: DIR/a0.gguf .. DIR/a{COUNT-1}.gguf, f16 LoRA adapters of
# rank RANK on q, k, v, o for MODEL (`vesper synth --base`), adapter i seeded with i + 1; sets
# adapter_names (a0 ...) and adapter_modules (a0=DIR/a0.gguf ...).
write_adapters() {
  local dir="$1" model="$2" count="$3" rank="$4" i
  adapter_names=() adapter_modules=()
  for i in $(seq 0 $((count - 1))); do
    "$vesper" synth --base "$model" --lora-rank "$rank" --lora-targets q,k,v,o --seed $((i + 1)) \
      -o "$dir/a$i.gguf" 2>/dev/null
    adapter_names+=("a$i")
    adapter_modules+=("a$i=$dir/a$i.gguf")
  done
}

# wait_ready: bench/common.sh.
# shellcheck source=../common.sh
. "$(dirname "${BASH_SOURCE[0]}")/../common.sh"

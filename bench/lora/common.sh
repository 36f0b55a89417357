# Shared by the bench/lora scripts (sourced, not run): writing random adapters and waiting for a
# server. Needs $vesper set.

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

# wait_ready PID LOG URL: returns once URL answers (a server's /health); exits with the server's
# log when it dies first, or after 10 minutes.
wait_ready() {
  local pid="$1" log="$2" url="$3"
  for _ in $(seq 1 1200); do
    curl -sf "$url" >/dev/null 2>&1 && return 0
    kill -0 "$pid" 2>/dev/null || { cat "$log" >&2; exit 1; }
    sleep 0.5
  done
  echo "the server at $url did not start (log: $log)" >&2
  exit 1
}

#include "cli/engine_flags.h"

#include "engine/memory_plan.h"

namespace vesper::cli {

void add_engine_flags(CLI::App* cmd, EngineFlags& f) {
  cmd->add_option("model", f.model_path, "GGUF model file")->required();
  cmd->add_option("-t,--threads", f.threads, "Compute threads (default: all cores)")->check(CLI::PositiveNumber);
  cmd->add_option("--max-model-len", f.max_model_len,
                  "Most tokens (prompt + output) a sequence may hold (default: the model's context length)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--max-num-batched-tokens", f.max_num_batched_tokens, "Token budget of one engine step")
      ->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--max-num-seqs", f.max_num_seqs, "Most sequences in one engine step")
      ->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--block-size", f.block_size, "Tokens per KV cache block")
      ->capture_default_str()->check(CLI::IsMember({8, 16, 32, 64, 128}));
  cmd->add_option("--kv-cache-memory", f.kv_cache_memory,
                  "KV cache size, e.g. 512M or 2G (default: a quarter of available memory, at most 4G, "
                  "no more than --max-num-seqs full-length sequences need)");
  cmd->add_option("--num-gpu-blocks-override", f.num_gpu_blocks_override,
                  "Use exactly this many KV blocks (overrides --kv-cache-memory)")->check(CLI::PositiveNumber);
  cmd->add_option("--swap-space", f.swap_space, "Host memory (GiB) for sequences preempted by swapping")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  cmd->add_option("--preemption-mode", f.preemption_mode,
                  "How to preempt when KV blocks run out: recompute (free, prefill again later) or swap "
                  "(copy to the swap space; recompute when it is full)")
      ->capture_default_str()->check(CLI::IsMember({"recompute", "swap"}));
  cmd->add_flag("--enable-chunked-prefill,!--no-enable-chunked-prefill", f.enable_chunked_prefill,
                "Split long prompts into chunks that share steps with decodes (default: on)");
  cmd->add_flag("--enable-prefix-caching,!--no-enable-prefix-caching", f.enable_prefix_caching,
                "Reuse the KV of prompt prefixes already computed (system prompts, chat history); cached "
                "blocks stay in the KV budget until evicted, least recently used first (default: on)");
}

Result<engine::EngineConfig> to_engine_config(const EngineFlags& f) {
  engine::EngineConfig c;
  c.model_path = f.model_path;
  c.threads = f.threads;
  c.cache.block_size = f.block_size;
  c.cache.num_gpu_blocks_override = f.num_gpu_blocks_override;
  c.cache.swap_space_gib = f.swap_space;
  c.cache.enable_prefix_caching = f.enable_prefix_caching;
  if (!f.kv_cache_memory.empty()) {
    auto bytes = engine::parse_byte_size(f.kv_cache_memory);
    if (!bytes) return make_error("--kv-cache-memory: " + bytes.error().message);
    if (*bytes <= 0) return make_error("--kv-cache-memory must be positive");
    c.cache.kv_cache_memory = *bytes;
  }
  c.scheduler.max_model_len = f.max_model_len;
  c.scheduler.max_num_batched_tokens = f.max_num_batched_tokens;
  c.scheduler.max_num_seqs = f.max_num_seqs;
  c.scheduler.enable_chunked_prefill = f.enable_chunked_prefill;
  c.scheduler.preemption_mode =
      f.preemption_mode == "swap" ? sched::PreemptionMode::kSwap : sched::PreemptionMode::kRecompute;
  return c;
}

}  // namespace vesper::cli

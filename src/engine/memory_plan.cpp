#include "engine/memory_plan.h"

#include "core/byte_stream.h"
#include "model/shard_commands.h"

#include <algorithm>
#include <bit>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <fstream>

namespace vesper::engine {
namespace {

std::string gib(double bytes) {
  char buf[32];
  if (bytes >= (1 << 30))
    std::snprintf(buf, sizeof(buf), "%.2f GiB", bytes / (1 << 30));
  else if (bytes >= (1 << 20))
    std::snprintf(buf, sizeof(buf), "%.2f MiB", bytes / (1 << 20));
  else
    std::snprintf(buf, sizeof(buf), "%.1f KiB", bytes / 1024);
  return buf;
}

}  // namespace

std::string MemoryPlan::describe() const {
  char buf[896];
  const std::string adapters =
      adapter_bytes > 0 ? " (adapters " + gib(static_cast<double>(adapter_bytes)) + ")" : "";
  std::snprintf(
      buf, sizeof(buf),
      "memory plan: weights %s%s; activations %s; KV cache (%s) %lld bytes/token, block %lld "
      "tokens = %s, %lld blocks = %s (%lld tokens%s, %.2f sequences of max-model-len %lld at "
      "once%s; made resident in the background); swap space %lld blocks = %s",
      gib(static_cast<double>(weight_bytes)).c_str(), adapters.c_str(),
      gib(static_cast<double>(activation_bytes)).c_str(), kv_dtype.c_str(),
      static_cast<long long>(bytes_per_token), static_cast<long long>(block_size),
      gib(static_cast<double>(bytes_per_block)).c_str(), static_cast<long long>(num_blocks),
      gib(static_cast<double>(num_blocks * bytes_per_block)).c_str(),
      static_cast<long long>(token_capacity()), kivi ? " quantized" : "", max_concurrency(),
      static_cast<long long>(max_model_len), kivi ? ", f16 residual windows included" : "",
      static_cast<long long>(num_swap_blocks),
      gib(static_cast<double>(num_swap_blocks * bytes_per_block)).c_str());
  return buf;
}

int64_t available_memory_bytes() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  int64_t value = 0;
  std::string unit;
  while (f >> key >> value >> unit)
    if (key == "MemAvailable:") return value * 1024;
  return 0;
}

Result<MemoryPlan> plan_memory(std::span<const backend::KvCacheSpec> kv, int64_t weight_bytes,
                               int64_t activation_bytes, const CacheConfig& cache,
                               int64_t max_model_len, int64_t max_num_seqs) {
  MemoryPlan p;
  if (cache.block_size != 8 && cache.block_size != 16 && cache.block_size != 32 &&
      cache.block_size != 64 && cache.block_size != 128)
    return make_error("--block-size must be one of 8, 16, 32, 64, 128, got " +
                      std::to_string(cache.block_size));
  VESPER_CHECK(!kv.empty(), "no KV storage to plan");
  p.weight_bytes = weight_bytes;
  p.activation_bytes = activation_bytes;
  p.kv_dtype = kv[0].dtypes.describe();
  if (kv.size() > 1) p.kv_dtype += ", target + draft";
  p.block_size = cache.block_size;
  p.max_model_len = max_model_len;
  p.blocks_per_seq = kv[0].peak_blocks(max_model_len);
  p.kivi = kv[0].kivi();
  for (const backend::KvCacheSpec& spec : kv) {
    VESPER_CHECK(spec.block_size == cache.block_size,
                 "KV spec of block size %lld for --block-size %lld",
                 static_cast<long long>(spec.block_size), static_cast<long long>(cache.block_size));
    p.bytes_per_token += spec.bytes_per_token();
    p.bytes_per_block += spec.bytes_per_block();
  }
  if (cache.num_gpu_blocks_override > 0) {
    p.num_blocks = cache.num_gpu_blocks_override;
    p.capacity_source = "--num-gpu-blocks-override";
  } else if (cache.kv_cache_memory > 0) {
    p.num_blocks = cache.kv_cache_memory / p.bytes_per_block;
    p.capacity_source = "--kv-cache-memory";
    if (p.num_blocks == 0)
      return make_error("--kv-cache-memory " + std::to_string(cache.kv_cache_memory) +
                        " bytes is less than one KV block (" + std::to_string(p.bytes_per_block) +
                        " bytes)");
  } else {
    const int64_t available = available_memory_bytes();
    int64_t budget =
        std::min<int64_t>(int64_t{4} << 30, available > 0 ? available / 4 : int64_t{1} << 30);
    // No point in more than max_num_seqs full-length sequences can use.
    // (With KIVI, as residual rows: the most one sequence holds at once, a whole prompt in one
    // chunk.)
    const int64_t all_residual_blocks =
        (max_model_len + p.block_size - 1) / p.block_size * kv[0].residual_blocks_per_group();
    p.num_blocks =
        std::max<int64_t>(all_residual_blocks,
                          std::min(budget / p.bytes_per_block, all_residual_blocks * max_num_seqs));
    p.capacity_source = "--kv-cache-memory auto";
  }
  if (cache.swap_space_gib < 0) return make_error("--swap-space must be >= 0 GiB");
  p.num_swap_blocks =
      static_cast<int64_t>(cache.swap_space_gib * static_cast<double>(int64_t{1} << 30)) /
      p.bytes_per_block;
  return p;
}

Result<int64_t> parse_byte_size(const std::string& text) {
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.'))
    ++i;
  if (i == 0) return make_error("\"" + text + "\" is not a size (examples: 512M, 4G, 1073741824)");
  double number = 0;
  try {
    number = std::stod(text.substr(0, i));
  } catch (...) {
    return make_error("\"" + text + "\" is not a size (examples: 512M, 4G, 1073741824)");
  }
  std::string unit = text.substr(i);
  for (char& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  double scale = 1;
  if (unit.empty() || unit == "B")
    scale = 1;
  else if (unit == "K" || unit == "KB" || unit == "KIB")
    scale = 1024.0;
  else if (unit == "M" || unit == "MB" || unit == "MIB")
    scale = 1024.0 * 1024;
  else if (unit == "G" || unit == "GB" || unit == "GIB")
    scale = 1024.0 * 1024 * 1024;
  else if (unit == "T" || unit == "TB" || unit == "TIB")
    scale = 1024.0 * 1024 * 1024 * 1024;
  else
    return make_error("\"" + text + "\": unknown size unit \"" + text.substr(i) +
                      "\" (use K, M, G or T)");
  return static_cast<int64_t>(std::llround(number * scale));
}

std::vector<uint8_t> rank_plan_request(const backend::KvCacheSpec& spec, const CacheConfig& cache,
                                       int64_t max_model_len, int64_t max_num_seqs,
                                       int64_t activation_bytes) {
  ByteWriter w;
  model::write_kv_spec(w, spec);
  for (const int64_t v : {cache.block_size, cache.kv_cache_memory, cache.num_gpu_blocks_override,
                          max_model_len, max_num_seqs, activation_bytes})
    w.i64(v);
  w.u64(std::bit_cast<uint64_t>(cache.swap_space_gib));
  return w.take();
}

Result<std::vector<int64_t>> plan_rank_memory(const model::Model& model,
                                              std::span<const uint8_t> request) {
  ByteReader r(request);
  VESPER_ASSIGN_OR_RETURN(backend::KvCacheSpec spec, model::read_kv_spec(r));
  CacheConfig cache;
  int64_t max_model_len = 0, max_num_seqs = 0, activation_bytes = 0;
  for (int64_t* v : {&cache.block_size, &cache.kv_cache_memory, &cache.num_gpu_blocks_override,
                     &max_model_len, &max_num_seqs, &activation_bytes}) {
    VESPER_ASSIGN_OR_RETURN(*v, r.i64());
  }
  VESPER_ASSIGN_OR_RETURN(const uint64_t swap_bits, r.u64());
  cache.swap_space_gib = std::bit_cast<double>(swap_bits);
  // This rank's share of the cache: its KV heads of its layers.
  spec.n_layers = model.shard_config().n_layer;
  spec.n_kv_heads = model.shard_config().n_head_kv;
  const backend::KvCacheSpec specs[] = {spec};
  VESPER_ASSIGN_OR_RETURN(const MemoryPlan plan, plan_memory(specs, 0, activation_bytes, cache,
                                                             max_model_len, max_num_seqs));
  return std::vector<int64_t>{plan.num_blocks, plan.num_swap_blocks, plan.bytes_per_block};
}

}  // namespace vesper::engine

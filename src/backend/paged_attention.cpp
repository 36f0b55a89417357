#include "backend/paged_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/check.h"

namespace vesper::backend {

void write_kv(KvCache& cache, int64_t layer, const AttentionBatch& batch, const float* k,
              const float* v) {
  const int64_t n = cache.shape().slot_floats();
  for (int64_t t = 0; t < batch.num_tokens; ++t) {
    const int64_t slot = batch.slot_mapping[t];
    VESPER_CHECK(slot >= 0 && slot < cache.shape().num_slots(), "slot %lld out of range",
                 static_cast<long long>(slot));
    std::memcpy(cache.key(layer, slot), k + t * n, n * sizeof(float));
    std::memcpy(cache.value(layer, slot), v + t * n, n * sizeof(float));
  }
}

namespace {

float dot(const float* a, const float* b, int64_t n) {
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

}  // namespace

void paged_attention(const KvCache& cache, int64_t layer, const AttentionBatch& batch,
                     const float* q, int64_t n_heads, float scale, float* out, ThreadPool& pool) {
  const KvCacheShape& shape = cache.shape();
  const int64_t head_dim = shape.head_dim;
  const int64_t group = n_heads / shape.n_kv_heads;
  VESPER_CHECK(group * shape.n_kv_heads == n_heads, "heads %lld not a multiple of kv heads",
               static_cast<long long>(n_heads));
  const int64_t work = batch.num_tokens * n_heads;
  // Tiny batches (short contexts, small models) run on the calling thread: a pool wake-up would
  // cost more than the work. The result is the same either way.
  int64_t context_work = 0;
  for (int64_t t = 0; t < batch.num_tokens; ++t) context_work += int64_t{batch.positions[t] + 1} * n_heads * head_dim;
  constexpr int64_t kMinParallelWork = int64_t{1} << 16;
  auto body = [&](size_t begin, size_t end) {
    // Per-thread scratch reused across calls; grows to the longest context seen.
    thread_local std::vector<float> scores;
    for (size_t w = begin; w < end; ++w) {
      const int64_t t = static_cast<int64_t>(w) / n_heads;
      const int64_t h = static_cast<int64_t>(w) % n_heads;
      const int64_t kvh = h / group;
      const int64_t n_ctx = batch.positions[t] + 1;
      const int32_t* table = batch.block_tables + batch.table_offsets[batch.token_seq[t]];
      if (static_cast<int64_t>(scores.size()) < n_ctx) scores.resize(n_ctx);
      const float* qv = q + (t * n_heads + h) * head_dim;
      float max_score = -INFINITY;
      for (int64_t j = 0; j < n_ctx; ++j) {
        const int64_t slot = int64_t{table[j / shape.block_size]} * shape.block_size + j % shape.block_size;
        const float s = dot(qv, cache.key(layer, slot) + kvh * head_dim, head_dim) * scale;
        scores[j] = s;
        max_score = std::max(max_score, s);
      }
      double sum = 0.0;
      for (int64_t j = 0; j < n_ctx; ++j) {
        const float e = std::exp(scores[j] - max_score);
        scores[j] = e;
        sum += e;
      }
      const float inv = static_cast<float>(1.0 / sum);
      float* o = out + (t * n_heads + h) * head_dim;
      std::fill(o, o + head_dim, 0.0f);
      for (int64_t j = 0; j < n_ctx; ++j) {
        const int64_t slot = int64_t{table[j / shape.block_size]} * shape.block_size + j % shape.block_size;
        const float p = scores[j] * inv;
        const float* vv = cache.value(layer, slot) + kvh * head_dim;
        for (int64_t d = 0; d < head_dim; ++d) o[d] += p * vv[d];
      }
    }
  };
  if (context_work < kMinParallelWork) body(0, static_cast<size_t>(work));
  else pool.parallel_for(static_cast<size_t>(work), body);
}

}  // namespace vesper::backend

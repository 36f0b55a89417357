#include "backend/paged_attention.h"

#include <atomic>

#include <algorithm>
#include <cstring>
#include <vector>

#include "backend/cpu/attention_cpu.h"
#include "backend/cpu/attention_kernel.h"
#include "core/check.h"

namespace vesper::backend {

namespace {

// Writes tokens [begin, end) of the batch.
void write_tokens(KvCache& cache, int64_t layer, const AttentionBatch& batch, const float* k,
                  const float* v, int64_t begin, int64_t end) {
  const int64_t n = cache.spec().token_elements(), head_dim = cache.spec().head_dim;
  for (int64_t t = begin; t < end; ++t) {
    const int64_t slot = batch.slot_mapping[t];
    // k and v hold a token's heads side by side; the cache keeps each head's rows apart, each
    // encoded in the cache's type with its own scales (kv_codec.h).
    for (int64_t h = 0; h < cache.spec().n_kv_heads; ++h) {
      cache.write_key(layer, slot, h, k + t * n + h * head_dim);
      cache.write_value(layer, slot, h, v + t * n + h * head_dim);
    }
  }
}

}  // namespace

void write_kv(KvCache& cache, int64_t layer, const AttentionBatch& batch, const float* k,
              const float* v, ThreadPool& pool) {
  for (int64_t t = 0; t < batch.num_tokens; ++t) {
    const int64_t slot = batch.slot_mapping[t];
    VESPER_CHECK(slot >= 0 && slot < cache.num_slots(), "slot %lld out of range",
                 static_cast<long long>(slot));
  }
  // --calculate-kv-scales: the layer's first write fixes its fp8 scales, from its own rows.
  if (cache.awaits_calibration(layer) && batch.num_tokens > 0)
    cache.calibrate_layer(layer, k, v, batch.num_tokens);
  // f32 rows are copies, and a few tokens are less work than waking the pool.
  const KvDtypes d = cache.spec().dtypes;
  const bool copies = d.k == KvDtype::kF32 && d.v == KvDtype::kF32;
  if (copies || batch.num_tokens < 8 || pool.num_threads() == 1) {
    write_tokens(cache, layer, batch, k, v, 0, batch.num_tokens);
    return;
  }
  // One pointer-sized capture, so std::function does not allocate.
  struct Job {
    KvCache* cache;
    int64_t layer;
    const AttentionBatch* batch;
    const float *k, *v;
  } job{&cache, layer, &batch, k, v};
  pool.run([&job](int thread, int n_threads) {
    const int64_t tokens = job.batch->num_tokens;
    write_tokens(*job.cache, job.layer, *job.batch, job.k, job.v, tokens * thread / n_threads,
                 tokens * (thread + 1) / n_threads);
  });
}

namespace cpu {
namespace {

// Per-thread kernel scratch. It grows to the largest shape seen and
// is then reused, so steady-state calls do not allocate.
float* thread_scratch(int64_t group, int64_t head_dim, int64_t n_kv_heads) {
  thread_local std::vector<float> scratch;
  const size_t need = attention_scratch_floats(group, head_dim, n_kv_heads);
  if (scratch.size() < need) scratch.resize(need);
  return scratch.data();
}

// Thread `thread` of `n_threads` takes the items whose cumulative cost (keys
// visited, counted before the item) falls in [total * thread / n, total *
// (thread + 1) / n): contiguous ranges of near-equal cost, so a long prefill
// chunk and many short decodes balance. Each item is computed start to finish
// by one thread, so the split cannot change any value; threads write disjoint
// output rows except at the (at most n_threads - 1) range boundaries.
struct Split {
  int64_t begin;
  int64_t end;
};

Split cost_split(const AttentionBatch& batch, int64_t n_kv, int64_t total, int thread,
                 int n_threads) {
  const int64_t lo = total * thread / n_threads, hi = total * (thread + 1) / n_threads;
  const int64_t items = attention_items(batch.num_tokens, n_kv);
  Split s{-1, items};
  int64_t before = 0;
  for (int64_t w = 0; w < items; w += n_kv) {
    int64_t cost = 0;  // of each of the n_kv items of this token block
    const int64_t first = w / n_kv * kAttentionQueryBlock;
    const int64_t last = std::min(first + kAttentionQueryBlock, batch.num_tokens);
    for (int64_t t = first; t < last; ++t) cost += int64_t{batch.positions[t]} + 1;
    for (int64_t g = 0; g < n_kv; ++g, before += cost) {
      if (s.begin < 0 && before >= lo) s.begin = w + g;
      if (before >= hi) {
        s.end = w + g;
        return s.begin < 0 ? Split{0, 0} : s;
      }
    }
  }
  return s.begin < 0 ? Split{0, 0} : s;
}

}  // namespace

void paged_attention_with_isa(Isa isa, const KvCache& cache, int64_t layer,
                              const AttentionBatch& batch, const float* q, int64_t n_heads,
                              float scale, float* out, ThreadPool& pool) {
  VESPER_CHECK(isa_available(isa), "paged_attention: instruction set %s not available",
               isa_name(isa).data());
  const KvCacheSpec& shape = cache.spec();
  const int64_t n_kv = shape.n_kv_heads;
  const int64_t group = n_heads / n_kv;
  VESPER_CHECK(group >= 1 && group * n_kv == n_heads, "heads %lld not a multiple of kv heads %lld",
               static_cast<long long>(n_heads), static_cast<long long>(n_kv));
  if (batch.num_tokens == 0) return;
  const AttentionKernel kernel =
      isa == Isa::kScalar ? paged_attention_scalar : paged_attention_avx2;
  static std::atomic<uint64_t> calls{0};
  const AttentionArgs args{&cache, layer, batch, q, n_heads, group, scale, out, ++calls};

  int64_t keys = 0;  // key rows visited per KV head, summed over tokens
  for (int64_t t = 0; t < batch.num_tokens; ++t) keys += int64_t{batch.positions[t]} + 1;
  // Small batches (short contexts, small models) run on the calling thread: a
  // pool wake-up costs more than the work. The result is the same either way.
  constexpr int64_t kMinParallelMacs = int64_t{1} << 15;
  const int64_t items = attention_items(batch.num_tokens, n_kv);
  if (keys * n_heads * shape.head_dim < kMinParallelMacs || pool.num_threads() == 1) {
    kernel(args, 0, items, thread_scratch(group, shape.head_dim, n_kv));
    return;
  }
  // One pointer-sized capture, so std::function does not allocate.
  struct Job {
    AttentionKernel kernel;
    const AttentionArgs* args;
    int64_t total;
  } job{kernel, &args, keys * n_kv};
  pool.run([&job](int thread, int n_threads) {
    const AttentionArgs& a = *job.args;
    const Split s = cost_split(a.batch, a.cache->spec().n_kv_heads, job.total, thread, n_threads);
    if (s.begin >= s.end) return;
    const KvCacheSpec& spec = a.cache->spec();
    job.kernel(a, s.begin, s.end, thread_scratch(a.group, spec.head_dim, spec.n_kv_heads));
  });
}

}  // namespace cpu

void paged_attention(const KvCache& cache, int64_t layer, const AttentionBatch& batch,
                     const float* q, int64_t n_heads, float scale, float* out, ThreadPool& pool) {
  cpu::paged_attention_with_isa(cpu::selected_isa(), cache, layer, batch, q, n_heads, scale, out,
                                pool);
}

}  // namespace vesper::backend

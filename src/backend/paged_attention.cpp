#include "backend/paged_attention.h"

#include <atomic>

#include <algorithm>
#include <cstring>
#include <span>
#include <vector>

#include "backend/cpu/attention_cpu.h"
#include "backend/cpu/attention_kernel.h"
#include "backend/kv_table_layout.h"
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

// Quest: each block the batch wrote gets its key bounds over its rows up to the highest one
// written (rows of a block are written in order within a call: one sequence's positions).
void update_key_bounds(KvCache& cache, int64_t layer, const AttentionBatch& batch) {
  const int64_t rows = cache.spec().residual_rows_per_block();
  thread_local std::vector<std::pair<int64_t, int64_t>> last;  // (block, row)
  last.clear();
  for (int64_t t = 0; t < batch.num_tokens; ++t)
    last.emplace_back(batch.slot_mapping[t] / rows, batch.slot_mapping[t] % rows);
  std::sort(last.begin(), last.end());
  for (size_t i = 0; i < last.size(); ++i)
    if (i + 1 == last.size() || last[i + 1].first != last[i].first)
      cache.update_key_bounds(layer, last[i].first, last[i].second);
}

}  // namespace

namespace {

// write_kv's rows, over the pool's threads.
void write_rows(KvCache& cache, int64_t layer, const AttentionBatch& batch, const float* k,
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

}  // namespace

void write_kv(KvCache& cache, int64_t layer, const AttentionBatch& batch, const float* k,
              const float* v, ThreadPool& pool) {
  write_rows(cache, layer, batch, k, v, pool);
  if (cache.spec().key_bounds) update_key_bounds(cache, layer, batch);
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

// Splits the items into n_chunks contiguous ranges of near-equal cost (keys visited): range c
// holds the items whose cumulative cost, counted before the item, falls in
// [total * c / n_chunks, total * (c + 1) / n_chunks), so a long prefill chunk and many short
// decodes balance. Writes the n_chunks + 1 range boundaries to `bounds` (range c is
// [bounds[c], bounds[c + 1]); some may be empty). Each item is computed start to finish by one
// thread, so the split cannot change any value; threads write disjoint output rows except at the
// range boundaries.
void cost_bounds(const AttentionBatch& batch, int64_t n_kv, bool heads_outer, int64_t total,
                 int64_t n_chunks, std::vector<int64_t>& bounds) {
  const int64_t n_blocks = attention_blocks(batch.num_tokens);
  const int64_t items = n_blocks * n_kv;
  thread_local std::vector<int64_t> block_cost;  // of each token block's item through a KV head
  block_cost.assign(static_cast<size_t>(n_blocks), 0);
  for (int64_t t = 0; t < batch.num_tokens; ++t)
    block_cost[static_cast<size_t>(t / kAttentionQueryBlock)] += int64_t{batch.positions[t]} + 1;
  bounds.assign(static_cast<size_t>(n_chunks + 1), items);
  bounds[0] = 0;
  int64_t c = 1, before = 0;  // the next boundary to place, and the cost before item w
  for (int64_t w = 0; w < items && c < n_chunks; ++w) {
    while (c < n_chunks && before >= total * c / n_chunks) bounds[static_cast<size_t>(c++)] = w;
    before += block_cost[static_cast<size_t>(attention_item(heads_outer, n_blocks, n_kv, w).block)];
  }
}

// Whether a batch's attention items go KV head by KV head (AttentionArgs::heads_outer): where
// every sequence brings two tokens or more (prompt chunks, no decode tokens), so that a thread's
// consecutive items are one KV head's consecutive token blocks, which read the same tiles, and
// those stay in L2. Token block by token block, a 512-token prompt's 12 heads (the 110M model's)
// hold 1.5 MB of f16 keys and values a layer at the end, more than a core's L2, and each block
// read every tile from L3 again. A small gain, measured end to end (`vesper bench latency` on the
// 110M Q4_0 model, 2 threads, AMD Zen 5, before/after alternated): pp512 a median 1.4% faster
// over 30 pairs, pp1536 2.1% over 10. A batch with decode tokens keeps the token blocks outer, so
// that a decode token reads its KV heads side by side (attend_decode_heads).
bool prompts_only(const AttentionBatch& batch) {
  for (int64_t t = 0; t < batch.num_tokens; ++t) {
    const int32_t seq = batch.token_seq[t];
    const bool alone = (t == 0 || batch.token_seq[t - 1] != seq) &&
                       (t + 1 == batch.num_tokens || batch.token_seq[t + 1] != seq);
    if (alone) return false;
  }
  return true;
}

// Group b's key bounds through KV head g ([2][head_dim]): its block's (a plain cache's block, or a
// KIVI group stored quantized), or the union of a KIVI group's residual blocks' bounds, as
// KvCache::quantize_group stores them.
const float* group_bounds(const KvCache& cache, int64_t layer, const int32_t* table,
                          const KvTableLayout& layout, int64_t b, int64_t g,
                          std::vector<float>& merged) {
  const int64_t entry = layout.group_entry(b);
  if (layout.blocks_per_group == 1 || b < layout.quantized_groups)
    return cache.key_bounds(layer, table[entry], g);
  merged.resize(static_cast<size_t>(2 * cache.spec().head_dim));
  cache.union_key_bounds(
      layer, std::span<const int32_t>(table + entry, static_cast<size_t>(layout.blocks_per_group)),
      g, merged.data());
  return merged.data();
}

// q.k's upper bound over one block through one KV head: the sum over the head's `group` query
// heads and the channels of max(q * key minimum, q * key maximum), channel c added into lane c % 8
// (query heads in order) and the 8 lanes then summed in order: a fixed order, which the compiler
// carries out in vector registers.
float bound_score(const float* q, int64_t group, int64_t hd, const float* lo, const float* hi) {
  float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int64_t h = 0; h < group; ++h, q += hd) {
    int64_t c = 0;
    for (; c + 8 <= hd; c += 8)
      for (int64_t i = 0; i < 8; ++i)
        lane[i] += std::max(q[c + i] * lo[c + i], q[c + i] * hi[c + i]);
    for (; c < hd; ++c) lane[c % 8] += std::max(q[c] * lo[c], q[c] * hi[c]);
  }
  float score = 0.0f;
  for (float x : lane) score += x;
  return score;
}

// Quest: how many blocks row t reads through each KV head (0: every block, its context is within
// its budget): the first, its own, and budget / block_size - 2 others at most.
int64_t quest_blocks(const AttentionBatch& batch, int64_t bs, int64_t t) {
  const int64_t pos = batch.positions[t], budget = batch.block_budget[t];
  if (budget <= 0 || pos + 1 <= budget) return 0;
  VESPER_CHECK(batch.gap_begin == nullptr || batch.gap_begin[t] >= batch.gap_end[t],
               "a row with both a gap and a block budget");
  const int64_t own = pos / bs;
  const int64_t chosen =
      std::min(std::max<int64_t>(0, budget / bs - 2), std::max<int64_t>(0, own - 1));
  return 1 + chosen + (own > 0 ? 1 : 0);
}

}  // namespace

// Quest's choice for row t through KV head g (AttentionBatch::block_budget), into its place in
// args.sel_blocks (block b: the tokens [b * block_size, (b + 1) * block_size), a KIVI cache's
// group b). Plain f32 arithmetic in this one translation unit, so every instruction set walks the
// same blocks; each work item selects for its own rows and KV heads, so selections run in
// parallel, each beside the walk that reads its blocks.
void select_quest_blocks(const AttentionArgs& args, int64_t t, int64_t g) {
  const KvCache& cache = *args.cache;
  const KvCacheSpec& spec = cache.spec();
  VESPER_CHECK(spec.key_bounds, "Quest needs a cache with key bounds");
  const AttentionBatch& batch = args.batch;
  const int64_t n_kv = spec.n_kv_heads, hd = spec.head_dim, bs = spec.block_size;
  const int64_t pos = batch.positions[t], budget = batch.block_budget[t];
  const int32_t seq = batch.token_seq[t];
  const int32_t* table = batch.block_tables + batch.table_offsets[seq];
  const KvTableLayout layout = KvTableLayout(spec).with_quantized(
      batch.quantized_groups != nullptr ? batch.quantized_groups[seq] : 0);
  const int64_t own = pos / bs;
  const int64_t keep = std::max<int64_t>(0, budget / bs - 2);
  const float* q = args.q + (t * args.n_heads + g * args.group) * hd;
  thread_local std::vector<std::pair<float, int32_t>> scored;
  thread_local std::vector<float> merged;
  scored.clear();
  for (int64_t b = 1; b < own; ++b) {
    const float* lo = group_bounds(cache, args.layer, table, layout, b, g, merged);
    scored.emplace_back(bound_score(q, args.group, hd, lo, lo + hd), static_cast<int32_t>(b));
  }
  const auto first = [](const std::pair<float, int32_t>& x, const std::pair<float, int32_t>& y) {
    return x.first > y.first || (x.first == y.first && x.second < y.second);
  };
  const auto kept =
      static_cast<size_t>(std::min<int64_t>(keep, static_cast<int64_t>(scored.size())));
  std::partial_sort(scored.begin(), scored.begin() + static_cast<std::ptrdiff_t>(kept),
                    scored.end(), first);
  std::sort(scored.begin(), scored.begin() + static_cast<std::ptrdiff_t>(kept),
            [](const auto& x, const auto& y) { return x.second < y.second; });
  int32_t* out = args.sel_blocks + args.sel_offsets[t * n_kv + g];
  *out++ = 0;
  for (size_t i = 0; i < kept; ++i) *out++ = scored[i].second;
  if (own > 0) *out++ = static_cast<int32_t>(own);
  VESPER_CHECK(out == args.sel_blocks + args.sel_offsets[t * n_kv + g + 1],
               "Quest: row %lld chose a list of another length than counted",
               static_cast<long long>(t));
}

AttentionKernel attention_kernel(Isa isa) {
  VESPER_CHECK(isa_available(isa), "paged_attention: instruction set %s not available",
               isa_name(isa).data());
  switch (isa) {
    case Isa::kScalar:
      return paged_attention_scalar;
    case Isa::kAvx2:
      return paged_attention_avx2;
    case Isa::kAvx512Vnni:
      return paged_attention_avx512;
  }
  return paged_attention_scalar;
}

void paged_attention_with_isa(Isa isa, const KvCache& cache, int64_t layer,
                              const AttentionBatch& batch, const float* q, int64_t n_heads,
                              float scale, float* out, ThreadPool& pool) {
  paged_attention_with_kernel(attention_kernel(isa), cache, layer, batch, q, n_heads, scale, out,
                              pool);
}

void paged_attention_with_kernel(AttentionKernel kernel, const KvCache& cache, int64_t layer,
                                 const AttentionBatch& batch, const float* q, int64_t n_heads,
                                 float scale, float* out, ThreadPool& pool) {
  const KvCacheSpec& shape = cache.spec();
  const int64_t n_kv = shape.n_kv_heads;
  const int64_t group = n_heads / n_kv;
  VESPER_CHECK(group >= 1 && group * n_kv == n_heads, "heads %lld not a multiple of kv heads %lld",
               static_cast<long long>(n_heads), static_cast<long long>(n_kv));
  if (batch.num_tokens == 0) return;
  static std::atomic<uint64_t> calls{0};
  AttentionArgs args{&cache, layer, batch,   q,       n_heads, group,
                     scale,  out,   ++calls, nullptr, nullptr};
  // Quest: each row's list lengths here; the work items fill the lists (select_quest_blocks).
  thread_local std::vector<int32_t> sel_offsets, sel_blocks;
  if (batch.block_budget != nullptr) {
    sel_offsets.assign(static_cast<size_t>(batch.num_tokens * n_kv + 1), 0);
    for (int64_t t = 0; t < batch.num_tokens; ++t) {
      const auto n = static_cast<int32_t>(quest_blocks(batch, shape.block_size, t));
      for (int64_t g = 0; g < n_kv; ++g) {
        const auto at = static_cast<size_t>(t * n_kv + g);
        sel_offsets[at + 1] = sel_offsets[at] + n;
      }
    }
    sel_blocks.resize(static_cast<size_t>(sel_offsets.back()));
    args.sel_offsets = sel_offsets.data();
    args.sel_blocks = sel_blocks.data();
  }

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
  // The items in up to 8 ranges of near-equal cost a thread, taken by the threads as
  // ThreadPool::for_each_piece deals them: a thread that starts late or is descheduled on a shared
  // machine leaves part of its share to the others. One pointer-sized capture, so std::function
  // does not allocate.
  struct Job {
    AttentionKernel kernel;
    const AttentionArgs* args;
    const std::vector<int64_t>* bounds;
  };
  thread_local std::vector<int64_t> bounds;  // reused: steady-state calls do not allocate
  // Ranges of at least half a token block's KV heads where the items allow: a decode token walks
  // the heads of its range side by side (attend_decode_heads), and a range of one head read 2 KB
  // runs of each block (f16, head size 64) where a range of 6 read 12 KB, about 1.3x slower from
  // memory (vesper_microbench BM_PagedAttentionDecode, 8 sequences x 2,048 positions).
  const int64_t threads = pool.num_threads();
  const int64_t n_ranges =
      std::clamp(items / std::max<int64_t>(1, n_kv / 2), threads, int64_t{8} * threads);
  args.heads_outer = prompts_only(batch);
  cost_bounds(batch, n_kv, args.heads_outer, keys * n_kv, n_ranges, bounds);
  const Job job{kernel, &args, &bounds};
  const Job* const jp = &job;
  pool.for_each_piece(n_ranges, [jp](int64_t r) {
    const AttentionArgs& a = *jp->args;
    const KvCacheSpec& spec = a.cache->spec();
    const int64_t begin = (*jp->bounds)[static_cast<size_t>(r)];
    const int64_t end = (*jp->bounds)[static_cast<size_t>(r) + 1];
    if (begin < end)
      jp->kernel(a, begin, end, thread_scratch(a.group, spec.head_dim, spec.n_kv_heads));
  });
}

}  // namespace cpu

void paged_attention(const KvCache& cache, int64_t layer, const AttentionBatch& batch,
                     const float* q, int64_t n_heads, float scale, float* out, ThreadPool& pool) {
  cpu::paged_attention_with_isa(cpu::selected_isa(), cache, layer, batch, q, n_heads, scale, out,
                                pool);
}

}  // namespace vesper::backend

// backend::paged_attention (head_dim 64, 16-token blocks), at the shapes of the 110M model's heads
// (12 query / 12 KV) and the 1B model's (32 / 8, grouped-query):
// - BM_PagedAttentionDecode: each of `seqs` sequences has one new token attending to `context`
//   cached tokens, the step that dominates decoding at long contexts. bytes_per_second counts the
//   K and V read; items_per_second, decoded tokens.
// - BM_PagedAttentionPrefill: one prompt of `tokens` tokens attending causally to itself (pp512's
//   attention). items_per_second counts prompt tokens; FLOPS, the dot products' multiply-adds
//   (2 per key and dimension for scores, 2 for values).
#include <benchmark/benchmark.h>

#include <numeric>
#include <random>
#include <vector>

#include "backend/kv_cache.h"
#include "backend/paged_attention.h"
#include "core/thread_pool.h"

namespace {

constexpr int64_t kHeadDim = 64;
constexpr int64_t kBlockSize = 16;

// Every K and V element of layer 0 uniform in [-1, 1).
void fill_cache(vesper::backend::KvCache& cache, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  const vesper::backend::KvCacheShape& shape = cache.shape();
  for (int64_t slot = 0; slot < shape.num_slots(); ++slot)
    for (int64_t h = 0; h < shape.n_kv_heads; ++h)
      for (int64_t i = 0; i < shape.head_dim; ++i) {
        cache.key(0, slot, h)[i] = dist(rng);
        cache.value(0, slot, h)[i] = dist(rng);
      }
}

// Args: cached tokens per sequence, sequences, query heads, KV heads, threads.
void BM_PagedAttentionDecode(benchmark::State& state) {
  const int64_t context = state.range(0), seqs = state.range(1);
  const int64_t n_heads = state.range(2), n_kv_heads = state.range(3);
  const int threads = static_cast<int>(state.range(4));
  const int64_t blocks_per_seq = (context + kBlockSize - 1) / kBlockSize;
  vesper::backend::KvCacheShape shape;
  shape.n_layers = 1;
  shape.n_blocks = blocks_per_seq * seqs;
  shape.block_size = kBlockSize;
  shape.n_kv_heads = n_kv_heads;
  shape.head_dim = kHeadDim;
  vesper::backend::KvCache cache(shape);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  fill_cache(cache, rng);
  // Sequence s owns blocks [s * blocks_per_seq, (s + 1) * blocks_per_seq); its new token is the
  // last of `context` positions, so it reads all of them.
  std::vector<int32_t> positions(seqs, static_cast<int32_t>(context - 1)), token_seq(seqs);
  std::iota(token_seq.begin(), token_seq.end(), 0);
  std::vector<int64_t> slots(seqs);
  std::vector<int32_t> tables(shape.n_blocks), offsets(seqs + 1);
  std::iota(tables.begin(), tables.end(), 0);
  for (int64_t s = 0; s < seqs; ++s) slots[s] = s * blocks_per_seq * kBlockSize + context - 1;
  for (int64_t s = 0; s <= seqs; ++s) offsets[s] = static_cast<int32_t>(s * blocks_per_seq);
  vesper::backend::AttentionBatch batch;
  batch.num_tokens = seqs;
  batch.positions = positions.data();
  batch.token_seq = token_seq.data();
  batch.slot_mapping = slots.data();
  batch.block_tables = tables.data();
  batch.table_offsets = offsets.data();
  std::vector<float> q(seqs * n_heads * kHeadDim), out(q.size());
  for (auto& v : q) v = dist(rng);
  vesper::ThreadPool pool(threads);
  const float scale = 1.0f / 8.0f;  // 1 / sqrt(head_dim)
  for (auto _ : state) {
    vesper::backend::paged_attention(cache, 0, batch, q.data(), n_heads, scale, out.data(), pool);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  const int64_t kv_bytes =
      2 * seqs * context * n_kv_heads * kHeadDim * static_cast<int64_t>(sizeof(float));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * kv_bytes);
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) * seqs);
}

// Args: prompt tokens, query heads, KV heads, threads.
void BM_PagedAttentionPrefill(benchmark::State& state) {
  const int64_t tokens = state.range(0);
  const int64_t n_heads = state.range(1), n_kv_heads = state.range(2);
  const int threads = static_cast<int>(state.range(3));
  vesper::backend::KvCacheShape shape;
  shape.n_layers = 1;
  shape.n_blocks = (tokens + kBlockSize - 1) / kBlockSize;
  shape.block_size = kBlockSize;
  shape.n_kv_heads = n_kv_heads;
  shape.head_dim = kHeadDim;
  vesper::backend::KvCache cache(shape);
  std::mt19937 rng(2);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  fill_cache(cache, rng);
  // One sequence owning blocks 0 .. n_blocks - 1; token t is at position t.
  std::vector<int32_t> positions(tokens), token_seq(tokens, 0);
  std::iota(positions.begin(), positions.end(), 0);
  std::vector<int64_t> slots(tokens);
  std::iota(slots.begin(), slots.end(), 0);
  std::vector<int32_t> tables(shape.n_blocks), offsets = {0, static_cast<int32_t>(shape.n_blocks)};
  std::iota(tables.begin(), tables.end(), 0);
  vesper::backend::AttentionBatch batch;
  batch.num_tokens = tokens;
  batch.positions = positions.data();
  batch.token_seq = token_seq.data();
  batch.slot_mapping = slots.data();
  batch.block_tables = tables.data();
  batch.table_offsets = offsets.data();
  std::vector<float> q(tokens * n_heads * kHeadDim), out(q.size());
  for (auto& v : q) v = dist(rng);
  vesper::ThreadPool pool(threads);
  const float scale = 1.0f / 8.0f;
  for (auto _ : state) {
    vesper::backend::paged_attention(cache, 0, batch, q.data(), n_heads, scale, out.data(), pool);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) * tokens);
  // Token t reads t + 1 keys: tokens (tokens + 1) / 2 (query, key) pairs per head.
  const double pairs = static_cast<double>(tokens) * static_cast<double>(tokens + 1) / 2.0;
  state.counters["FLOPS"] =
      benchmark::Counter(pairs * static_cast<double>(n_heads) * 4.0 * kHeadDim,
                         benchmark::Counter::kIsIterationInvariantRate);
}

void attention_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"context", "seqs", "heads", "kv_heads", "threads"});
  const int64_t hw = vesper::ThreadPool::hardware_threads();
  for (int64_t context : {512, 2048})
    for (int64_t seqs : {1, 8})
      for (auto [heads, kv_heads] : {std::pair<int64_t, int64_t>{12, 12}, {32, 8}})
        b->Args({context, seqs, heads, kv_heads, hw});
}

BENCHMARK(BM_PagedAttentionDecode)
    ->Apply(attention_args)
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

void prefill_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"tokens", "heads", "kv_heads", "threads"});
  const int64_t hw = vesper::ThreadPool::hardware_threads();
  for (auto [heads, kv_heads] : {std::pair<int64_t, int64_t>{12, 12}, {32, 8}})
    b->Args({512, heads, kv_heads, hw});
}

BENCHMARK(BM_PagedAttentionPrefill)
    ->Apply(prefill_args)
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace

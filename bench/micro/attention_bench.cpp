// backend::paged_attention (head_dim 64, 16-token blocks), at the shapes of the 110M model's heads
// (12 query / 12 KV) and the 1B model's (32 / 8, grouped-query):
// - BM_PagedAttentionDecode: each of `seqs` sequences has one new token attending to `context`
//   cached tokens, the step that dominates decoding at long contexts, for each KV cache type
//   (`kv`: the index in kRowKvDtypes: 0 f32, 1 f16, 2 bf16, 3 fp8_e4m3, 4 fp8_e5m2, 5 int8).
//   bytes_per_second counts the K and V bytes read (as stored, scales included);
//   items_per_second, decoded tokens. With `layers` > 1 an iteration is a whole decode step: every
//   layer in turn, so the K/V read (1.4 GB of f16 at 32 sequences of 1,024 tokens, 12 layers)
//   comes from memory, not from the last level cache, as in serving.
// - BM_PagedAttentionDecodeLockstep: the same at the 110M model's shape, 12 layers, short contexts
//   and the sequences' blocks interleaved, as batched decode's block tables leave them.
// - BM_PagedAttentionPrefill: one prompt of `tokens` tokens attending causally to itself (pp512's
//   attention), on each vector kernel this CPU runs (`isa`: 1 AVX2, 2 AVX-512, as cpu::Isa; the
//   label names it), so that they compare in one run. items_per_second counts prompt tokens;
//   FLOPS, the dot products' multiply-adds (2 per key and dimension for scores, 2 for values).
#include <benchmark/benchmark.h>

#include <iterator>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/attention_cpu.h"
#include "backend/kv_cache.h"
#include "backend/paged_attention.h"
#include "core/thread_pool.h"

namespace {

constexpr int64_t kHeadDim = 64;
constexpr int64_t kBlockSize = 16;

// Every K and V element of layer `layer`'s slots [begin, end) (all of them by default) uniform
// in [-1, 1), encoded in the cache's types.
void fill_cache(vesper::backend::KvCache& cache, std::mt19937& rng, int64_t begin = 0,
                int64_t end = -1, int64_t layer = 0) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  const vesper::backend::KvCacheSpec& shape = cache.spec();
  std::vector<float> k(shape.head_dim), v(shape.head_dim);
  for (int64_t slot = begin; slot < (end < 0 ? cache.num_slots() : end); ++slot)
    for (int64_t h = 0; h < shape.n_kv_heads; ++h) {
      for (int64_t i = 0; i < shape.head_dim; ++i) {
        k[i] = dist(rng);
        v[i] = dist(rng);
      }
      cache.write_key(layer, slot, h, k.data());
      cache.write_value(layer, slot, h, v.data());
    }
}

// `layers` layers of 16-token blocks of kHeadDim, n_kv_heads heads, keys and values of `dtype`.
vesper::backend::KvCacheSpec cache_spec(
    int64_t n_kv_heads, vesper::backend::KvDtype dtype = vesper::backend::KvDtype::kF32,
    int64_t layers = 1) {
  vesper::backend::KvCacheSpec spec;
  spec.dtypes = {dtype, dtype};
  spec.n_layers = layers;
  spec.block_size = kBlockSize;
  spec.n_kv_heads = n_kv_heads;
  spec.head_dim = kHeadDim;
  return spec;
}

// A batch's arrays, and the AttentionBatch that points into them.
struct BatchArrays {
  std::vector<int32_t> positions, token_seq, tables, offsets;
  std::vector<int64_t> slots;
  vesper::backend::AttentionBatch batch() const {
    vesper::backend::AttentionBatch b;
    b.num_tokens = static_cast<int64_t>(positions.size());
    b.positions = positions.data();
    b.token_seq = token_seq.data();
    b.slot_mapping = slots.data();
    b.block_tables = tables.data();
    b.table_offsets = offsets.data();
    return b;
  }
};

// Times paged_attention over `arrays` on `threads` threads, with queries (n_heads per token)
// uniform in [-1, 1), on each of the cache's layers in turn.
// Times paged_attention over every layer of `cache`: the kernel the CPU selects, or `isa`'s.
void time_attention(benchmark::State& state, const vesper::backend::KvCache& cache,
                    const BatchArrays& arrays, int64_t n_heads, int threads, std::mt19937& rng,
                    const int32_t* quantized_groups = nullptr, int isa = -1) {
  vesper::backend::AttentionBatch batch = arrays.batch();
  batch.quantized_groups = quantized_groups;
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> q(batch.num_tokens * n_heads * kHeadDim), out(q.size());
  for (auto& v : q) v = dist(rng);
  vesper::ThreadPool pool(threads);
  const float scale = 1.0f / 8.0f;  // 1 / sqrt(head_dim)
  for (auto _ : state) {
    for (int64_t layer = 0; layer < cache.spec().n_layers; ++layer) {
      if (isa < 0) {
        vesper::backend::paged_attention(cache, layer, batch, q.data(), n_heads, scale, out.data(),
                                         pool);
      } else {
        vesper::backend::cpu::paged_attention_with_isa(static_cast<vesper::backend::cpu::Isa>(isa),
                                                       cache, layer, batch, q.data(), n_heads,
                                                       scale, out.data(), pool);
      }
    }
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
}

// One decode step of `seqs` sequences, each with one new token attending to `context` cached
// tokens: sequence s's block j is block j * seqs + s where `interleaved` (the order in which the
// block pool hands blocks to sequences that grow in lockstep, as in batched decode), else
// s * blocks_per_seq + j (each sequence's blocks adjacent).
void time_decode(benchmark::State& state, int64_t context, int64_t seqs, int64_t n_heads,
                 int64_t n_kv_heads, int threads, vesper::backend::KvDtype dtype, int64_t layers,
                 bool interleaved) {
  state.SetLabel(std::string(vesper::backend::kv_dtype_name(dtype)));
  const int64_t blocks_per_seq = (context + kBlockSize - 1) / kBlockSize;
  vesper::backend::KvCache cache(cache_spec(n_kv_heads, dtype, layers), blocks_per_seq * seqs);
  std::mt19937 rng(1);
  for (int64_t layer = 0; layer < layers; ++layer) fill_cache(cache, rng, 0, -1, layer);
  // Its new token is the last of `context` positions, so it reads all of them.
  BatchArrays a;
  a.positions.assign(seqs, static_cast<int32_t>(context - 1));
  a.token_seq.resize(seqs);
  std::iota(a.token_seq.begin(), a.token_seq.end(), 0);
  a.tables.resize(blocks_per_seq * seqs);
  for (int64_t s = 0; s < seqs; ++s)
    for (int64_t j = 0; j < blocks_per_seq; ++j)
      a.tables[s * blocks_per_seq + j] =
          static_cast<int32_t>(interleaved ? j * seqs + s : s * blocks_per_seq + j);
  a.slots.resize(seqs);
  for (int64_t s = 0; s < seqs; ++s)
    a.slots[s] = a.tables[s * blocks_per_seq + (context - 1) / kBlockSize] * kBlockSize +
                 (context - 1) % kBlockSize;
  a.offsets.resize(seqs + 1);
  for (int64_t s = 0; s <= seqs; ++s) a.offsets[s] = static_cast<int32_t>(s * blocks_per_seq);
  time_attention(state, cache, a, n_heads, threads, rng);
  const int64_t kv_bytes = layers * seqs * context * n_kv_heads *
                           (cache.spec().key_row_bytes() + cache.spec().value_row_bytes());
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * kv_bytes);
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) * seqs);
}

// Args: cached tokens per sequence, sequences, query heads, KV heads, threads, KV type, layers.
// Each sequence's blocks adjacent.
void BM_PagedAttentionDecode(benchmark::State& state) {
  time_decode(state, state.range(0), state.range(1), state.range(2), state.range(3),
              static_cast<int>(state.range(4)), vesper::backend::kRowKvDtypes[state.range(5)],
              state.range(6), false);
}

// Args: cached tokens per sequence, sequences, threads, KV type; the 110M model's shape, 12
// layers, the sequences' blocks interleaved as batched decode leaves them (`vesper bench latency
// --decode-seqs 32`'s steps read 1 to 128 tokens of 32 sequences so).
void BM_PagedAttentionDecodeLockstep(benchmark::State& state) {
  time_decode(state, state.range(0), state.range(1), 12, 12, static_cast<int>(state.range(2)),
              vesper::backend::kRowKvDtypes[state.range(3)], 12, true);
}

// Args: cached tokens per sequence, sequences, query heads, KV heads, threads, KIVI type (index in
// kKiviKvDtypes). Groups of 32 tokens, residual window 128: each sequence's groups before
// kivi_quantized_tokens(context - 1) are stored quantized (one block each, as the engine's
// compaction leaves them), the rest as residual rows.
void BM_PagedAttentionDecodeKivi(benchmark::State& state) {
  const int64_t context = state.range(0), seqs = state.range(1);
  const int64_t n_heads = state.range(2), n_kv_heads = state.range(3);
  const int threads = static_cast<int>(state.range(4));
  const vesper::backend::KvDtype dtype = vesper::backend::kKiviKvDtypes[state.range(5)];
  state.SetLabel(std::string(vesper::backend::kv_dtype_name(dtype)));
  vesper::backend::KvCacheSpec spec = cache_spec(n_kv_heads, dtype);
  spec.block_size = 32;
  spec.kivi_residual_length = 128;
  const int64_t g = spec.block_size, per_group = spec.residual_blocks_per_group();
  const int64_t rows_per = spec.residual_rows_per_block();
  const int64_t groups = (context + g - 1) / g;
  const int64_t quantized = spec.kivi_quantized_tokens(context - 1) / g;
  // Per sequence: its quantized blocks, its residual groups' blocks, and one group of scratch
  // blocks the quantized groups' rows are written to first.
  const int64_t blocks_per_seq = quantized + (groups - quantized + 1) * per_group;
  vesper::backend::KvCache cache(spec, blocks_per_seq * seqs);
  std::mt19937 rng(1);
  fill_cache(cache, rng);  // every residual row; the quantized groups' rows come from scratch
  BatchArrays a;
  a.offsets.push_back(0);
  for (int64_t s = 0; s < seqs; ++s) {
    const int32_t base = static_cast<int32_t>(s * blocks_per_seq);
    const int32_t scratch = static_cast<int32_t>(base + blocks_per_seq - per_group);
    std::vector<int32_t> rows(static_cast<size_t>(per_group));
    std::iota(rows.begin(), rows.end(), scratch);
    for (int64_t q = 0; q < quantized; ++q) {
      fill_cache(cache, rng, int64_t{scratch} * rows_per, (scratch + per_group) * rows_per);
      cache.quantize_group(rows, base + q);
    }
    for (int64_t b = 0; b < blocks_per_seq - per_group; ++b) a.tables.push_back(base + b);
    a.offsets.push_back(static_cast<int32_t>(a.tables.size()));
    a.positions.push_back(static_cast<int32_t>(context - 1));
    a.token_seq.push_back(static_cast<int32_t>(s));
    const int64_t r = context - 1 - (groups - 1) * g;  // the new token's row in its group
    a.slots.push_back(int64_t{a.tables[a.offsets[s] + quantized +
                                       (groups - 1 - quantized) * per_group + r / rows_per]} *
                          rows_per +
                      r % rows_per);
  }
  std::vector<int32_t> quantized_groups(static_cast<size_t>(seqs), static_cast<int32_t>(quantized));
  time_attention(state, cache, a, n_heads, threads, rng, quantized_groups.data());
  const int64_t kv_bytes =
      seqs * n_kv_heads *
      (quantized * (spec.key_unit_bytes() + spec.value_unit_bytes()) +
       (context - quantized * g) * (spec.key_row_bytes() + spec.value_row_bytes()));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * kv_bytes);
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) * seqs);
}

// Args: prompt tokens, query heads, KV heads, threads, KV type (index in kRowKvDtypes).
void BM_PagedAttentionPrefill(benchmark::State& state) {
  const int64_t tokens = state.range(0);
  const int64_t n_heads = state.range(1), n_kv_heads = state.range(2);
  const int threads = static_cast<int>(state.range(3));
  const vesper::backend::KvDtype dtype = vesper::backend::kRowKvDtypes[state.range(4)];
  const auto isa = static_cast<int>(state.range(5));
  state.SetLabel(
      std::string(vesper::backend::kv_dtype_name(dtype)) + " " +
      std::string(vesper::backend::cpu::isa_name(static_cast<vesper::backend::cpu::Isa>(isa))));
  const int64_t n_blocks = (tokens + kBlockSize - 1) / kBlockSize;
  vesper::backend::KvCache cache(cache_spec(n_kv_heads, dtype), n_blocks);
  std::mt19937 rng(2);
  fill_cache(cache, rng);
  // One sequence owning blocks 0 .. n_blocks - 1; token t is at position t.
  BatchArrays a;
  a.positions.resize(tokens);
  std::iota(a.positions.begin(), a.positions.end(), 0);
  a.token_seq.assign(tokens, 0);
  a.slots.resize(tokens);
  std::iota(a.slots.begin(), a.slots.end(), 0);
  a.tables.resize(n_blocks);
  std::iota(a.tables.begin(), a.tables.end(), 0);
  a.offsets = {0, static_cast<int32_t>(n_blocks)};
  time_attention(state, cache, a, n_heads, threads, rng, nullptr, isa);
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) * tokens);
  // Token t reads t + 1 keys: tokens (tokens + 1) / 2 (query, key) pairs per head.
  const double pairs = static_cast<double>(tokens) * static_cast<double>(tokens + 1) / 2.0;
  state.counters["FLOPS"] =
      benchmark::Counter(pairs * static_cast<double>(n_heads) * 4.0 * kHeadDim,
                         benchmark::Counter::kIsIterationInvariantRate);
}

void attention_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"context", "seqs", "heads", "kv_heads", "threads", "kv", "layers"});
  const int64_t hw = vesper::ThreadPool::hardware_threads();
  for (int64_t context : {512, 2048})
    for (int64_t seqs : {1, 8})
      for (auto [heads, kv_heads] : {std::pair<int64_t, int64_t>{12, 12}, {32, 8}})
        b->Args({context, seqs, heads, kv_heads, hw, 0, 1});
  // Every type at the 110M model's shape, 1 and 8 sequences of 2,048 tokens (19 and 150 MB of
  // f32 K/V).
  for (int64_t seqs : {1, 8})
    for (int64_t kv = 1; kv < static_cast<int64_t>(std::size(vesper::backend::kRowKvDtypes)); ++kv)
      b->Args({2048, seqs, 12, 12, hw, kv, 1});
  // And at the 1B model's grouped-query shape (4 query heads a KV head), 8 sequences.
  for (int64_t kv = 1; kv < static_cast<int64_t>(std::size(vesper::backend::kRowKvDtypes)); ++kv)
    b->Args({2048, 8, 32, 8, hw, kv, 1});
  // A whole decode step of the serving load (`vesper bench serve`, 32 streams of 1,024-token
  // prompts) at the 110M model's shape, 12 layers, for f32, f16 and int8.
  for (int64_t kv : {0, 1, 5}) b->Args({1024, 32, 12, 12, hw, kv, 12});
}

BENCHMARK(BM_PagedAttentionDecode)
    ->Apply(attention_args)
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

void lockstep_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"context", "seqs", "threads", "kv"});
  const int64_t hw = vesper::ThreadPool::hardware_threads();
  for (int64_t context : {64, 128})
    for (int64_t kv : {0, 1}) b->Args({context, 32, hw, kv});
}

BENCHMARK(BM_PagedAttentionDecodeLockstep)
    ->Apply(lockstep_args)
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

// Both KIVI types at the 110M model's shape, 1 and 8 sequences of 2,048 tokens (against the row
// types' cases above).
void kivi_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"context", "seqs", "heads", "kv_heads", "threads", "kv"});
  const int64_t hw = vesper::ThreadPool::hardware_threads();
  for (int64_t seqs : {1, 8})
    for (int64_t kv = 0; kv < static_cast<int64_t>(std::size(vesper::backend::kKiviKvDtypes)); ++kv)
      b->Args({2048, seqs, 12, 12, hw, kv});
}

BENCHMARK(BM_PagedAttentionDecodeKivi)
    ->Apply(kivi_args)
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

void prefill_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"tokens", "heads", "kv_heads", "threads", "kv", "isa"});
  const int64_t hw = vesper::ThreadPool::hardware_threads();
  for (vesper::backend::cpu::Isa isa : vesper::backend::cpu::available_isas()) {
    if (isa == vesper::backend::cpu::Isa::kScalar) continue;
    const auto i = static_cast<int64_t>(isa);
    for (auto [heads, kv_heads] : {std::pair<int64_t, int64_t>{12, 12}, {32, 8}})
      b->Args({512, heads, kv_heads, hw, 0, i});
    // The serving load's prompts (1,024 tokens) at the 110M model's shape, f32 and f16 (the
    // default cache type, whose tiles are decoded once per token block and KV head).
    for (int64_t kv : {0, 1}) b->Args({1024, 12, 12, hw, kv, i});
  }
}

BENCHMARK(BM_PagedAttentionPrefill)
    ->Apply(prefill_args)
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace

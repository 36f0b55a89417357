// Paged attention against the f64 reference (tests/reference/reference_attention.h) over every KV
// cache type, head sizes, head groupings (MHA, GQA, MQA), block sizes and mixed batches of prefill
// chunks and decodes; and its invariances, bit for bit: AVX2 equals the portable kernel, and a
// query's output does not depend on the rest of the batch, on the block size or table layout, or
// on threads. The cache is written through write_key / write_value (the codec), and the reference
// reads the stored rows with its own decoder (tests/reference/reference_kv.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backend/cpu/attention_cpu.h"
#include "backend/paged_attention.h"
#include "reference/reference_attention.h"
#include "reference/reference_kv.h"
#include "sanitized.h"

namespace vesper::backend {
namespace cpu {
// The AVX-512 attention kernel built on SIMDe's AVX-512 (attention_avx512_emulated.cpp).
void emulated_paged_attention_avx512(const AttentionArgs& args, int64_t begin, int64_t end,
                                     float* scratch);
}  // namespace cpu
namespace {

using cpu::Isa;

// Queries of one sequence in a batch: positions first .. first + count - 1 (a prefill chunk,
// or a decode when count is 1). Keys 0 .. first + count - 1 are in the cache.
struct Span {
  int64_t seq;
  int32_t first;
  int32_t count;
};

// Sequences of random K/V in a paged cache with shuffled block tables, and random queries.
class Fixture {
 public:
  Fixture(int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, int64_t block_size,
          const std::vector<int64_t>& seq_lens, uint64_t seed, float q_range = 1.0f,
          KvDtypes dtypes = {KvDtype::kF32, KvDtype::kF32}, bool key_bounds = false)
      : n_heads_(n_heads), head_dim_(head_dim), seq_lens_(seq_lens), rng_(seed) {
    int64_t blocks = 0;
    for (int64_t len : seq_lens) blocks += (len + block_size - 1) / block_size;
    const int64_t pool_blocks = blocks + 5;
    KvCacheSpec spec{dtypes, 2, block_size, n_kv_heads, head_dim};
    spec.key_bounds = key_bounds;
    cache_ = std::make_unique<KvCache>(spec, pool_blocks);
    std::vector<int32_t> free(pool_blocks);
    std::iota(free.begin(), free.end(), 0);
    std::shuffle(free.begin(), free.end(), rng_);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    size_t next = 0;
    for (int64_t len : seq_lens) {
      table_offsets_.push_back(static_cast<int32_t>(tables_.size()));
      for (int64_t b = 0; b < (len + block_size - 1) / block_size; ++b)
        tables_.push_back(free[next++]);
    }
    table_offsets_.push_back(static_cast<int32_t>(tables_.size()));
    // Fill every slot of both layers (unused ones too) so nothing reads uninitialised memory.
    for (int64_t layer = 0; layer < 2; ++layer)
      for (int64_t s = 0; s < cache_->num_slots(); ++s)
        for (int64_t h = 0; h < cache_->spec().n_kv_heads; ++h) write_slot(layer, s, h, u);
    // Every block written whole (Quest's bounds over all its rows).
    if (key_bounds)
      for (int64_t layer = 0; layer < 2; ++layer)
        for (int64_t b = 0; b < pool_blocks; ++b)
          cache_->update_key_bounds(layer, b, block_size - 1);
    // One query vector per (sequence, position), so a query is the same in every batch.
    std::uniform_real_distribution<float> uq(-q_range, q_range);
    for (int64_t len : seq_lens) {
      std::vector<float> q(len * n_heads * head_dim);
      for (float& x : q) x = uq(rng_);
      queries_.push_back(std::move(q));
    }
  }

  // Writes random key and value rows of `head` in `slot` (the K/V a model would produce).
  template <class Dist>
  void write_slot(int64_t layer, int64_t slot, int64_t head, Dist& u) {
    std::vector<float> k(head_dim_), v(head_dim_);
    for (int64_t i = 0; i < head_dim_; ++i) {
      k[i] = u(rng_);
      v[i] = u(rng_);
    }
    cache_->write_key(layer, slot, head, k.data());
    cache_->write_value(layer, slot, head, v.data());
  }

  const KvCache& cache() const { return *cache_; }
  KvCache& mutable_cache() { return *cache_; }
  float* mutable_query(int64_t seq, int64_t pos) {
    return queries_[seq].data() + pos * n_heads_ * head_dim_;
  }
  int64_t slot(int64_t seq, int64_t pos) const {
    const int64_t bs = cache_->spec().block_size;
    return int64_t{tables_[table_offsets_[seq] + pos / bs]} * bs + pos % bs;
  }
  const float* query(int64_t seq, int64_t pos) const {
    return queries_[seq].data() + pos * n_heads_ * head_dim_;
  }

  // Runs the spans as one batch on layer 1; returns [tokens][n_heads][head_dim]. With `window`
  // on (its dense_from for every sequence), each row skips its gap, and the table entries that lie
  // wholly inside the gap of every row of their sequence in the batch are replaced by -1 (freed
  // blocks: reading one would fault or fail the sanitizers).
  std::vector<float> run(const std::vector<Span>& spans, Isa isa, ThreadPool& pool, float scale,
                         const KvSparsity& window = {}, int32_t budget = 0) const {
    return run_kernel(spans, cpu::attention_kernel(isa), pool, scale, window, budget);
  }

  std::vector<float> run_kernel(const std::vector<Span>& spans, cpu::AttentionKernel kernel,
                                ThreadPool& pool, float scale, const KvSparsity& window = {},
                                int32_t budget = 0) const {
    std::vector<int32_t> positions, token_seq, gap_begin, gap_end, budgets;
    std::vector<int64_t> slots;
    std::vector<float> q;
    for (const Span& s : spans)
      for (int32_t i = 0; i < s.count; ++i) {
        positions.push_back(s.first + i);
        token_seq.push_back(static_cast<int32_t>(s.seq));
        slots.push_back(slot(s.seq, s.first + i));
        const float* qv = query(s.seq, s.first + i);
        q.insert(q.end(), qv, qv + n_heads_ * head_dim_);
        budgets.push_back(budget);
        gap_begin.push_back(static_cast<int32_t>(window.gap_begin()));
        gap_end.push_back(static_cast<int32_t>(window.gap_end(s.first + i)));
      }
    std::vector<int32_t> tables = tables_;
    if (window.enabled()) {
      const int64_t bs = cache_->spec().block_size;
      for (int64_t seq = 0; seq + 1 < static_cast<int64_t>(table_offsets_.size()); ++seq) {
        int64_t gap_end_all = INT64_MAX;  // the smallest gap end of the sequence's rows
        bool any = false;
        for (size_t t = 0; t < positions.size(); ++t)
          if (token_seq[t] == seq) {
            any = true;
            gap_end_all = std::min<int64_t>(gap_end_all, gap_end[t]);
          }
        if (!any) continue;
        for (int64_t e = table_offsets_[seq]; e < table_offsets_[seq + 1]; ++e) {
          const int64_t b = e - table_offsets_[seq];
          if (b * bs >= window.gap_begin() && (b + 1) * bs <= gap_end_all) tables[e] = -1;
        }
      }
    }
    AttentionBatch b;
    b.num_tokens = static_cast<int64_t>(positions.size());
    b.positions = positions.data();
    b.token_seq = token_seq.data();
    b.slot_mapping = slots.data();
    b.block_tables = tables.data();
    b.table_offsets = table_offsets_.data();
    if (window.enabled()) {
      b.gap_begin = gap_begin.data();
      b.gap_end = gap_end.data();
    }
    if (budget > 0) b.block_budget = budgets.data();
    // Poisoned output: every element must be written.
    std::vector<float> out(q.size(), std::nanf(""));
    cpu::paged_attention_with_kernel(kernel, *cache_, 1, b, q.data(), n_heads_, scale, out.data(),
                                     pool);
    return out;
  }

  // Quest's selection in f64 from the stored keys: per KV head, the positions row (seq, pos) reads
  // with a budget of `budget` tokens (every position up to pos when its context fits).
  std::vector<std::vector<bool>> quest_reads(int64_t seq, int64_t pos, int64_t budget) const {
    const int64_t n_kv = cache_->spec().n_kv_heads, bs = cache_->spec().block_size;
    const int64_t group = n_heads_ / n_kv;
    std::vector<std::vector<bool>> reads(n_kv, std::vector<bool>(pos + 1, true));
    if (budget <= 0 || pos + 1 <= budget) return reads;
    const int64_t own = pos / bs, keep = std::max<int64_t>(0, budget / bs - 2);
    for (int64_t g = 0; g < n_kv; ++g) {
      std::vector<std::pair<double, int64_t>> scored;
      for (int64_t b = 1; b < own; ++b) {
        std::vector<double> lo(head_dim_, INFINITY), hi(head_dim_, -INFINITY);
        for (int64_t r = 0; r < bs; ++r) {
          const std::vector<double> k = reference::decode_kv_row(
              cache_->spec().dtypes.k, cache_->key_row(1, slot(seq, b * bs + r), g), head_dim_);
          for (int64_t c = 0; c < head_dim_; ++c) {
            lo[c] = std::min(lo[c], k[c]);
            hi[c] = std::max(hi[c], k[c]);
          }
        }
        double score = 0;
        for (int64_t h = 0; h < group; ++h) {
          const float* qh = query(seq, pos) + (g * group + h) * head_dim_;
          for (int64_t c = 0; c < head_dim_; ++c) score += std::max(qh[c] * lo[c], qh[c] * hi[c]);
        }
        scored.emplace_back(-score, b);
      }
      std::sort(scored.begin(), scored.end());
      std::vector<bool> kept_block(own + 1, false);
      kept_block[0] = kept_block[own] = true;
      for (int64_t i = 0; i < std::min<int64_t>(keep, static_cast<int64_t>(scored.size())); ++i)
        kept_block[scored[i].second] = true;
      for (int64_t j = 0; j <= pos; ++j) reads[g][j] = kept_block[j / bs];
    }
    return reads;
  }

  std::vector<double> reference_quest(int64_t seq, int64_t pos, double scale,
                                      int64_t budget) const {
    if (budget > 0 && pos + 1 > budget) {
      // Each KV head's query heads over that head's selected positions.
      const int64_t n_kv = cache_->spec().n_kv_heads, group = n_heads_ / n_kv;
      const auto reads = quest_reads(seq, pos, budget);
      std::vector<double> out(n_heads_ * head_dim_);
      for (int64_t g = 0; g < n_kv; ++g) {
        std::vector<std::vector<float>> ks, vs;
        for (int64_t j = 0; j <= pos; ++j) {
          if (!reads[g][j]) continue;
          const std::vector<double> k = reference::decode_kv_row(
              cache_->spec().dtypes.k, cache_->key_row(1, slot(seq, j), g), head_dim_);
          const std::vector<double> v = reference::decode_kv_row(
              cache_->spec().dtypes.v, cache_->value_row(1, slot(seq, j), g), head_dim_);
          ks.emplace_back(k.begin(), k.end());
          vs.emplace_back(v.begin(), v.end());
        }
        std::vector<const float*> kp, vp;
        for (size_t i = 0; i < ks.size(); ++i) {
          kp.push_back(ks[i].data());
          vp.push_back(vs[i].data());
        }
        const std::vector<double> part = reference::attention(
            query(seq, pos) + g * group * head_dim_, group, 1, head_dim_, kp, vp, scale);
        std::copy(part.begin(), part.end(), out.begin() + g * group * head_dim_);
      }
      return out;
    }
    return reference(seq, pos, scale);
  }

  std::vector<double> reference(int64_t seq, int64_t pos, double scale,
                                const KvSparsity& window = {}) const {
    // The reference takes each position's heads side by side, as the model produces them.
    const int64_t n_kv = cache_->spec().n_kv_heads;
    std::vector<std::vector<float>> k_slots, v_slots;
    std::vector<const float*> k, v;
    for (int64_t j = 0; j <= pos; ++j) {
      k_slots.emplace_back(n_kv * head_dim_);
      v_slots.emplace_back(n_kv * head_dim_);
      // The stored values, exactly (every type's decoded value is an f32).
      const KvDtypes d = cache_->spec().dtypes;
      for (int64_t h = 0; h < n_kv; ++h) {
        const std::vector<double> kr =
            reference::decode_kv_row(d.k, cache_->key_row(1, slot(seq, j), h), head_dim_);
        const std::vector<double> vr =
            reference::decode_kv_row(d.v, cache_->value_row(1, slot(seq, j), h), head_dim_);
        std::copy(kr.begin(), kr.end(), k_slots.back().begin() + h * head_dim_);
        std::copy(vr.begin(), vr.end(), v_slots.back().begin() + h * head_dim_);
      }
    }
    for (int64_t j = 0; j <= pos; ++j) {
      if (j >= window.gap_begin() && j < window.gap_end(pos)) continue;  // outside sinks + window
      k.push_back(k_slots[j].data());
      v.push_back(v_slots[j].data());
    }
    return reference::attention(query(seq, pos), n_heads_, n_kv, head_dim_, k, v, scale);
  }

 private:
  int64_t n_heads_, head_dim_;
  std::vector<int64_t> seq_lens_;
  std::mt19937_64 rng_;
  std::unique_ptr<KvCache> cache_;
  std::vector<int32_t> tables_, table_offsets_;
  std::vector<std::vector<float>> queries_;
};

// A mixed batch over four sequences of lengths 45, 71, 50, 33: the first prefill chunk of one, a
// decode deep in another, a middle prefill chunk crossing the 32-key tile boundary, a decode at
// position 0 and one right at a tile boundary.
const std::vector<int64_t> kSeqLens = {45, 71, 50, 33};
const std::vector<Span> kMixed = {{0, 0, 45}, {1, 70, 1}, {2, 20, 30}, {3, 0, 1}, {3, 32, 1}};

struct Grouping {
  int64_t n_heads, n_kv_heads;
};

// The KV type combinations the tests cover: each type for both, and mixes of keys and values.
std::vector<KvDtypes> all_kv_dtypes() {
  std::vector<KvDtypes> all;
  for (KvDtype d : kRowKvDtypes) all.push_back({d, d});
  all.push_back({KvDtype::kInt8, KvDtype::kFp8E5M2});
  all.push_back({KvDtype::kF16, KvDtype::kInt8});
  return all;
}

TEST(PagedAttention, MatchesF64ReferenceAcrossTypesShapesGroupingsAndBlockSizes) {
  const int64_t head_dims[] = {8, 64, 80, 128, 1, 3, 13, 37};
  // MHA, GQA 4:1, MQA, and MHA with more KV heads than a token block has tokens (a decode token's
  // heads are walked side by side, their states in the same scratch).
  const Grouping groupings[] = {{4, 4}, {8, 2}, {5, 1}, {17, 17}};
  const int64_t block_sizes[] = {1, 16, 7};
  ThreadPool pool(2);
  double worst = 0;
  uint64_t seed = 1;
  const bool sanitized = testing_util::sanitized();
  for (const KvDtypes dtypes : all_kv_dtypes())
    for (int64_t hd : head_dims)
      for (const Grouping& g : groupings)
        for (int64_t bs : block_sizes) {
          // f32 runs every shape; the other types (whose decode is per row, before the shared
          // arithmetic) a head size of each kind (tail only, 8, odd with a body, 64) at two
          // block sizes, to keep the sanitizer runs short.
          // Under a sanitizer (VESPER_SANITIZED) f32 keeps block size 7 for one head size only,
          // and drops the head sizes whose paths others take (1 and 13 tails, 80 and 128 bodies).
          const bool f32 = dtypes == KvDtypes{KvDtype::kF32, KvDtype::kF32};
          if (!f32 && (bs == 7 || hd == 1 || hd == 13 || hd == 80 || hd == 128)) continue;
          if (f32 && sanitized && (bs == 7 ? hd != 13 : (hd == 1 || hd == 80 || hd == 128)))
            continue;
          // And the other types one block size and a head size with and without a tail: each
          // type's row decoder runs on every grouping, which is what the sanitizer checks.
          if (!f32 && sanitized && (bs != 16 || (hd != 8 && hd != 37))) continue;
          // Larger queries in some cases make the softmax peaked, exercising the running max.
          const float q_range = seed % 2 ? 1.0f : 6.0f;
          Fixture f(g.n_heads, g.n_kv_heads, hd, bs, kSeqLens, seed++, q_range, dtypes);
          const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
          // The reference rows, once for every instruction set.
          std::vector<std::vector<double>> refs;
          for (const Span& s : kMixed)
            for (int32_t i = 0; i < s.count; ++i)
              refs.push_back(f.reference(s.seq, s.first + i, scale));
          for (Isa isa : cpu::available_isas()) {
            const std::vector<float> out = f.run(kMixed, isa, pool, scale);
            size_t row = 0;
            for (const Span& s : kMixed)
              for (int32_t i = 0; i < s.count; ++i, ++row) {
                const std::vector<double>& ref = refs[row];
                for (size_t e = 0; e < ref.size(); ++e) {
                  const double err = std::abs(out[row * ref.size() + e] - ref[e]);
                  worst = std::max(worst, err);
                  // Outputs are convex combinations of values in [-1, 1]; f32 arithmetic over
                  // at most 71 keys and 128 dimensions measured 5.3e-7 at worst.
                  ASSERT_LT(err, 4e-6)
                      << "kv " << dtypes.describe() << " head_dim " << hd << " heads " << g.n_heads
                      << "/" << g.n_kv_heads << " block " << bs << " isa " << cpu::isa_name(isa)
                      << " seq " << s.seq << " pos " << s.first + i << " element " << e;
                }
              }
          }
        }
  std::printf("  worst absolute error against f64: %.3g\n", worst);
}

// Every vector kernel this CPU runs (AVX2; AVX-512 on AVX-512 VNNI hosts) and the AVX-512 kernel
// built on SIMDe (on any AVX2 host) give the portable kernel's bits. Head sizes cover each path of
// the AVX-512 tile: whole 64-channel runs (64, 128), 32 and 16 channel runs and a last 8 (24, 40,
// 80, 96, 8), and the AVX2 fallback (5, 13, 37). Under a sanitizer (VESPER_SANITIZED) a head size
// of each kind (8: one 8-lane chunk, 37: chunks and a tail, 128: the largest), which takes every
// code path the others do.
TEST(PagedAttention, VectorKernelsBitIdenticalToPortableKernel) {
  if (!cpu::isa_available(Isa::kAvx2)) GTEST_SKIP() << "no AVX2 on this CPU";
  std::vector<std::pair<std::string, cpu::AttentionKernel>> kernels;
  for (Isa isa : cpu::available_isas())
    if (isa != Isa::kScalar)
      kernels.emplace_back(std::string(cpu::isa_name(isa)), cpu::attention_kernel(isa));
  kernels.emplace_back("avx512 on SIMDe", cpu::emulated_paged_attention_avx512);
  ThreadPool pool(1);
  uint64_t seed = 100;
  const bool sanitized = testing_util::sanitized();
  for (const KvDtypes dtypes : all_kv_dtypes())
    for (int64_t hd : {8, 16, 24, 40, 64, 80, 96, 128, 5, 13, 37}) {
      if (sanitized && hd != 8 && hd != 37 && hd != 128) continue;
      for (const Grouping g : {Grouping{4, 4}, Grouping{8, 2}, Grouping{6, 1}}) {
        Fixture f(g.n_heads, g.n_kv_heads, hd, 16, kSeqLens, seed++, 8.0f, dtypes);
        const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
        const auto s = f.run(kMixed, Isa::kScalar, pool, scale);
        for (const auto& [name, kernel] : kernels) {
          const auto a = f.run_kernel(kMixed, kernel, pool, scale);
          ASSERT_EQ(0, std::memcmp(a.data(), s.data(), a.size() * sizeof(float)))
              << name << " kv " << dtypes.describe() << " head_dim " << hd << " heads " << g.n_heads
              << "/" << g.n_kv_heads;
        }
      }
    }
}

// Every query of the mixed batch, computed alone, in the reversed batch, as part of different
// prefill chunks, and at 1, 2 and 3 threads, gives the same bits. Without grouped-query heads a
// query alone reads its tiles in place (tile_in_place), its KV heads side by side, and within a
// chunk from a decoded copy, one KV head at a time; a thread's share of the work may start or end
// within a token's KV heads.
TEST(PagedAttention, OutputInvariantToBatchChunkingAndThreads) {
  ThreadPool pool1(1), pool2(2), pool3(3);
  // Under a sanitizer (VESPER_SANITIZED) the KV types that read every row decoder once: f32,
  // bf16, fp8_e4m3 and the two mixes (int8 / fp8_e5m2, f16 / int8).
  const bool sanitized = testing_util::sanitized();
  for (const KvDtypes dtypes : all_kv_dtypes())
    for (Isa isa : cpu::available_isas())
      for (const Grouping g : {Grouping{8, 2}, Grouping{4, 4}, Grouping{17, 17}})
        for (int64_t hd : {8, 64, 37}) {
          if (sanitized && dtypes.k == dtypes.v &&
              (dtypes.k == KvDtype::kF16 || dtypes.k == KvDtype::kInt8 ||
               dtypes.k == KvDtype::kFp8E5M2))
            continue;
          Fixture f(g.n_heads, g.n_kv_heads, hd, 16, kSeqLens, 7 + hd, 4.0f, dtypes);
          const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
          const int64_t row_floats = g.n_heads * hd;
          // Baseline: each (seq, position) alone, computed once and compared by every check.
          std::map<std::pair<int64_t, int32_t>, std::vector<float>> alone_rows;
          auto alone = [&](int64_t seq, int32_t pos) -> const std::vector<float>& {
            auto [it, added] = alone_rows.try_emplace({seq, pos});
            if (added) it->second = f.run({{seq, pos, 1}}, isa, pool1, scale);
            return it->second;
          };
          auto check = [&](const std::vector<Span>& spans, ThreadPool& pool, const char* what) {
            const std::vector<float> out = f.run(spans, isa, pool, scale);
            size_t row = 0;
            for (const Span& s : spans)
              for (int32_t i = 0; i < s.count; ++i, ++row) {
                const std::vector<float>& want = alone(s.seq, s.first + i);
                ASSERT_EQ(0, std::memcmp(out.data() + row * row_floats, want.data(),
                                         row_floats * sizeof(float)))
                    << what << " kv " << dtypes.describe() << " isa " << cpu::isa_name(isa)
                    << " heads " << g.n_heads << "/" << g.n_kv_heads << " head_dim " << hd
                    << " seq " << s.seq << " pos " << s.first + i;
              }
          };
          check(kMixed, pool1, "mixed batch, 1 thread");
          check(kMixed, pool2, "mixed batch, 2 threads");
          check(kMixed, pool3, "mixed batch, 3 threads");
          std::vector<Span> reversed(kMixed.rbegin(), kMixed.rend());
          check(reversed, pool3, "reversed batch");
          // The prompt of sequence 1 chunked differently: 1, 3, 17 and the rest.
          check({{1, 0, 1}, {1, 1, 3}, {1, 4, 17}, {1, 21, 50}}, pool2, "chunked prompt");
        }
}

// The same sequence's K/V laid out with block sizes 1, 5, 16 and 64 and shuffled tables: each
// query's output is the same bits (tiles follow positions, never blocks).
TEST(PagedAttention, OutputInvariantToBlockSizeAndTableLayout) {
  ThreadPool pool(2);
  for (const KvDtypes dtypes : all_kv_dtypes())
    for (Isa isa : cpu::available_isas()) {
      const int64_t hd = 24, n_heads = 6, n_kv = 3, len = 77;
      std::vector<float> want;
      for (int64_t bs : {1, 5, 16, 64}) {
        Fixture f(n_heads, n_kv, hd, bs, {len}, 31 + bs, 1.0f, dtypes);
        // Rewrite the K/V and queries with one fixed sequence of values, whatever the layout.
        std::mt19937_64 rng(99);
        std::uniform_real_distribution<float> u(-1.0f, 1.0f);
        KvCache& cache = f.mutable_cache();
        std::vector<float> k(hd), v(hd);
        for (int64_t p = 0; p < len; ++p)
          for (int64_t h = 0; h < n_kv; ++h) {
            for (int64_t i = 0; i < hd; ++i) {
              k[i] = u(rng);
              v[i] = u(rng);
            }
            cache.write_key(1, f.slot(0, p), h, k.data());
            cache.write_value(1, f.slot(0, p), h, v.data());
          }
        for (int64_t p = 0; p < len; ++p)
          for (int64_t i = 0; i < n_heads * hd; ++i) f.mutable_query(0, p)[i] = 3 * u(rng);
        const auto out = f.run({{0, 0, static_cast<int32_t>(len)}}, isa, pool, 0.2f);
        if (want.empty()) want = out;
        ASSERT_EQ(0, std::memcmp(out.data(), want.data(), out.size() * sizeof(float)))
            << "kv " << dtypes.describe() << " block size " << bs << " isa " << cpu::isa_name(isa);
      }
    }
}

}  // namespace
}  // namespace vesper::backend

namespace vesper::backend {
namespace {

// Sinks + window (StreamingLLM): each row attends only its sinks and its window, against the f64
// reference restricted to them, for every KV type, grouped-query heads, odd head sizes and block
// sizes, windows that start inside a tile or a block; the gap's table entries are freed (-1) and
// never read. Rows before dense_from, and rows whose window reaches the sinks, attend everything.
TEST(PagedAttentionWindow, MatchesTheReferenceOverSinksAndWindow) {
  ThreadPool pool(2);
  uint64_t seed = 300;
  const KvSparsity windows[] = {{.sink_tokens = 4, .window = 20},
                                {.sink_tokens = 0, .window = 16},
                                {.sink_tokens = 5, .window = 33, .dense_from = 40},
                                {.sink_tokens = 1, .window = 7}};
  // Under a sanitizer (VESPER_SANITIZED), one odd head size.
  const bool sanitized = testing_util::sanitized();
  for (const KvDtypes dtypes : all_kv_dtypes())
    for (const Grouping g : {Grouping{8, 2}, Grouping{4, 4}})
      for (int64_t hd : {8, 37, 64})
        for (int64_t bs : {16, 5}) {
          if (sanitized && hd != 37) continue;
          Fixture f(g.n_heads, g.n_kv_heads, hd, bs, kSeqLens, seed++, 4.0f, dtypes);
          const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
          for (const KvSparsity& w : windows) {
            std::vector<std::vector<double>> refs;  // once for every instruction set
            for (const Span& s : kMixed)
              for (int32_t i = 0; i < s.count; ++i)
                refs.push_back(f.reference(s.seq, s.first + i, scale, w));
            for (Isa isa : cpu::available_isas()) {
              const std::vector<float> out = f.run(kMixed, isa, pool, scale, w);
              size_t row = 0;
              for (const Span& s : kMixed)
                for (int32_t i = 0; i < s.count; ++i, ++row) {
                  const std::vector<double>& ref = refs[row];
                  for (size_t e = 0; e < ref.size(); ++e)
                    ASSERT_LT(std::abs(out[row * ref.size() + e] - ref[e]), 4e-6)
                        << "kv " << dtypes.describe() << " head_dim " << hd << " block " << bs
                        << " window " << w.sink_tokens << "+" << w.window << " from "
                        << w.dense_from << " isa " << cpu::isa_name(isa) << " seq " << s.seq
                        << " pos " << s.first + i << " element " << e;
                }
            }
          }
        }
}

// A row with a gap gives the same bits alone, in any batch, in a prompt chunk of any split and at
// any thread count (it is walked on its own, its tiles starting where its ranges start), and a
// row without a gap gives exactly the dense result.
TEST(PagedAttentionWindow, OutputInvariantToBatchChunkingAndThreadsAndDenseWithoutAGap) {
  ThreadPool pool1(1), pool3(3);
  const KvSparsity w{.sink_tokens = 4, .window = 20};
  for (const KvDtypes dtypes : all_kv_dtypes())
    for (Isa isa : cpu::available_isas())
      for (const Grouping g : {Grouping{8, 2}, Grouping{4, 4}}) {
        const int64_t hd = 37;
        Fixture f(g.n_heads, g.n_kv_heads, hd, 16, kSeqLens, 77, 4.0f, dtypes);
        const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
        const int64_t row_floats = g.n_heads * hd;
        auto check = [&](const std::vector<Span>& spans, ThreadPool& pool, const char* what) {
          const std::vector<float> out = f.run(spans, isa, pool, scale, w);
          size_t row = 0;
          for (const Span& s : spans)
            for (int32_t i = 0; i < s.count; ++i, ++row) {
              const int32_t pos = s.first + i;
              const bool gap = w.gap_end(pos) > w.gap_begin();
              const std::vector<float> want = gap ? f.run({{s.seq, pos, 1}}, isa, pool1, scale, w)
                                                  : f.run({{s.seq, pos, 1}}, isa, pool1, scale);
              ASSERT_EQ(0, std::memcmp(out.data() + row * row_floats, want.data(),
                                       row_floats * sizeof(float)))
                  << what << " kv " << dtypes.describe() << " isa " << cpu::isa_name(isa)
                  << " heads " << g.n_heads << "/" << g.n_kv_heads << " seq " << s.seq << " pos "
                  << pos;
            }
        };
        check(kMixed, pool1, "mixed batch, 1 thread");
        check(kMixed, pool3, "mixed batch, 3 threads");
        check({{1, 0, 1}, {1, 1, 3}, {1, 4, 17}, {1, 21, 50}}, pool3, "chunked prompt");
        check({{1, 0, 71}}, pool1, "whole prompt");
      }
}

}  // namespace
}  // namespace vesper::backend

namespace vesper::backend {
namespace {

// Quest: with key bounds kept per block, a row whose context exceeds its budget reads, per KV head,
// the first block, its own and the best-bounded others, against an f64 reference that selects from
// the stored keys on its own; for every row KV type, GQA, odd sizes and block sizes. A row within
// its budget gives exactly the dense bits.
TEST(PagedAttentionQuest, MatchesTheReferenceSelection) {
  ThreadPool pool(2);
  uint64_t seed = 500;
  const bool sanitized = testing_util::sanitized();
  for (const KvDtypes dtypes : all_kv_dtypes())
    for (const Grouping g : {Grouping{8, 2}, Grouping{4, 4}})
      for (int64_t hd : {8, 37, 64})
        for (int64_t bs : {16, 5}) {
          if (sanitized && hd != 37) continue;
          Fixture f(g.n_heads, g.n_kv_heads, hd, bs, kSeqLens, seed++, 4.0f, dtypes, true);
          const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
          for (const int32_t budget : {static_cast<int32_t>(3 * bs), static_cast<int32_t>(5 * bs)})
            for (Isa isa : cpu::available_isas()) {
              const std::vector<float> out = f.run(kMixed, isa, pool, scale, {}, budget);
              const std::vector<float> dense = f.run(kMixed, isa, pool, scale);
              size_t row = 0;
              for (const Span& s : kMixed)
                for (int32_t i = 0; i < s.count; ++i, ++row) {
                  const int32_t pos = s.first + i;
                  const std::vector<double> ref = f.reference_quest(s.seq, pos, scale, budget);
                  for (size_t e = 0; e < ref.size(); ++e)
                    ASSERT_LT(std::abs(out[row * ref.size() + e] - ref[e]), 4e-6)
                        << "kv " << dtypes.describe() << " head_dim " << hd << " block " << bs
                        << " budget " << budget << " isa " << cpu::isa_name(isa) << " seq " << s.seq
                        << " pos " << pos << " element " << e;
                  if (pos + 1 <= budget) {
                    ASSERT_EQ(
                        0, std::memcmp(out.data() + row * ref.size(),
                                       dense.data() + row * ref.size(), ref.size() * sizeof(float)))
                        << "within its budget, row " << pos << " is not dense";
                  }
                }
            }
        }
}

// A row with a selection gives the same bits alone, in any batch, chunked and on any thread count.
TEST(PagedAttentionQuest, OutputInvariantToBatchChunkingAndThreads) {
  ThreadPool pool1(1), pool3(3);
  for (const KvDtypes dtypes : all_kv_dtypes())
    for (Isa isa : cpu::available_isas()) {
      const int64_t hd = 37;
      Fixture f(8, 2, hd, 16, kSeqLens, 91, 4.0f, dtypes, true);
      const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
      const int64_t row_floats = 8 * hd;
      auto check = [&](const std::vector<Span>& spans, ThreadPool& pool, const char* what) {
        const std::vector<float> out = f.run(spans, isa, pool, scale, {}, 48);
        size_t row = 0;
        for (const Span& s : spans)
          for (int32_t i = 0; i < s.count; ++i, ++row) {
            const std::vector<float> want =
                f.run({{s.seq, s.first + i, 1}}, isa, pool1, scale, {}, 48);
            ASSERT_EQ(0, std::memcmp(out.data() + row * row_floats, want.data(),
                                     row_floats * sizeof(float)))
                << what << " kv " << dtypes.describe() << " isa " << cpu::isa_name(isa) << " seq "
                << s.seq << " pos " << s.first + i;
          }
      };
      check(kMixed, pool1, "mixed batch, 1 thread");
      check(kMixed, pool3, "mixed batch, 3 threads");
      check({{1, 0, 1}, {1, 1, 3}, {1, 4, 17}, {1, 21, 50}}, pool3, "chunked prompt");
    }
}

}  // namespace
}  // namespace vesper::backend

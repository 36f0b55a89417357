// Paged attention over KIVI caches (kv_cache_spec.h, paged_attention.h's quantized_groups)
// against the f64 reference: a query at position p reads the groups before
// kivi_quantized_tokens(p) as the reference's KIVI encoding of their stored f16 rows
// (tests/reference/reference_kv.h) and every later key as its f16 row. Its result, bit for bit,
// must not depend on how many of those groups the cache stores quantized (KvCache::quantize_group)
// and how many it still holds as residual rows (quantized on the fly), nor on the batch, the
// chunking or the ISA; and tree rows read their path's residual rows. With Quest (key bounds, a
// block budget) a row reads its chosen groups only, chosen from its groups' rows as written.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "backend/cpu/attention_cpu.h"
#include "backend/paged_attention.h"
#include "core/fp16.h"
#include "reference/reference_attention.h"
#include "reference/reference_kv.h"
#include "sanitized.h"

namespace vesper::backend {
namespace {

using cpu::Isa;

struct Case {
  KvDtypes dtypes;
  int64_t group;     // block size
  int64_t residual;  // kivi_residual_length
  int64_t head_dim;
  int64_t n_heads, n_kv_heads;
};

// One sequence of `len` tokens of random K/V in a KIVI cache. Its first `stored` groups are kept
// quantized (one block each, made by quantize_group from residual rows), the rest as residual
// rows over residual_blocks_per_group() blocks each; blocks are taken in shuffled order.
class KiviSequence {
 public:
  KiviSequence(const Case& c, int64_t len, int64_t stored, uint64_t seed, bool bounds = false)
      : c_(c), rng_(seed) {
    spec_ = KvCacheSpec{c.dtypes, 2, c.group, c.n_kv_heads, c.head_dim};
    spec_.kivi_residual_length = c.residual;
    spec_.key_bounds = bounds;
    const int64_t groups = (len + c.group - 1) / c.group, per = spec_.residual_blocks_per_group();
    const int64_t blocks = groups * per + stored + 3;
    cache_ = std::make_unique<KvCache>(spec_, blocks);
    std::vector<int32_t> free(static_cast<size_t>(blocks));
    std::iota(free.begin(), free.end(), 0);
    std::shuffle(free.begin(), free.end(), std::mt19937_64(seed + 1000));
    size_t next = 0;
    // Every group's residual blocks first; every row of them written.
    std::vector<std::vector<int32_t>> residual(static_cast<size_t>(groups));
    for (auto& r : residual)
      for (int64_t b = 0; b < per; ++b) r.push_back(free[next++]);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    const int64_t rows = spec_.residual_rows_per_block(), kv = c.n_kv_heads, d = c.head_dim;
    k_.assign(static_cast<size_t>(groups * c.group * kv * d), 0.0f);
    v_ = k_;
    for (int64_t layer = 0; layer < 2; ++layer)
      for (int64_t g = 0; g < groups; ++g)
        for (int64_t i = 0; i < c.group; ++i)
          for (int64_t h = 0; h < kv; ++h) {
            const int64_t slot = int64_t{residual[g][i / rows]} * rows + i % rows;
            std::vector<float> k(d), v(d);
            for (int64_t e = 0; e < d; ++e) {
              k[e] = u(rng_);
              v[e] = u(rng_);
            }
            cache_->write_key(layer, slot, h, k.data());
            cache_->write_value(layer, slot, h, v.data());
            if (layer != 1) continue;
            // The stored (row-type) values, which quantization and the reference start from.
            const std::vector<double> ks =
                reference::decode_kv_row(kv_row_dtype(c.dtypes.k), cache_->key_row(1, slot, h), d);
            const std::vector<double> vs = reference::decode_kv_row(
                kv_row_dtype(c.dtypes.v), cache_->value_row(1, slot, h), d);
            const int64_t at = ((g * c.group + i) * kv + h) * d;
            std::copy(ks.begin(), ks.end(), k_.begin() + at);
            std::copy(vs.begin(), vs.end(), v_.begin() + at);
          }
    // Quest: each residual block's bounds over its rows (write_kv's update).
    for (int64_t layer = 0; layer < 2 && bounds; ++layer)
      for (const auto& r : residual)
        for (int64_t b = 0; b < per; ++b)
          cache_->update_key_bounds(layer, r[b], std::min(rows, c.group - b * rows) - 1);
    for (int64_t g = 0; g < groups; ++g) {
      if (g < stored) {
        const int32_t dst = free[next++];
        cache_->quantize_group(residual[g], dst);
        table_.push_back(dst);
      } else {
        table_.insert(table_.end(), residual[g].begin(), residual[g].end());
      }
    }
    stored_ = static_cast<int32_t>(stored);
    std::uniform_real_distribution<float> uq(-3.0f, 3.0f);
    q_.resize(static_cast<size_t>(len * c.n_heads * d));
    for (float& x : q_) x = uq(rng_);
  }

  int64_t residual_slot(int64_t pos) const {
    const int64_t g = pos / c_.group, r = pos % c_.group, rows = spec_.residual_rows_per_block();
    return int64_t{table_[stored_ + (g - stored_) * spec_.residual_blocks_per_group() + r / rows]} *
               rows +
           r % rows;
  }

  // Runs queries at positions [first, first + count) as one chunk (optionally as a tree: a chain
  // in which each row's parent is the previous row, so the result must equal the chunk's).
  std::vector<float> run(int64_t first, int64_t count, Isa isa, ThreadPool& pool, bool tree = false,
                         int32_t budget = 0) const {
    std::vector<int32_t> positions, token_seq, parents;
    const std::vector<int32_t> budgets(static_cast<size_t>(count), budget);
    std::vector<int64_t> slots;
    for (int64_t i = 0; i < count; ++i) {
      positions.push_back(static_cast<int32_t>(first + i));
      token_seq.push_back(0);
      slots.push_back(residual_slot(first + i));
      parents.push_back(static_cast<int32_t>(i - 1));
    }
    const int32_t offsets[] = {0, static_cast<int32_t>(table_.size())};
    const int32_t query_start[] = {0, static_cast<int32_t>(count)};
    AttentionBatch b;
    b.num_tokens = count;
    b.positions = positions.data();
    b.token_seq = token_seq.data();
    b.slot_mapping = slots.data();
    b.block_tables = table_.data();
    b.table_offsets = offsets;
    b.quantized_groups = &stored_;
    if (tree) {
      b.tree_parents = parents.data();
      b.query_start = query_start;
    }
    if (budget > 0) b.block_budget = budgets.data();
    const float* q = q_.data() + first * c_.n_heads * c_.head_dim;
    std::vector<float> out(static_cast<size_t>(count * c_.n_heads * c_.head_dim), std::nanf(""));
    cpu::paged_attention_with_isa(isa, *cache_, 1, b, q, c_.n_heads, scale(), out.data(), pool);
    return out;
  }

  float scale() const { return 1.0f / std::sqrt(static_cast<float>(c_.head_dim)); }

  // Quest's choice for the query at `pos` under `budget`, in f64 from the stored rows: per KV
  // head, whether each group is read (the first, its own, and the budget / group - 2 others with
  // the largest sum over the head's query heads and channels of max(q * min, q * max)).
  std::vector<std::vector<bool>> quest_groups(int64_t pos, int64_t budget) const {
    const int64_t kv = c_.n_kv_heads, d = c_.head_dim, gs = c_.group, own = pos / gs;
    const int64_t per_kv = c_.n_heads / kv, keep = std::max<int64_t>(0, budget / gs - 2);
    std::vector<std::vector<bool>> read(static_cast<size_t>(kv),
                                        std::vector<bool>(static_cast<size_t>(own + 1), true));
    if (budget <= 0 || pos + 1 <= budget) return read;
    for (int64_t h = 0; h < kv; ++h) {
      std::vector<std::pair<double, int64_t>> scored;
      for (int64_t g = 1; g < own; ++g) {
        double score = 0;
        for (int64_t qh = h * per_kv; qh < (h + 1) * per_kv; ++qh)
          for (int64_t c = 0; c < d; ++c) {
            double lo = INFINITY, hi = -INFINITY;
            for (int64_t i = 0; i < gs; ++i) {
              const double x = k_[static_cast<size_t>(((g * gs + i) * kv + h) * d + c)];
              lo = std::min(lo, x);
              hi = std::max(hi, x);
            }
            const double qc = q_[static_cast<size_t>((pos * c_.n_heads + qh) * d + c)];
            score += std::max(qc * lo, qc * hi);
          }
        scored.emplace_back(-score, g);
      }
      std::sort(scored.begin(), scored.end());
      std::fill(read[h].begin(), read[h].end(), false);
      read[h][0] = read[h][own] = true;
      for (int64_t i = 0; i < std::min<int64_t>(keep, static_cast<int64_t>(scored.size())); ++i)
        read[h][scored[i].second] = true;
    }
    return read;
  }

  // The reference for the query at `pos` (with a budget: over the groups quest_groups chose). Keys
  // of a KIVI group enter a score as the kernel's contract defines (attention_kernel.h): q * scale
  // rounded to 16-bit steps against the codes, plus q . zero, here folded into each query head's
  // own copy of the group's keys.
  std::vector<double> reference(int64_t pos, int64_t budget = 0) const {
    const std::vector<std::vector<bool>> read = quest_groups(pos, budget);
    const int64_t kv = c_.n_kv_heads, d = c_.head_dim, gs = c_.group;
    const int64_t quantized = spec_.kivi_quantized_tokens(pos);
    std::vector<std::vector<float>> ks, vs;
    for (int64_t j = 0; j <= pos; ++j) {
      ks.emplace_back(k_.begin() + j * kv * d, k_.begin() + (j + 1) * kv * d);
      vs.emplace_back(v_.begin() + j * kv * d, v_.begin() + (j + 1) * kv * d);
    }
    // Groups read quantized with KIVI keys: each group's and head's encoded bytes.
    std::vector<std::vector<std::vector<std::byte>>> key_groups;
    // Groups read quantized: the reference encoding of their stored rows, per head.
    for (int64_t g = 0; g * gs < quantized; ++g) {
      key_groups.emplace_back(static_cast<size_t>(kv));
      for (int64_t h = 0; h < kv; ++h)
        for (int side = 0; side < 2; ++side) {
          const KvDtype dtype = side == 0 ? c_.dtypes.k : c_.dtypes.v;
          if (!kv_is_kivi(dtype)) continue;  // row types read the same either way
          const std::vector<float>& src = side == 0 ? k_ : v_;
          std::vector<float> x(static_cast<size_t>(gs * d));
          for (int64_t i = 0; i < gs; ++i)
            std::copy_n(src.begin() + ((g * gs + i) * kv + h) * d, d, x.begin() + i * d);
          const KvSide s = side == 0 ? KvSide::kKey : KvSide::kValue;
          const std::vector<std::byte> bytes =
              reference::encode_kivi_group(dtype, s, x.data(), gs, d);
          if (side == 0) key_groups[g][h] = bytes;
          const std::vector<double> values =
              reference::decode_kivi_group(dtype, s, bytes.data(), gs, d);
          auto& dst = side == 0 ? ks : vs;
          for (int64_t i = 0; i < gs; ++i)
            for (int64_t e = 0; e < d; ++e)
              dst[g * gs + i][h * d + e] = static_cast<float>(values[i * d + e]);
        }
    }
    const int64_t heads_per_kv = c_.n_heads / kv;
    std::vector<double> out;
    for (int64_t qh = 0; qh < c_.n_heads; ++qh) {
      const int64_t h = qh / heads_per_kv;
      const float* q = q_.data() + (pos * c_.n_heads + qh) * d;
      std::vector<std::vector<float>> keys(static_cast<size_t>(pos + 1));
      std::vector<const float*> kp, vp;
      for (int64_t j = 0; j <= pos; ++j) {
        keys[j].assign(ks[j].begin() + h * d, ks[j].begin() + (h + 1) * d);
        vp.push_back(vs[j].data() + h * d);
      }
      for (int64_t g = 0; g * gs < quantized && kv_is_kivi(c_.dtypes.k); ++g) {
        const std::byte* group = key_groups[g][h].data();
        const int bits = kv_kivi_bits(c_.dtypes.k);
        auto f16 = [&](int64_t i) {
          uint16_t x;
          std::memcpy(&x, group + 2 * i, 2);
          return fp16_to_f32(x);
        };
        // The 16-bit terms, as the contract computes them (f32).
        float m = 0.0f;
        for (int64_t c = 0; c < d; ++c) m = std::max(m, std::fabs(q[c] * f16(c)));
        const float inv = 32767.0f / m, step = m / 32767.0f;
        for (int64_t i = 0; i < gs; ++i)
          for (int64_t c = 0; c < d; ++c) {
            const int64_t bit = c * bits;
            const auto* row = reinterpret_cast<const uint8_t*>(
                group + 4 * d + i * kivi_packed_row_bytes(c_.dtypes.k, d));
            const int code = row[bit / 8] >> (bit % 8) & ((1 << bits) - 1);
            const double q16 = std::clamp(std::nearbyint(q[c] * f16(c) * inv), -32767.0f, 32767.0f);
            // q[c] * key = step * q16 * code + q[c] * zero.
            keys[g * gs + i][c] = static_cast<float>(
                f16(d + c) + (q[c] != 0.0f ? double{step} * q16 * code / q[c] : 0.0));
          }
      }
      std::vector<const float*> vr;
      for (int64_t j = 0; j <= pos; ++j)
        if (read[h][j / gs]) {
          kp.push_back(keys[j].data());
          vr.push_back(vp[j]);
        }
      const std::vector<double> o = reference::attention(q, 1, 1, d, kp, vr, scale());
      out.insert(out.end(), o.begin(), o.end());
    }
    return out;
  }

  const KvCacheSpec& spec() const { return spec_; }

 private:
  Case c_;
  std::mt19937_64 rng_;
  KvCacheSpec spec_;
  std::unique_ptr<KvCache> cache_;
  std::vector<int32_t> table_;
  int32_t stored_ = 0;
  std::vector<float> k_, v_;  // layer 1's stored rows [pos][head][d]
  std::vector<float> q_;
};

std::vector<Case> cases() {
  const KvDtypes k2{KvDtype::kKivi2, KvDtype::kKivi2}, k4{KvDtype::kKivi4, KvDtype::kKivi4};
  const KvDtypes k8v2{KvDtype::kInt8, KvDtype::kKivi2}, k2v16{KvDtype::kKivi2, KvDtype::kF16};
  return {{k2, 32, 40, 64, 8, 2},  {k4, 32, 8, 64, 4, 4},    {k2, 64, 20, 13, 3, 1},
          {k4, 32, 33, 8, 4, 2},   {k8v2, 32, 16, 64, 4, 2}, {k2v16, 32, 1, 37, 2, 2},
          {k2, 32, 128, 16, 2, 1}, {k2, 32, 32, 8, 8, 4}};
}

// Length 150: up to four whole groups of 32 before the last query, two of 64.
constexpr int64_t kLen = 150;

TEST(KiviAttention, MatchesReferenceAndIgnoresWhichGroupsAreStoredQuantized) {
  ThreadPool pool(2);
  uint64_t seed = 1;
  double worst = 0;
  for (const Case& c : cases()) {
    // Chunks: a whole prompt, a middle chunk crossing group boundaries, single decodes. Under a
    // sanitizer, not the whole prompt (the middle chunk takes its paths, at a third of the rows).
    std::vector<std::pair<int64_t, int64_t>> chunks = {
        {0, kLen}, {60, 50}, {kLen - 1, 1}, {100, 1}, {31, 1}};
    if (testing_util::sanitized()) chunks.erase(chunks.begin());
    std::vector<float> expected;
    for (const auto& [first, count] : chunks) {
      // The groups a cache may store quantized: those before the chunk's first query's boundary.
      KiviSequence none(c, kLen, 0, seed);
      const int64_t most = KvCacheSpec{none.spec()}.kivi_quantized_tokens(first) / c.group;
      KiviSequence all(c, kLen, most, seed);
      std::vector<std::vector<double>> refs;  // once for every instruction set
      for (int64_t i = 0; i < count; ++i) refs.push_back(all.reference(first + i));
      std::vector<float> portable;
      for (Isa isa : cpu::available_isas()) {
        const std::vector<float> a = none.run(first, count, isa, pool);
        // Every ISA gives the portable kernel's bits (the AVX2 group decoder included).
        if (portable.empty()) portable = all.run(first, count, Isa::kScalar, pool);
        ASSERT_EQ(0, std::memcmp(a.data(), portable.data(), a.size() * sizeof(float)))
            << c.dtypes.describe() << " chunk " << first << "+" << count << " isa "
            << cpu::isa_name(isa);
        const std::vector<float> b = all.run(first, count, isa, pool);
        ASSERT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)))
            << c.dtypes.describe() << " group " << c.group << " chunk " << first << "+" << count
            << " stored " << most << " isa " << cpu::isa_name(isa);
        const int64_t row = c.n_heads * c.head_dim;
        for (int64_t i = 0; i < count; ++i) {
          const std::vector<double>& ref = refs[static_cast<size_t>(i)];
          for (int64_t e = 0; e < row; ++e) {
            const double err = std::abs(a[i * row + e] - ref[e]);
            worst = std::max(worst, err);
            ASSERT_LT(err, 4e-6) << c.dtypes.describe() << " pos " << first + i << " e " << e
                                 << " isa " << cpu::isa_name(isa);
          }
        }
        // The same query in the whole-prompt chunk gave the same bits (chunking invariance; not
        // under a sanitizer, which runs no whole prompt).
        if (first == 0) {
          expected = a;
        } else if (!expected.empty()) {
          ASSERT_EQ(0,
                    std::memcmp(a.data(), expected.data() + first * row, a.size() * sizeof(float)))
              << c.dtypes.describe() << " chunk " << first << "+" << count;
        }
      }
    }
    ++seed;
  }
  std::printf("  worst absolute error against f64: %.3g\n", worst);
}

// Quest over KIVI: every row of a prompt (each walked alone) and single decodes under budgets of
// two and three groups read their chosen groups only (the f64 reference chooses on its own), with
// the same bits whether the cache stores groups quantized or holds them as rows (a group's bounds
// are its rows'), on every ISA; a row within its budget gives the dense bits.
TEST(KiviAttention, QuestReadsTheChosenGroupsHoweverTheyAreStored) {
  ThreadPool pool(2);
  uint64_t seed = 40;
  for (const Case& c : cases()) {
    if (testing_util::sanitized() && c.head_dim != 64) continue;
    for (const int32_t budget :
         {static_cast<int32_t>(2 * c.group), static_cast<int32_t>(3 * c.group)}) {
      KiviSequence none(c, kLen, 0, seed, true);
      const int64_t row = c.n_heads * c.head_dim;
      std::vector<std::vector<double>> refs;  // once for every instruction set
      for (int64_t pos = 0; pos < kLen; ++pos) refs.push_back(none.reference(pos, budget));
      for (Isa isa : cpu::available_isas()) {
        const std::vector<float> a = none.run(0, kLen, isa, pool, false, budget);
        const std::vector<float> dense = none.run(0, kLen, isa, pool);
        // Decodes: each query alone, from a cache storing every group it may quantized.
        for (const int64_t pos : {int64_t{kLen - 1}, int64_t{100}, int64_t{2 * c.group}}) {
          const int64_t most = none.spec().kivi_quantized_tokens(pos) / c.group;
          const KiviSequence stored(c, kLen, most, seed, true);
          const std::vector<float> b = stored.run(pos, 1, isa, pool, false, budget);
          ASSERT_EQ(0, std::memcmp(b.data(), a.data() + pos * row, b.size() * sizeof(float)))
              << c.dtypes.describe() << " budget " << budget << " pos " << pos << " isa "
              << cpu::isa_name(isa);
        }
        for (int64_t pos = 0; pos < kLen; ++pos) {
          const std::vector<double>& ref = refs[static_cast<size_t>(pos)];
          for (int64_t e = 0; e < row; ++e)
            ASSERT_LT(std::abs(a[pos * row + e] - ref[e]), 4e-6)
                << c.dtypes.describe() << " budget " << budget << " pos " << pos << " e " << e
                << " isa " << cpu::isa_name(isa);
          if (pos + 1 <= budget) {
            ASSERT_EQ(
                0, std::memcmp(a.data() + pos * row, dense.data() + pos * row, row * sizeof(float)))
                << "within its budget, row " << pos << " is not dense";
          }
        }
      }
    }
    ++seed;
  }
}

// Tree rows (here a chain written as a tree) give the chunk's bits; their path is read from
// residual rows.
TEST(KiviAttention, TreeRowsEqualTheChain) {
  ThreadPool pool(1);
  for (const Case& c : cases()) {
    if (c.residual < 4) continue;  // a tree of 4 rows must stay within the residual window
    KiviSequence s(c, kLen, 2 * 32 / c.group, 7);
    const auto chain = s.run(kLen - 4, 4, Isa::kScalar, pool);
    const auto tree = s.run(kLen - 4, 4, Isa::kScalar, pool, true);
    ASSERT_EQ(0, std::memcmp(chain.data(), tree.data(), chain.size() * sizeof(float)))
        << c.dtypes.describe();
  }
}

}  // namespace
}  // namespace vesper::backend

// Helpers for driving Model::forward in tests: a sequence's logits computed in chunks, with
// a block table that can be scattered over the cache, and JSON loading of expected outputs.
#pragma once

#include <algorithm>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "model/model.h"

namespace vesper::testing_util {

// Block table of `n_blocks` distinct physical blocks, shuffled by `seed` (0: identity).
inline std::vector<int32_t> block_table(int64_t n_blocks, int64_t pool_blocks, uint64_t seed) {
  std::vector<int32_t> all(pool_blocks);
  std::iota(all.begin(), all.end(), 0);
  if (seed != 0) std::shuffle(all.begin(), all.end(), std::mt19937_64(seed));
  all.resize(n_blocks);
  return all;
}

// Logits of every position of `tokens`, computed `chunk` tokens per forward pass (the last
// chunk may be shorter). All positions' logits are requested.
inline std::vector<std::vector<float>> sequence_logits(model::Model& m, const std::vector<int32_t>& tokens,
                                                       int64_t chunk, int64_t block_size, uint64_t table_seed,
                                                       ThreadPool& pool) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t n_blocks = (n + block_size - 1) / block_size;
  const int64_t pool_blocks = n_blocks * 2 + 3;
  backend::KvCache kv(m.kv_shape(pool_blocks, block_size));
  const std::vector<int32_t> table = block_table(n_blocks, pool_blocks, table_seed);
  std::vector<std::vector<float>> out;
  const int64_t v = m.config().n_vocab;
  for (int64_t start = 0; start < n; start += chunk) {
    const int64_t len = std::min(chunk, n - start);
    model::ForwardBatch b;
    b.add_sequence(std::vector<int32_t>(tokens.begin() + start, tokens.begin() + start + len),
                   static_cast<int32_t>(start), table, block_size, false);
    for (int64_t i = 0; i < len; ++i) b.logits_rows.push_back(static_cast<int32_t>(i));
    std::vector<float> logits(len * v);
    m.forward(b, kv, logits.data(), pool);
    for (int64_t i = 0; i < len; ++i) out.emplace_back(logits.begin() + i * v, logits.begin() + (i + 1) * v);
  }
  return out;
}

}  // namespace vesper::testing_util

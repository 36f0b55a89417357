// Helpers for driving Model::forward in tests: a sequence's logits computed in chunks, with
// a block table that can be scattered over the cache, and JSON loading of expected outputs.
#pragma once

#include <algorithm>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu_backend.h"
#include "model/model.h"

namespace vesper::testing_util {

// A model bound to a CPU backend of its own (`threads` compute threads).
struct LoadedModel {
  std::unique_ptr<backend::CpuBackend> backend;
  std::unique_ptr<model::Model> model;

  model::Model& operator*() const { return *model; }
  model::Model* operator->() const { return model.get(); }
};

inline Result<LoadedModel> load_model(const std::string& path, int threads = 2) {
  LoadedModel m;
  m.backend = std::make_unique<backend::CpuBackend>(threads);
  VESPER_ASSIGN_OR_RETURN(m.model, model::Model::load(path, *m.backend));
  return m;
}

// Paged KV storage on the model's backend, released at scope exit. f32 unless asked otherwise:
// the f64 reference forward keeps K/V exact, so comparisons against it use an exact cache.
class ScopedKv {
 public:
  ScopedKv(model::Model& m, int64_t blocks, int64_t block_size,
           backend::KvDtypes dtypes = {backend::KvDtype::kF32, backend::KvDtype::kF32})
      : backend_(m.backend()),
        kv_(backend_.create_kv(m.kv_spec(block_size, dtypes), blocks,
                               backend::MemoryKind::kDevice)) {}
  ~ScopedKv() { backend_.release_kv(kv_); }
  ScopedKv(const ScopedKv&) = delete;
  ScopedKv& operator=(const ScopedKv&) = delete;
  backend::KvHandle handle() const { return kv_; }

 private:
  backend::Backend& backend_;
  backend::KvHandle kv_;
};

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
inline std::vector<std::vector<float>> sequence_logits(model::Model& m,
                                                       const std::vector<int32_t>& tokens,
                                                       int64_t chunk, int64_t block_size,
                                                       uint64_t table_seed) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t n_blocks = (n + block_size - 1) / block_size;
  const int64_t pool_blocks = n_blocks * 2 + 3;
  ScopedKv kv(m, pool_blocks, block_size);
  const std::vector<int32_t> table = block_table(n_blocks, pool_blocks, table_seed);
  std::vector<std::vector<float>> out;
  const int64_t v = m.config().n_vocab;
  for (int64_t start = 0; start < n; start += chunk) {
    const int64_t len = std::min(chunk, n - start);
    model::ForwardBatch b;
    // Every row's logits: the batch builder's last `len` rows.
    b.add_sequence(std::vector<int32_t>(tokens.begin() + start, tokens.begin() + start + len),
                   static_cast<int32_t>(start), table, block_size, len);
    const std::span<const float> logits = m.forward(b, kv.handle());
    for (int64_t i = 0; i < len; ++i)
      out.emplace_back(logits.begin() + i * v, logits.begin() + (i + 1) * v);
  }
  return out;
}

}  // namespace vesper::testing_util

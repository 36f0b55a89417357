#include "backend/kv_cache.h"

#include <algorithm>

#include "core/check.h"

namespace vesper::backend {

KvCache::KvCache(const KvCacheShape& shape) : shape_(shape) {
  VESPER_CHECK(shape.n_layers > 0 && shape.n_blocks >= 0 && shape.block_size > 0);
  const size_t floats = static_cast<size_t>(shape.num_slots() * shape.slot_floats());
  for (int64_t l = 0; l < shape.n_layers; ++l) {
    k_.push_back(allocate_large_array<float>(std::max<size_t>(floats, 1)));
    v_.push_back(allocate_large_array<float>(std::max<size_t>(floats, 1)));
    VESPER_CHECK(k_.back() != nullptr && v_.back() != nullptr,
                 "KV cache: cannot allocate %zu bytes per layer", 2 * floats * sizeof(float));
  }
}

void KvCache::copy_block_from(const KvCache& other, int64_t src, int64_t dst) {
  const KvCacheShape& o = other.shape_;
  VESPER_CHECK(o.n_layers == shape_.n_layers && o.block_size == shape_.block_size &&
                   o.slot_floats() == shape_.slot_floats(),
               "copy between caches of different geometry");
  VESPER_CHECK(src >= 0 && src < o.n_blocks && dst >= 0 && dst < shape_.n_blocks,
               "block copy %lld -> %lld out of range", static_cast<long long>(src),
               static_cast<long long>(dst));
  const int64_t n = shape_.block_size * shape_.slot_floats();
  for (int64_t l = 0; l < shape_.n_layers; ++l) {
    std::copy_n(other.k_[l].get() + src * n, n, k_[l].get() + dst * n);
    std::copy_n(other.v_[l].get() + src * n, n, v_[l].get() + dst * n);
  }
}

}  // namespace vesper::backend

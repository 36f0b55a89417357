#include "backend/kv_cache.h"

#include <algorithm>
#include <cstring>

namespace vesper::backend {

KvCache::KvCache(const KvCacheSpec& spec, int64_t n_blocks) : spec_(spec), n_blocks_(n_blocks) {
  VESPER_CHECK(spec.n_layers > 0 && n_blocks >= 0 && spec.block_size > 0);
  const auto bytes = static_cast<size_t>(n_blocks * spec.block_bytes_per_layer());
  for (int64_t l = 0; l < spec.n_layers; ++l) {
    k_.push_back(allocate_large_buffer(std::max<size_t>(bytes, 1)));
    v_.push_back(allocate_large_buffer(std::max<size_t>(bytes, 1)));
    VESPER_CHECK(k_.back() != nullptr && v_.back() != nullptr,
                 "KV cache: cannot allocate %zu bytes per layer", 2 * bytes);
  }
}

void KvCache::copy_block_from(const KvCache& other, int64_t src, int64_t dst) {
  const KvCacheSpec& o = other.spec_;
  VESPER_CHECK(o.n_layers == spec_.n_layers && o.block_size == spec_.block_size &&
                   o.dtype == spec_.dtype && o.token_elements() == spec_.token_elements(),
               "copy between caches of different specs");
  VESPER_CHECK(src >= 0 && src < other.n_blocks_ && dst >= 0 && dst < n_blocks_,
               "block copy %lld -> %lld out of range", static_cast<long long>(src),
               static_cast<long long>(dst));
  const int64_t n = spec_.block_bytes_per_layer();
  for (int64_t l = 0; l < spec_.n_layers; ++l) {
    std::memcpy(k_[l].get() + dst * n, other.k_[l].get() + src * n, static_cast<size_t>(n));
    std::memcpy(v_[l].get() + dst * n, other.v_[l].get() + src * n, static_cast<size_t>(n));
  }
}

void KvCache::copy_slot(int64_t src, int64_t dst) {
  VESPER_CHECK(src >= 0 && src < num_slots() && dst >= 0 && dst < num_slots(),
               "slot copy %lld -> %lld out of range", static_cast<long long>(src),
               static_cast<long long>(dst));
  const size_t row_bytes = static_cast<size_t>(spec_.head_dim) * sizeof(float);
  for (int64_t l = 0; l < spec_.n_layers; ++l)
    for (int64_t h = 0; h < spec_.n_kv_heads; ++h) {
      std::memcpy(key(l, dst, h), key(l, src, h), row_bytes);
      std::memcpy(value(l, dst, h), value(l, src, h), row_bytes);
    }
}

}  // namespace vesper::backend

// KvCache: the key/value storage of the paged KV cache on the host, allocated once at start.
//
// Per layer, K and V each hold n_blocks * block_size slots; a slot holds n_kv_heads x head_dim
// floats. Slot s belongs to physical block s / block_size. Which block belongs to which
// sequence is bookkeeping kept elsewhere (block tables); this class only stores values.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

namespace vesper::backend {

struct KvCacheShape {
  int64_t n_layers = 0;
  int64_t n_blocks = 0;
  int64_t block_size = 16;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;

  int64_t slot_floats() const { return n_kv_heads * head_dim; }
  int64_t num_slots() const { return n_blocks * block_size; }
  // Bytes of K and V of one token over all layers.
  int64_t bytes_per_token() const { return 2 * n_layers * slot_floats() * int64_t{sizeof(float)}; }
};

class KvCache {
 public:
  explicit KvCache(const KvCacheShape& shape);

  const KvCacheShape& shape() const { return shape_; }
  float* key(int64_t layer, int64_t slot) { return k_[layer].get() + slot * shape_.slot_floats(); }
  float* value(int64_t layer, int64_t slot) { return v_[layer].get() + slot * shape_.slot_floats(); }
  const float* key(int64_t layer, int64_t slot) const { return k_[layer].get() + slot * shape_.slot_floats(); }
  const float* value(int64_t layer, int64_t slot) const { return v_[layer].get() + slot * shape_.slot_floats(); }

  // Copies every layer's K and V of physical block `src` into block `dst` (copy-on-write).
  void copy_block(int64_t src, int64_t dst) { copy_block_from(*this, src, dst); }
  // Copies block `src` of another cache of the same geometry (but any block count) into block
  // `dst` of this one: swapping between the device cache and the host swap space.
  void copy_block_from(const KvCache& other, int64_t src, int64_t dst);

  // Bytes of storage (K and V, all layers).
  int64_t bytes() const { return shape_.num_slots() * shape_.bytes_per_token(); }

 private:
  KvCacheShape shape_;
  // Storage is left uninitialised (and so, for large caches, untouched by the OS until used):
  // a slot is always written before any token reads it.
  std::vector<std::unique_ptr<float[]>> k_, v_;
};

}  // namespace vesper::backend

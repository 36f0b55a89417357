// KvCache: the key/value storage of the paged KV cache on the host, allocated once at start.
//
// Per layer, K and V each hold n_blocks * block_size slots of n_kv_heads x head_dim floats. Slot
// s belongs to physical block s / block_size. Which block belongs to which sequence is
// bookkeeping kept elsewhere (block tables); this class only stores values.
//
// Layout, per layer and for K and V alike: block-major, then KV head, then the slot's offset in
// its block, then head_dim ([block][head][offset][dim], vLLM's CPU layout). One head's keys of a
// block are one contiguous run of block_size * head_dim floats, which attention (reading one
// head at a time) streams with the hardware prefetcher and few TLB entries; a slot-major layout
// would put consecutive keys of a head n_kv_heads * head_dim floats apart. A whole block is still
// one contiguous range (copy_block).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/large_buffer.h"

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

  // Head `head`'s keys (values) of physical block `block`: block_size rows of head_dim floats,
  // the row of offset o at + o * head_dim.
  float* key_block(int64_t layer, int64_t block, int64_t head) {
    return k_[layer].get() + run(block, head);
  }
  float* value_block(int64_t layer, int64_t block, int64_t head) {
    return v_[layer].get() + run(block, head);
  }
  const float* key_block(int64_t layer, int64_t block, int64_t head) const {
    return k_[layer].get() + run(block, head);
  }
  const float* value_block(int64_t layer, int64_t block, int64_t head) const {
    return v_[layer].get() + run(block, head);
  }

  // Head `head`'s key (value) in slot `slot`: head_dim floats.
  float* key(int64_t layer, int64_t slot, int64_t head) {
    return k_[layer].get() + row(slot, head);
  }
  float* value(int64_t layer, int64_t slot, int64_t head) {
    return v_[layer].get() + row(slot, head);
  }
  const float* key(int64_t layer, int64_t slot, int64_t head) const {
    return k_[layer].get() + row(slot, head);
  }
  const float* value(int64_t layer, int64_t slot, int64_t head) const {
    return v_[layer].get() + row(slot, head);
  }

  // Copies every layer's K and V of physical block `src` into block `dst` (copy-on-write).
  void copy_block(int64_t src, int64_t dst) { copy_block_from(*this, src, dst); }
  // Copies block `src` of another cache of the same geometry (but any block count) into block
  // `dst` of this one: swapping between the device cache and the host swap space.
  void copy_block_from(const KvCache& other, int64_t src, int64_t dst);

  // Bytes of storage (K and V, all layers).
  int64_t bytes() const { return shape_.num_slots() * shape_.bytes_per_token(); }

 private:
  // Float offset of (block, head)'s run of block_size rows, and of one slot's row of a head.
  int64_t run(int64_t block, int64_t head) const {
    return (block * shape_.n_kv_heads + head) * shape_.block_size * shape_.head_dim;
  }
  int64_t row(int64_t slot, int64_t head) const {
    return run(slot / shape_.block_size, head) + slot % shape_.block_size * shape_.head_dim;
  }

  KvCacheShape shape_;
  // Storage is left uninitialised (and so, for large caches, untouched by the OS until used):
  // a slot is always written before any token reads it. Huge pages where large enough
  // (core/large_buffer.h): attention reads scattered 4-8 KiB runs of it, a TLB miss each on small
  // pages.
  std::vector<std::unique_ptr<float[], LargeBufferFree>> k_, v_;
};

}  // namespace vesper::backend

// KvCache: the key/value storage of the paged KV cache on the host, allocated once at start, in
// the layout and element types its KvCacheSpec describes.
//
// Per layer, K and V each hold n_blocks blocks of block_size slots of n_kv_heads rows. Slot s
// belongs to physical block s / block_size. Which block belongs to which sequence is bookkeeping
// kept elsewhere (block tables); this class only stores rows.
//
// Layout, per layer and for K and V alike: block-major, then KV head, then the slot's offset in
// its block ([block][head][offset], vLLM's CPU layout); each row is head_dim elements of the
// type followed by the row's metadata (kv_codec.h), key_row_bytes() (value_row_bytes()) in all.
// One head's keys of a block are one contiguous run of block_size rows, which attention (reading
// one head at a time) streams with the hardware prefetcher and few TLB entries; a whole block is
// one contiguous range (copy_block).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "backend/kv_cache_spec.h"
#include "core/check.h"
#include "core/large_buffer.h"

namespace vesper::backend {

class KvCache {
 public:
  KvCache(const KvCacheSpec& spec, int64_t n_blocks);

  const KvCacheSpec& spec() const { return spec_; }
  int64_t n_blocks() const { return n_blocks_; }
  int64_t num_slots() const { return n_blocks_ * spec_.block_size; }

  // Head `head`'s keys (values) of physical block `block`: block_size rows, the row of offset o
  // at + o * key_row_bytes() (value_row_bytes()).
  const std::byte* key_run(int64_t layer, int64_t block, int64_t head) const {
    return k_[layer].get() + first_row(block, head) * k_row_;
  }
  const std::byte* value_run(int64_t layer, int64_t block, int64_t head) const {
    return v_[layer].get() + first_row(block, head) * v_row_;
  }
  // Head `head`'s key (value) row in slot `slot`.
  std::byte* key_row(int64_t layer, int64_t slot, int64_t head) {
    return k_[layer].get() + row(slot, head) * k_row_;
  }
  std::byte* value_row(int64_t layer, int64_t slot, int64_t head) {
    return v_[layer].get() + row(slot, head) * v_row_;
  }
  const std::byte* key_row(int64_t layer, int64_t slot, int64_t head) const {
    return k_[layer].get() + row(slot, head) * k_row_;
  }
  const std::byte* value_row(int64_t layer, int64_t slot, int64_t head) const {
    return v_[layer].get() + row(slot, head) * v_row_;
  }

  // Stores x[0..head_dim) as the key (value) row of `head` in `slot`, encoded in the cache's type.
  void write_key(int64_t layer, int64_t slot, int64_t head, const float* x);
  void write_value(int64_t layer, int64_t slot, int64_t head, const float* x);

  // Copies every layer's K and V of physical block `src` into block `dst` (copy-on-write).
  void copy_block(int64_t src, int64_t dst) { copy_block_from(*this, src, dst); }
  // Copies block `src` of another cache of the same spec (but any block count) into block `dst`
  // of this one: swapping between the device cache and the host swap space. Bytes as stored
  // (elements and metadata together).
  void copy_block_from(const KvCache& other, int64_t src, int64_t dst);

  // Copies every layer's K and V rows of slot `src` into slot `dst` (an accepted speculative tree
  // path moved to its positions), metadata included.
  void copy_slot(int64_t src, int64_t dst);

  // Bytes of storage (K and V, all layers).
  int64_t bytes() const { return n_blocks_ * spec_.bytes_per_block(); }

 private:
  using Storage = std::unique_ptr<std::byte[], LargeBufferFree>;
  // Index, counted in rows, of the first row of (block, head)'s run, and of one slot's row.
  int64_t first_row(int64_t block, int64_t head) const {
    return (block * spec_.n_kv_heads + head) * spec_.block_size;
  }
  int64_t row(int64_t slot, int64_t head) const {
    return first_row(slot / spec_.block_size, head) + slot % spec_.block_size;
  }

  KvCacheSpec spec_;
  int64_t n_blocks_ = 0;
  int64_t k_row_ = 0, v_row_ = 0;  // bytes of a key row, of a value row
  // Storage is left uninitialised (and so, for large caches, untouched by the OS until used):
  // a slot is always written before any token reads it. Huge pages where large enough
  // (core/large_buffer.h): attention reads scattered 4-8 KiB runs of it, a TLB miss each on small
  // pages.
  std::vector<Storage> k_, v_;
};

}  // namespace vesper::backend

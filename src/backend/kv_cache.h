// KvCache: the key/value storage of the paged KV cache on the host, allocated once at start, in
// the layout and element type its KvCacheSpec describes.
//
// Per layer, K and V each hold n_blocks blocks of block_size slots of n_kv_heads x head_dim
// elements. Slot s belongs to physical block s / block_size. Which block belongs to which
// sequence is bookkeeping kept elsewhere (block tables); this class only stores values.
//
// Layout, per layer and for K and V alike: block-major, then KV head, then the slot's offset in
// its block, then head_dim ([block][head][offset][dim], vLLM's CPU layout), then the block's
// metadata (block_metadata_bytes, none for f32). One head's keys of a block are one contiguous run
// of block_size * head_dim elements, which attention (reading one head at a time) streams with
// the hardware prefetcher and few TLB entries; a whole block is one contiguous range of
// block_bytes_per_layer bytes (copy_block).
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

  // f32 caches: head `head`'s keys (values) of physical block `block`: block_size rows of
  // head_dim floats, the row of offset o at + o * head_dim.
  float* key_block(int64_t layer, int64_t block, int64_t head) {
    return f32(k_, layer) + run(block, head);
  }
  float* value_block(int64_t layer, int64_t block, int64_t head) {
    return f32(v_, layer) + run(block, head);
  }
  const float* key_block(int64_t layer, int64_t block, int64_t head) const {
    return f32(k_, layer) + run(block, head);
  }
  const float* value_block(int64_t layer, int64_t block, int64_t head) const {
    return f32(v_, layer) + run(block, head);
  }

  // f32 caches: head `head`'s key (value) in slot `slot`: head_dim floats.
  float* key(int64_t layer, int64_t slot, int64_t head) { return f32(k_, layer) + row(slot, head); }
  float* value(int64_t layer, int64_t slot, int64_t head) {
    return f32(v_, layer) + row(slot, head);
  }
  const float* key(int64_t layer, int64_t slot, int64_t head) const {
    return f32(k_, layer) + row(slot, head);
  }
  const float* value(int64_t layer, int64_t slot, int64_t head) const {
    return f32(v_, layer) + row(slot, head);
  }

  // Copies every layer's K and V of physical block `src` into block `dst` (copy-on-write).
  void copy_block(int64_t src, int64_t dst) { copy_block_from(*this, src, dst); }
  // Copies block `src` of another cache of the same spec (but any block count) into block `dst`
  // of this one: swapping between the device cache and the host swap space. Bytes as stored
  // (values and metadata together).
  void copy_block_from(const KvCache& other, int64_t src, int64_t dst);

  // Copies every layer's K and V of slot `src` into slot `dst` (an accepted speculative tree
  // path moved to its positions). f32 caches.
  void copy_slot(int64_t src, int64_t dst);

  // Bytes of storage (K and V, all layers).
  int64_t bytes() const { return n_blocks_ * spec_.bytes_per_block(); }

 private:
  using Storage = std::unique_ptr<std::byte[], LargeBufferFree>;
  float* f32(const std::vector<Storage>& s, int64_t layer) const {
    VESPER_CHECK(spec_.dtype == KvDtype::kF32, "float access to a %s KV cache",
                 kv_dtype_name(spec_.dtype).data());
    return reinterpret_cast<float*>(s[layer].get());
  }
  // Element offset of (block, head)'s run of block_size rows, and of one slot's row of a head.
  int64_t run(int64_t block, int64_t head) const {
    return (block * spec_.n_kv_heads + head) * spec_.block_size * spec_.head_dim;
  }
  int64_t row(int64_t slot, int64_t head) const {
    return run(slot / spec_.block_size, head) + slot % spec_.block_size * spec_.head_dim;
  }

  KvCacheSpec spec_;
  int64_t n_blocks_ = 0;
  // Storage is left uninitialised (and so, for large caches, untouched by the OS until used):
  // a slot is always written before any token reads it. Huge pages where large enough
  // (core/large_buffer.h): attention reads scattered 4-8 KiB runs of it, a TLB miss each on small
  // pages.
  std::vector<Storage> k_, v_;
};

}  // namespace vesper::backend

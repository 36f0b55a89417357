// KvCache: the key/value storage of the paged KV cache on the host, allocated once at start, in
// the layout and element types its KvCacheSpec describes.
//
// Per layer, K and V each hold n_blocks blocks; a block holds one unit per KV head (key_unit_bytes,
// value_unit_bytes), which is either a quantized group of block_size tokens or
// residual_rows_per_block() residual rows (kv_cache_spec.h; without KIVI the two are the same
// block_size rows). Slots number residual rows: slot s is row s % residual_rows_per_block() of
// block s / residual_rows_per_block() (without KIVI: the block_size slots of each block, as
// always). Which block belongs to which sequence, and in which form, is bookkeeping kept
// elsewhere (block tables); this class only stores bytes.
//
// Layout, per layer and for K and V alike: block-major, then KV head, then the unit
// ([block][head][unit], vLLM's CPU layout); a residual row is head_dim elements of
// kv_row_dtype followed by the row's metadata (kv_codec.h), key_row_bytes() (value_row_bytes())
// in all. One head's keys of a block are one contiguous run, which attention (reading one head at
// a time) streams with the hardware prefetcher and few TLB entries; a whole block is one
// contiguous range (copy_block).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "backend/kv_cache_spec.h"
#include "core/check.h"
#include "core/large_buffer.h"
#include "core/page_warmer.h"
#include "core/thread_pool.h"

namespace vesper::backend {

class KvCache {
 public:
  KvCache(const KvCacheSpec& spec, int64_t n_blocks);

  const KvCacheSpec& spec() const { return spec_; }
  int64_t n_blocks() const { return n_blocks_; }
  int64_t num_slots() const { return n_blocks_ * rows_per_block_; }

  // Head `head`'s key (value) unit of physical block `block`: a quantized group, or residual rows
  // (the row of offset o at + o * key_row_bytes() (value_row_bytes())).
  const std::byte* key_run(int64_t layer, int64_t block, int64_t head) const {
    return k_[layer].get() + (block * spec_.n_kv_heads + head) * k_unit_;
  }
  const std::byte* value_run(int64_t layer, int64_t block, int64_t head) const {
    return v_[layer].get() + (block * spec_.n_kv_heads + head) * v_unit_;
  }
  // Head `head`'s key (value) row in slot `slot`.
  std::byte* key_row(int64_t layer, int64_t slot, int64_t head) {
    return const_cast<std::byte*>(std::as_const(*this).key_row(layer, slot, head));
  }
  std::byte* value_row(int64_t layer, int64_t slot, int64_t head) {
    return const_cast<std::byte*>(std::as_const(*this).value_row(layer, slot, head));
  }
  const std::byte* key_row(int64_t layer, int64_t slot, int64_t head) const {
    return key_run(layer, slot / rows_per_block_, head) + slot % rows_per_block_ * k_row_;
  }
  const std::byte* value_row(int64_t layer, int64_t slot, int64_t head) const {
    return value_run(layer, slot / rows_per_block_, head) + slot % rows_per_block_ * v_row_;
  }

  // Stores x[0..head_dim) as the key (value) row of `head` in `slot`, encoded in the cache's type.
  void write_key(int64_t layer, int64_t slot, int64_t head, const float* x);
  void write_value(int64_t layer, int64_t slot, int64_t head, const float* x);

  // fp8 scales fixed by calibration (vLLM's --calculate-kv-scales) instead of each row's own:
  // after calibrate_fp8_scales(), the first write to each layer (calibrate_layer, from write_kv)
  // fixes each head's key and value scale from the amax of that write's rows, and every later
  // row of the layer is coded against it (encode_fp8_row_scaled; rows still carry their scale,
  // so reading, copying and swapping are unchanged). Sides that are not fp8 are not affected.
  void calibrate_fp8_scales();
  // Whether `layer` waits for its calibrating write.
  bool awaits_calibration(int64_t layer) const {
    return !layer_calibrated_.empty() && !layer_calibrated_[static_cast<size_t>(layer)];
  }
  // Fixes `layer`'s scales from num_tokens tokens of keys and values, each token's heads side by
  // side ([t][n_kv_heads * head_dim]).
  void calibrate_layer(int64_t layer, const float* k, const float* v, int64_t num_tokens);
  // A calibrated layer's f16 scale bits of `head` (keys, values).
  uint16_t fixed_key_scale(int64_t layer, int64_t head) const {
    return k_scale_[static_cast<size_t>(layer * spec_.n_kv_heads + head)];
  }
  uint16_t fixed_value_scale(int64_t layer, int64_t head) const {
    return v_scale_[static_cast<size_t>(layer * spec_.n_kv_heads + head)];
  }

  // Copies every layer's K and V of physical block `src` into block `dst` (copy-on-write).
  void copy_block(int64_t src, int64_t dst) { copy_block_from(*this, src, dst); }
  // Copies block `src` of another cache of the same spec (but any block count) into block `dst`
  // of this one: swapping between the device cache and the host swap space. Bytes as stored
  // (elements and metadata together).
  void copy_block_from(const KvCache& other, int64_t src, int64_t dst);

  // Quantizes one group (KIVI): the block_size residual rows held by `rows` (residual row i in
  // block rows[i / residual_rows_per_block()]) become, in every layer and head, the quantized
  // group of block `dst` (kv_codec.h; row types' rows are copied as they are). `dst` may not be
  // one of `rows`. With `pool`, the layers' and heads' units are encoded in parallel (the same
  // bytes).
  void quantize_group(std::span<const int32_t> rows, int64_t dst, ThreadPool* pool = nullptr);
  // One layer's and head's part of quantize_group, into k_unit / v_unit (key_unit_bytes() and
  // value_unit_bytes()): what attention uses for a group it reads quantized while it is still
  // held as residual rows, so both give the same bytes.
  void encode_group_units(int64_t layer, int64_t head, std::span<const int32_t> rows,
                          std::byte* k_unit, std::byte* v_unit) const;

  // Copies every layer's K and V rows of slot `src` into slot `dst` (an accepted speculative tree
  // path moved to its positions), metadata included (and dst's block's key bounds recomputed).
  void copy_slot(int64_t src, int64_t dst);

  // Quest (spec().key_bounds): head `head`'s key bounds of `block` in `layer`: head_dim channel
  // minima, then head_dim maxima, over the block's rows 0..r as stored (decoded), r the row
  // written last. A block's bounds thus depend on its rows alone, whatever the chunking or
  // batch, and once a block is full (its last row written last) only on its committed keys.
  // KIVI: a group stored quantized keeps the union of its residual blocks' bounds (quantize_group
  // stores them), which Quest's selection takes the same way for a group still held as rows: the
  // bounds of its rows as written, never of the quantized values, so a selection does not depend
  // on when the group was quantized.
  const float* key_bounds(int64_t layer, int64_t block, int64_t head) const {
    return bounds_[static_cast<size_t>(layer)].data() +
           (block * spec_.n_kv_heads + head) * 2 * spec_.head_dim;
  }
  // Recomputes every head's key bounds of `block` in `layer` over its rows 0..last_row.
  void update_key_bounds(int64_t layer, int64_t block, int64_t last_row);
  // Head `head`'s key bounds over `blocks` together (elementwise minima and maxima of theirs)
  // into out[2 * head_dim]: a KIVI group's, from its residual blocks (quantize_group stores it
  // with the group; Quest's selection takes it for a group still held as rows).
  void union_key_bounds(int64_t layer, std::span<const int32_t> blocks, int64_t head,
                        float* out) const;
  // Bytes of storage (K and V, all layers).
  int64_t bytes() const { return n_blocks_ * spec_.bytes_per_block(); }

  // Starts making the storage resident in the background, at idle priority (core/page_warmer.h):
  // 2 MiB of every layer's K and V at a time, lowest blocks first (the order a block pool hands
  // out blocks never used), so that a block's first write does not pay a page fault inside a
  // forward pass. Contents are unchanged; the cache may be used meanwhile. Once only.
  void warm_in_background();
  // Blocks until the storage is resident (a no-op without warm_in_background).
  void wait_resident();

 private:
  using Storage = std::unique_ptr<std::byte[], LargeBufferFree>;

  KvCacheSpec spec_;
  int64_t n_blocks_ = 0;
  int64_t k_row_ = 0, v_row_ = 0;    // bytes of a residual key row, of a value row
  int64_t k_unit_ = 0, v_unit_ = 0;  // bytes of a head's key unit, value unit
  int64_t rows_per_block_ = 0;       // residual rows (slots) per block
  // Storage is left uninitialised (and so, for large caches, untouched by the OS until used):
  // a slot is always written before any token reads it. Huge pages where large enough
  // (core/large_buffer.h): attention reads scattered 4-8 KiB runs of it, a TLB miss each on small
  // pages.
  std::vector<Storage> k_, v_;
  // Quest's key bounds per layer ([block][head][2][head_dim]; empty without them).
  std::vector<std::vector<float>> bounds_;
  // Calibrated fp8 scales (empty: every row its own): per layer whether fixed, and the f16 bits
  // per layer and head.
  std::vector<uint8_t> layer_calibrated_;
  std::vector<uint16_t> k_scale_, v_scale_;
  // Last: destroyed (its thread stopped) before the storage it populates is unmapped.
  std::unique_ptr<PageWarmer> warmer_;
};

}  // namespace vesper::backend

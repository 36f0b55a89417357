#include "backend/kv_cache.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/kv_codec_cpu.h"
#include "backend/cpu/matmul_cpu.h"
#include "backend/kv_codec.h"

namespace vesper::backend {

namespace {
// The largest KIVI group (--kivi-group-size) the AVX2 encoder takes its rows for at once.
constexpr int64_t kMaxGroup = 128;
}  // namespace

KvCache::KvCache(const KvCacheSpec& spec, int64_t n_blocks)
    : spec_(spec),
      n_blocks_(n_blocks),
      k_row_(spec.key_row_bytes()),
      v_row_(spec.value_row_bytes()),
      k_unit_(spec.key_unit_bytes()),
      v_unit_(spec.value_unit_bytes()),
      rows_per_block_(spec.residual_rows_per_block()) {
  VESPER_CHECK(spec.n_layers > 0 && n_blocks >= 0 && spec.block_size > 0);
  const auto k_bytes = static_cast<size_t>(n_blocks * spec.key_block_bytes_per_layer());
  const auto v_bytes = static_cast<size_t>(n_blocks * spec.value_block_bytes_per_layer());
  for (int64_t l = 0; l < spec.n_layers; ++l) {
    k_.push_back(allocate_large_buffer(std::max<size_t>(k_bytes, 1)));
    v_.push_back(allocate_large_buffer(std::max<size_t>(v_bytes, 1)));
    VESPER_CHECK(k_.back() != nullptr && v_.back() != nullptr,
                 "KV cache: cannot allocate %zu bytes per layer", k_bytes + v_bytes);
  }
  if (spec.key_bounds)
    bounds_.assign(
        static_cast<size_t>(spec.n_layers),
        std::vector<float>(static_cast<size_t>(n_blocks * spec.n_kv_heads * 2 * spec.head_dim)));
}

void KvCache::warm_in_background() {
  VESPER_CHECK(warmer_ == nullptr, "KV cache: warmed twice");
  std::vector<std::span<std::byte>> regions;
  const auto k_bytes = static_cast<size_t>(n_blocks_ * spec_.key_block_bytes_per_layer());
  const auto v_bytes = static_cast<size_t>(n_blocks_ * spec_.value_block_bytes_per_layer());
  for (int64_t l = 0; l < spec_.n_layers; ++l) {
    regions.emplace_back(k_[static_cast<size_t>(l)].get(), k_bytes);
    regions.emplace_back(v_[static_cast<size_t>(l)].get(), v_bytes);
  }
  warmer_ = std::make_unique<PageWarmer>(std::move(regions), size_t{2} << 20);
}

void KvCache::wait_resident() {
  if (warmer_ != nullptr) warmer_->wait();
}

void KvCache::update_key_bounds(int64_t layer, int64_t block, int64_t last_row) {
  const int64_t hd = spec_.head_dim;
  thread_local std::vector<float> row;  // per written block and layer: no allocation once warm
  row.resize(static_cast<size_t>(hd));
  for (int64_t h = 0; h < spec_.n_kv_heads; ++h) {
    float* lo =
        bounds_[static_cast<size_t>(layer)].data() + (block * spec_.n_kv_heads + h) * 2 * hd;
    float* hi = lo + hd;
    for (int64_t r = 0; r <= last_row; ++r) {
      decode_kv_row(kv_row_dtype(spec_.dtypes.k), key_row(layer, block * rows_per_block_ + r, h),
                    hd, row.data());
      for (int64_t c = 0; c < hd; ++c) {
        const float x = row[static_cast<size_t>(c)];
        lo[c] = r == 0 ? x : std::min(lo[c], x);
        hi[c] = r == 0 ? x : std::max(hi[c], x);
      }
    }
  }
}

namespace {

bool is_fp8(KvDtype dtype) {
  return dtype == KvDtype::kFp8E4M3 || dtype == KvDtype::kFp8E5M2;
}

// Whether the AVX2 + F16C encoders (cpu/kv_codec_cpu.h) run on this CPU.
bool avx2_encoders() {
  static const bool avx2 = cpu::selected_isa() != cpu::Isa::kScalar;
  return avx2;
}

// A row as encode_kv_row writes it; f16 rows (the default type, and KIVI's residual rows) through
// F16C where the CPU has it (the same bytes).
void encode_row(KvDtype dtype, const float* x, int64_t n, std::byte* row) {
  if (dtype == KvDtype::kF16 && avx2_encoders()) return cpu::encode_f16_row_avx2(x, n, row);
  encode_kv_row(dtype, x, n, row);
}

}  // namespace

void KvCache::write_key(int64_t layer, int64_t slot, int64_t head, const float* x) {
  const KvDtype dtype = kv_row_dtype(spec_.dtypes.k);
  std::byte* row = key_row(layer, slot, head);
  if (is_fp8(dtype) && !layer_calibrated_.empty() && layer_calibrated_[layer])
    return encode_fp8_row_scaled(dtype, x, spec_.head_dim, fixed_key_scale(layer, head), row);
  encode_row(dtype, x, spec_.head_dim, row);
}
void KvCache::write_value(int64_t layer, int64_t slot, int64_t head, const float* x) {
  const KvDtype dtype = kv_row_dtype(spec_.dtypes.v);
  std::byte* row = value_row(layer, slot, head);
  if (is_fp8(dtype) && !layer_calibrated_.empty() && layer_calibrated_[layer])
    return encode_fp8_row_scaled(dtype, x, spec_.head_dim, fixed_value_scale(layer, head), row);
  encode_row(dtype, x, spec_.head_dim, row);
}

void KvCache::calibrate_fp8_scales() {
  const auto n = static_cast<size_t>(spec_.n_layers * spec_.n_kv_heads);
  layer_calibrated_.assign(static_cast<size_t>(spec_.n_layers), 0);
  k_scale_.assign(n, 0);
  v_scale_.assign(n, 0);
}

void KvCache::calibrate_layer(int64_t layer, const float* k, const float* v, int64_t num_tokens) {
  VESPER_CHECK(awaits_calibration(layer), "KV cache: layer %lld is not awaiting calibration",
               static_cast<long long>(layer));
  const int64_t d = spec_.head_dim, n = spec_.token_elements();
  for (int64_t h = 0; h < spec_.n_kv_heads; ++h) {
    float k_amax = 0, v_amax = 0;
    for (int64_t t = 0; t < num_tokens; ++t)
      for (int64_t i = 0; i < d; ++i) {
        const float x = k[t * n + h * d + i], y = v[t * n + h * d + i];
        if (std::isfinite(x)) k_amax = std::max(k_amax, std::fabs(x));
        if (std::isfinite(y)) v_amax = std::max(v_amax, std::fabs(y));
      }
    const auto at = static_cast<size_t>(layer * spec_.n_kv_heads + h);
    if (is_fp8(spec_.dtypes.k)) k_scale_[at] = fp8_scale_bits(spec_.dtypes.k, k_amax);
    if (is_fp8(spec_.dtypes.v)) v_scale_[at] = fp8_scale_bits(spec_.dtypes.v, v_amax);
  }
  layer_calibrated_[static_cast<size_t>(layer)] = 1;
}

void KvCache::encode_group_units(int64_t layer, int64_t head, std::span<const int32_t> rows,
                                 std::byte* k_unit, std::byte* v_unit) const {
  const int64_t g = spec_.block_size, d = spec_.head_dim;
  VESPER_CHECK(static_cast<int64_t>(rows.size()) == spec_.residual_blocks_per_group(),
               "a group's residual rows in %zu blocks, not %lld", rows.size(),
               static_cast<long long>(spec_.residual_blocks_per_group()));
  auto slot = [&](int64_t i) {
    return int64_t{rows[i / rows_per_block_]} * rows_per_block_ + i % rows_per_block_;
  };
  thread_local std::vector<float> x;
  x.resize(static_cast<size_t>(g * d));
  auto one_side = [&](KvDtype dtype, KvSide side, auto row_of, std::byte* unit, int64_t row_bytes) {
    if (!kv_is_kivi(dtype)) {  // row types keep their rows' bytes
      for (int64_t i = 0; i < g; ++i)
        std::memcpy(unit + i * row_bytes, row_of(i), static_cast<size_t>(row_bytes));
      return;
    }
    // KIVI residual rows are f16: the AVX2 encoder reads them as they are (the same bytes).
    if (avx2_encoders() && g <= kMaxGroup) {
      const std::byte* rows_of_group[kMaxGroup];
      for (int64_t i = 0; i < g; ++i) rows_of_group[i] = row_of(i);
      cpu::encode_kivi_group_avx2(spec_, dtype, side, rows_of_group, unit);
      return;
    }
    for (int64_t i = 0; i < g; ++i) decode_kv_row(kv_row_dtype(dtype), row_of(i), d, &x[i * d]);
    encode_kv_group(spec_, dtype, side, x.data(), unit);
  };
  one_side(
      spec_.dtypes.k, KvSide::kKey, [&](int64_t i) { return key_row(layer, slot(i), head); },
      k_unit, k_row_);
  one_side(
      spec_.dtypes.v, KvSide::kValue, [&](int64_t i) { return value_row(layer, slot(i), head); },
      v_unit, v_row_);
}

void KvCache::quantize_group(std::span<const int32_t> rows, int64_t dst, ThreadPool* pool) {
  VESPER_CHECK(dst >= 0 && dst < n_blocks_, "quantize_group: block %lld out of range",
               static_cast<long long>(dst));
  for (int32_t b : rows)
    VESPER_CHECK(b >= 0 && b < n_blocks_ && b != dst, "quantize_group: residual block %d", b);
  // Every (layer, head) unit on its own: the units are disjoint, the encoder's buffers per thread.
  auto units = [&](size_t begin, size_t end) {
    for (size_t u = begin; u < end; ++u) {
      const auto l = static_cast<int64_t>(u) / spec_.n_kv_heads;
      const auto h = static_cast<int64_t>(u) % spec_.n_kv_heads;
      encode_group_units(l, h, rows, const_cast<std::byte*>(key_run(l, dst, h)),
                         const_cast<std::byte*>(value_run(l, dst, h)));
    }
  };
  const auto n = static_cast<size_t>(spec_.n_layers * spec_.n_kv_heads);
  if (pool != nullptr)
    pool->parallel_for(n, units);
  else
    units(0, n);
  // Quest: the group's bounds are those of its rows as written (the union of its residual blocks'
  // bounds), the same whether a query reads the group stored quantized or from those rows.
  if (!bounds_.empty())
    for (int64_t l = 0; l < spec_.n_layers; ++l)
      for (int64_t h = 0; h < spec_.n_kv_heads; ++h)
        union_key_bounds(l, rows, h,
                         bounds_[static_cast<size_t>(l)].data() +
                             (dst * spec_.n_kv_heads + h) * 2 * spec_.head_dim);
}

void KvCache::union_key_bounds(int64_t layer, std::span<const int32_t> blocks, int64_t head,
                               float* out) const {
  const int64_t hd = spec_.head_dim;
  const float* first = key_bounds(layer, blocks[0], head);
  std::copy_n(first, 2 * hd, out);
  for (size_t i = 1; i < blocks.size(); ++i) {
    const float* in = key_bounds(layer, blocks[i], head);
    for (int64_t c = 0; c < hd; ++c) {
      out[c] = std::min(out[c], in[c]);
      out[hd + c] = std::max(out[hd + c], in[hd + c]);
    }
  }
}

void KvCache::copy_block_from(const KvCache& other, int64_t src, int64_t dst) {
  const KvCacheSpec& o = other.spec_;
  VESPER_CHECK(o.n_layers == spec_.n_layers && o.block_size == spec_.block_size &&
                   o.dtypes == spec_.dtypes && o.n_kv_heads == spec_.n_kv_heads &&
                   o.head_dim == spec_.head_dim && o.key_bounds == spec_.key_bounds,
               "copy between caches of different specs");
  VESPER_CHECK(src >= 0 && src < other.n_blocks_ && dst >= 0 && dst < n_blocks_,
               "block copy %lld -> %lld out of range", static_cast<long long>(src),
               static_cast<long long>(dst));
  const int64_t nk = spec_.key_block_bytes_per_layer(), nv = spec_.value_block_bytes_per_layer();
  for (int64_t l = 0; l < spec_.n_layers; ++l) {
    std::memcpy(k_[l].get() + dst * nk, other.k_[l].get() + src * nk, static_cast<size_t>(nk));
    std::memcpy(v_[l].get() + dst * nv, other.v_[l].get() + src * nv, static_cast<size_t>(nv));
    if (!bounds_.empty()) {
      const int64_t nb = spec_.n_kv_heads * 2 * spec_.head_dim;
      std::copy_n(other.bounds_[static_cast<size_t>(l)].begin() + src * nb, nb,
                  bounds_[static_cast<size_t>(l)].begin() + dst * nb);
    }
  }
}

void KvCache::copy_slot(int64_t src, int64_t dst) {
  VESPER_CHECK(src >= 0 && src < num_slots() && dst >= 0 && dst < num_slots(),
               "slot copy %lld -> %lld out of range", static_cast<long long>(src),
               static_cast<long long>(dst));
  for (int64_t l = 0; l < spec_.n_layers; ++l)
    for (int64_t h = 0; h < spec_.n_kv_heads; ++h) {
      std::memcpy(key_row(l, dst, h), key_row(l, src, h), static_cast<size_t>(k_row_));
      std::memcpy(value_row(l, dst, h), value_row(l, src, h), static_cast<size_t>(v_row_));
    }
  if (!bounds_.empty())
    for (int64_t l = 0; l < spec_.n_layers; ++l)
      update_key_bounds(l, dst / rows_per_block_, dst % rows_per_block_);
}

}  // namespace vesper::backend

#include "backend/kv_codec.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <string>
#include <vector>

#include "core/check.h"

namespace vesper::backend {
namespace {

// The smallest f16 >= x (x finite, >= 0), clamped to the largest finite f16.
uint16_t f16_round_up(float x) {
  uint16_t h = f32_to_fp16(x);
  if ((h & 0x7FFFu) >= 0x7C00u) return 0x7BFF;  // overflowed to infinity
  if (fp16_to_f32(h) < x) ++h;                  // x >= 0: the next f16 up is one more
  return h;
}

// The largest f16 <= x (x finite), clamped to the most negative finite f16.
uint16_t f16_round_down(float x) {
  if (x >= 0) {
    uint16_t h = f32_to_fp16(x);
    if ((h & 0x7FFFu) >= 0x7C00u) h = 0x7BFF;
    if (fp16_to_f32(h) > x) --h;
    return h;
  }
  return static_cast<uint16_t>(f16_round_up(-x) | 0x8000u);
}

void store_f16(std::byte* p, uint16_t h) {
  std::memcpy(p, &h, sizeof(h));
}

// round(v) clamped to [lo, hi]; NaN gives lo.
int clamp_round(float v, int lo, int hi) {
  if (!(v > static_cast<float>(lo))) return lo;
  if (!(v < static_cast<float>(hi))) return hi;
  return static_cast<int>(std::nearbyint(v));
}

struct Fp8Format {
  int mantissa_bits;
  int min_normal_exp;     // exponent of the smallest normal value
  float max;              // largest finite value
  uint8_t max_code;       // its bits, without the sign
  float min_normal;       // 2^min_normal_exp
  float subnormal_units;  // 2^(mantissa_bits - min_normal_exp): subnormal codes per unit
  float subnormal_step;   // its inverse: the value of subnormal code 1
};
constexpr Fp8Format kE4M3{3, -6, 448.0f, 0x7E, 0x1p-6f, 0x1p9f, 0x1p-9f};
constexpr Fp8Format kE5M2{2, -14, 57344.0f, 0x7B, 0x1p-14f, 0x1p16f, 0x1p-16f};

// v in fp8, rounded to nearest even, saturating; NaN becomes 0. Normal values are rounded in
// their f32 bits (the carry of a rounded-up mantissa moves into the exponent, as it should);
// values below the smallest normal are counted in steps of the subnormal spacing. `value` gets
// the code's value (exact in f32).
uint8_t encode_fp8(float v, const Fp8Format& f, float& value) {
  const uint8_t sign = std::signbit(v) ? 0x80 : 0;
  const float a = std::fabs(v);
  int code;
  float magnitude;
  if (std::isnan(a)) {
    value = 0;
    return 0;
  }
  if (a >= f.max) {
    code = f.max_code;
    magnitude = f.max;
  } else if (a < f.min_normal) {
    // Subnormal: a in units of the subnormal step (exact), rounded; 2^m lands on the smallest
    // normal, whose code follows the subnormals'.
    code = static_cast<int>(std::nearbyint(a * f.subnormal_units));
    magnitude = static_cast<float>(code) * f.subnormal_step;
  } else {
    const int m = f.mantissa_bits, shift = 23 - m;
    uint32_t bits = std::bit_cast<uint32_t>(a);
    bits += (1u << (shift - 1)) - 1 + ((bits >> shift) & 1u);  // round to nearest even
    bits &= ~((1u << shift) - 1);
    const int exp = static_cast<int>(bits >> 23) - 127;
    code =
        ((exp - f.min_normal_exp + 1) << m) | static_cast<int>((bits >> shift) & ((1u << m) - 1));
    magnitude = std::bit_cast<float>(bits);
    if (code > f.max_code) {
      code = f.max_code;
      magnitude = f.max;
    }
  }
  value = sign ? -magnitude : magnitude;
  return static_cast<uint8_t>(sign | code);
}

// Quantizes x[i * stride] for i < n as one run sharing a scale and zero point (kv_codec.h's KIVI
// rule) into codes[i]; stores the f16 scale and zero at meta[0], meta[2].
void quantize_run(const float* x, int64_t n, int64_t stride, int levels, uint8_t* codes,
                  std::byte* meta) {
  float lo, hi;
  kivi_finite_range(x, n, stride, lo, hi);
  const KiviRunParams p = kivi_run_params(lo, hi, levels);
  for (int64_t i = 0; i < n; ++i) codes[i] = kivi_code(x[i * stride], p, levels);
  store_f16(meta, p.scale_bits);
  store_f16(meta + 2, p.zero_bits);
}

}  // namespace

void kivi_finite_range(const float* x, int64_t n, int64_t stride, float& lo, float& hi) {
  lo = INFINITY;
  hi = -INFINITY;
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i * stride];
    if (std::isfinite(v)) {
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
  }
}

uint8_t kivi_code(float x, const KiviRunParams& p, int levels) {
  return static_cast<uint8_t>(p.scale == 0 ? 0 : clamp_round((x - p.zero) / p.scale, 0, levels));
}

void kivi_pack_codes(const uint8_t* codes, int64_t begin, int64_t n, int bits, std::byte* row) {
  for (int64_t c = begin; c < n; ++c) {
    const int64_t bit = c * bits;
    row[bit / 8] |= std::byte{static_cast<uint8_t>(codes[c] << (bit % 8))};
  }
}

KiviRunParams kivi_run_params(float lo, float hi, int levels) {
  if (lo > hi) lo = hi = 0;
  KiviRunParams p;
  p.zero_bits = f16_round_down(lo);
  p.zero = fp16_to_f32(p.zero_bits);
  p.scale_bits = f16_round_up((hi - p.zero) / static_cast<float>(levels));
  p.scale = fp16_to_f32(p.scale_bits);
  return p;
}

void encode_kv_group(const KvCacheSpec& spec, KvDtype dtype, KvSide side, const float* x,
                     std::byte* group) {
  const int64_t g = spec.block_size, d = spec.head_dim;
  if (!kv_is_kivi(dtype)) {
    const int64_t row = spec.row_bytes(dtype);
    for (int64_t i = 0; i < g; ++i) encode_kv_row(dtype, x + i * d, d, group + i * row);
    return;
  }
  const int bits = kv_kivi_bits(dtype), levels = (1 << bits) - 1;
  const int64_t packed = kivi_packed_row_bytes(dtype, d);
  std::memset(group, 0, static_cast<size_t>(spec.group_bytes(dtype, side)));
  thread_local std::vector<uint8_t> codes;
  codes.assign(static_cast<size_t>(g * d), 0);
  if (side == KvSide::kKey) {
    // Per channel over the group's tokens; codes laid out [token][channel].
    thread_local std::vector<uint8_t> column;
    column.resize(static_cast<size_t>(g));
    std::byte meta[4];
    for (int64_t c = 0; c < d; ++c) {
      quantize_run(x + c, g, d, levels, column.data(), meta);
      std::memcpy(group + 2 * c, meta, 2);
      std::memcpy(group + 2 * (d + c), meta + 2, 2);
      for (int64_t i = 0; i < g; ++i) codes[static_cast<size_t>(i * d + c)] = column[i];
    }
    std::byte* rows = group + 4 * d;
    for (int64_t i = 0; i < g; ++i)
      kivi_pack_codes(codes.data() + i * d, 0, d, bits, rows + i * packed);
    return;
  }
  // Values: per token, over runs of min(G, D) channels.
  const int64_t runs = kivi_value_channel_groups(g, d);
  const int64_t row_bytes = packed + 4 * runs;
  for (int64_t i = 0; i < g; ++i) {
    std::byte* row = group + i * row_bytes;
    uint8_t* row_codes = codes.data() + i * d;
    for (int64_t r = 0; r < runs; ++r) {
      const int64_t c0 = r * g, n = std::min(g, d - c0);
      quantize_run(x + i * d + c0, n, 1, levels, row_codes + c0, row + packed + 4 * r);
    }
    kivi_pack_codes(row_codes, 0, d, bits, row);
  }
}

void decode_kv_group_rows(const KvCacheSpec& spec, KvDtype dtype, KvSide side,
                          const std::byte* group, int64_t first, int64_t n, float* out) {
  const int64_t g = spec.block_size, d = spec.head_dim;
  if (!kv_is_kivi(dtype)) {
    const int64_t row = spec.row_bytes(dtype);
    for (int64_t i = 0; i < n; ++i) decode_kv_row(dtype, group + (first + i) * row, d, out + i * d);
    return;
  }
  const int bits = kv_kivi_bits(dtype);
  const int64_t packed = kivi_packed_row_bytes(dtype, d);
  auto f16_at = [](const std::byte* p) {
    uint16_t h;
    std::memcpy(&h, p, sizeof(h));
    return fp16_to_f32(h);
  };
  if (side == KvSide::kKey) {
    const std::byte* rows = group + 4 * d;
    for (int64_t i = 0; i < n; ++i) {
      const std::byte* row = rows + (first + i) * packed;
      for (int64_t c = 0; c < d; ++c)
        out[i * d + c] = std::fma(static_cast<float>(kivi_unpack_code(row, c, bits)),
                                  f16_at(group + 2 * c), f16_at(group + 2 * (d + c)));
    }
    return;
  }
  const int64_t row_bytes = packed + 4 * kivi_value_channel_groups(g, d);
  for (int64_t i = 0; i < n; ++i) {
    const std::byte* row = group + (first + i) * row_bytes;
    for (int64_t c = 0; c < d; ++c) {
      const std::byte* meta = row + packed + 4 * (c / g);
      out[i * d + c] = std::fma(static_cast<float>(kivi_unpack_code(row, c, bits)), f16_at(meta),
                                f16_at(meta + 2));
    }
  }
}

void encode_fp8_row_scaled(KvDtype dtype, const float* x, int64_t n, uint16_t scale_bits,
                           std::byte* row) {
  VESPER_CHECK(dtype == KvDtype::kFp8E4M3 || dtype == KvDtype::kFp8E5M2,
               "encode_fp8_row_scaled: %s is not an fp8 type",
               std::string(kv_dtype_name(dtype)).c_str());
  const Fp8Format& f = dtype == KvDtype::kFp8E4M3 ? kE4M3 : kE5M2;
  const float scale = fp16_to_f32(scale_bits);
  for (int64_t i = 0; i < n; ++i) {
    float value;
    row[i] = std::byte{scale == 0 ? uint8_t{0} : encode_fp8(x[i] / scale, f, value)};
  }
  store_f16(row + n, scale_bits);
}

uint16_t fp8_scale_bits(KvDtype dtype, float amax) {
  const Fp8Format& f = dtype == KvDtype::kFp8E4M3 ? kE4M3 : kE5M2;
  return f16_round_up(amax / f.max);
}

void encode_kv_row(KvDtype dtype, const float* x, int64_t n, std::byte* row) {
  switch (dtype) {
    case KvDtype::kF32:
      std::memcpy(row, x, static_cast<size_t>(n) * sizeof(float));
      return;
    case KvDtype::kF16:
      for (int64_t i = 0; i < n; ++i) store_f16(row + 2 * i, f32_to_fp16(x[i]));
      return;
    case KvDtype::kBF16:
      for (int64_t i = 0; i < n; ++i) store_f16(row + 2 * i, f32_to_bf16(x[i]));
      return;
    case KvDtype::kFp8E4M3:
    case KvDtype::kFp8E5M2: {
      const Fp8Format& f = dtype == KvDtype::kFp8E4M3 ? kE4M3 : kE5M2;
      float amax = 0;
      for (int64_t i = 0; i < n; ++i)
        if (std::isfinite(x[i])) amax = std::max(amax, std::fabs(x[i]));
      // Each candidate scale's codes and squared error; the best (first on ties) is kept.
      // (An fp8 value times an f16 scale is exact in f32, so `value * scale` is the decoded
      // element decode_kv_row gives.)
      constexpr int64_t kKeep = 512;  // rows up to this long keep the best codes as they go
      uint8_t codes[kKeep], best[kKeep];
      double best_err = INFINITY;
      uint16_t best_bits = 0;
      for (const float step : kFp8ScaleSteps) {
        const uint16_t bits = f16_round_up(amax / f.max * step);
        const float scale = fp16_to_f32(bits);
        if (scale == 0) break;  // an all-zero row: codes of 0, scale 0
        double err = 0;
        for (int64_t i = 0; i < n; ++i) {
          float value;
          const uint8_t code = encode_fp8(x[i] / scale, f, value);
          if (i < kKeep) codes[i] = code;
          if (std::isfinite(x[i])) {
            const double d = static_cast<double>(value * scale) - static_cast<double>(x[i]);
            err += d * d;
          }
        }
        if (err < best_err) {
          best_err = err;
          best_bits = bits;
          std::memcpy(best, codes, static_cast<size_t>(std::min(n, kKeep)));
        }
      }
      const float scale = fp16_to_f32(best_bits);
      for (int64_t i = 0; i < n; ++i) {
        float value;
        row[i] = std::byte{scale == 0  ? uint8_t{0}
                           : i < kKeep ? best[i]
                                       : encode_fp8(x[i] / scale, f, value)};
      }
      store_f16(row + n, best_bits);
      return;
    }
    case KvDtype::kInt8: {
      float lo = INFINITY, hi = -INFINITY;
      for (int64_t i = 0; i < n; ++i)
        if (std::isfinite(x[i])) {
          lo = std::min(lo, x[i]);
          hi = std::max(hi, x[i]);
        }
      if (lo > hi) lo = hi = 0;  // no finite element
      const uint16_t zero_bits = f16_round_down(lo);
      const float zero = fp16_to_f32(zero_bits);
      const uint16_t scale_bits = f16_round_up((hi - zero) / 255.0f);
      const float scale = fp16_to_f32(scale_bits);
      for (int64_t i = 0; i < n; ++i)
        row[i] = std::byte{
            static_cast<uint8_t>(scale == 0 ? 0 : clamp_round((x[i] - zero) / scale, 0, 255))};
      store_f16(row + n, scale_bits);
      store_f16(row + n + 2, zero_bits);
      return;
    }
    case KvDtype::kKivi2:
    case KvDtype::kKivi4:
      break;
  }
  VESPER_CHECK(false, "encode_kv_row: %s is stored in groups",
               std::string(kv_dtype_name(dtype)).c_str());
}

void decode_kv_row(KvDtype dtype, const std::byte* row, int64_t n, float* out, int64_t begin) {
  switch (dtype) {
    case KvDtype::kF32:
      std::memcpy(out + begin, row + 4 * begin, static_cast<size_t>(n - begin) * sizeof(float));
      return;
    case KvDtype::kF16:
    case KvDtype::kBF16:
      for (int64_t i = begin; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, row + 2 * i, sizeof(h));
        out[i] = dtype == KvDtype::kF16 ? fp16_to_f32(h) : bf16_to_f32(h);
      }
      return;
    case KvDtype::kFp8E4M3:
    case KvDtype::kFp8E5M2: {
      const float scale = kv_row_meta(dtype, row, n, 0) * kv_fp8_f16_factor(dtype);
      for (int64_t i = begin; i < n; ++i)
        out[i] = fp16_to_f32(kv_fp8_to_f16_bits(dtype, static_cast<uint8_t>(row[i]))) * scale;
      return;
    }
    case KvDtype::kInt8: {
      const float scale = kv_row_meta(dtype, row, n, 0), zero = kv_row_meta(dtype, row, n, 1);
      for (int64_t i = begin; i < n; ++i)
        out[i] = std::fma(static_cast<float>(static_cast<uint8_t>(row[i])), scale, zero);
      return;
    }
    case KvDtype::kKivi2:
    case KvDtype::kKivi4:
      break;
  }
  VESPER_CHECK(false, "decode_kv_row: %s is stored in groups",
               std::string(kv_dtype_name(dtype)).c_str());
}

}  // namespace vesper::backend

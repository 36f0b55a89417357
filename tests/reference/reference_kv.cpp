#include "reference/reference_kv.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "reference/reference_quant.h"

namespace vesper::reference {
namespace {

using backend::KvDtype;

uint16_t read_u16(const std::byte* p) {
  return static_cast<uint16_t>(static_cast<unsigned>(p[0]) | static_cast<unsigned>(p[1]) << 8);
}
void write_u16(std::vector<std::byte>& out, uint16_t h) {
  out.push_back(std::byte(h & 0xFF));
  out.push_back(std::byte(h >> 8));
}

// The f16 bits of the smallest finite f16 >= x (x >= 0), or the largest finite f16: a search
// over the ordered positive codes.
uint16_t f16_at_least(double x) {
  uint16_t lo = 0, hi = 0x7BFF;
  if (fp16_value(hi) < x) return hi;
  while (lo < hi) {
    const auto mid = static_cast<uint16_t>((lo + hi) / 2);
    if (fp16_value(mid) >= x)
      hi = mid;
    else
      lo = static_cast<uint16_t>(mid + 1);
  }
  return lo;
}
// The largest finite f16 <= x.
uint16_t f16_at_most(double x) {
  if (x >= 0) {
    const uint16_t up = f16_at_least(x);
    return fp16_value(up) <= x || up == 0 ? up : static_cast<uint16_t>(up - 1);
  }
  return static_cast<uint16_t>(f16_at_least(-x) | 0x8000);
}

// Round to nearest f16, ties to even (the IEEE conversion), from the definition.
uint16_t f16_nearest(float x) {
  if (std::isnan(x)) return 0x7E00;
  const double a = std::fabs(static_cast<double>(x));
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  if (a >= 65520.0) return sign | 0x7C00;  // beyond the halfway point past the largest: infinity
  const uint16_t up = f16_at_least(a);
  uint16_t best = up;
  if (up > 0) {
    const uint16_t down = static_cast<uint16_t>(up - 1);
    const double du = fp16_value(up) - a, dd = a - fp16_value(down);
    if (dd < du || (dd == du && down % 2 == 0)) best = down;
  }
  return sign | best;
}

uint16_t bf16_nearest(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if (std::isnan(x)) return static_cast<uint16_t>((u >> 16) | 64);
  // Candidates: truncation and the next value up in magnitude; ties to even.
  const uint32_t down = u & 0xFFFF0000u, rest = u & 0xFFFFu;
  uint32_t r = down;
  if (rest > 0x8000u || (rest == 0x8000u && (down >> 16) % 2 == 1)) r = down + 0x10000u;
  return static_cast<uint16_t>(r >> 16);
}

// The fp8 code nearest v: among all finite codes, the one at the smallest distance, ties to the
// even code; beyond the largest finite value, the largest (saturation); NaN gives 0.
uint8_t fp8_nearest(double v, bool e4m3) {
  if (std::isnan(v)) return 0;
  double largest = 0;
  for (int c = 0; c < 128; ++c) {
    const double value = fp8_value(static_cast<uint8_t>(c), e4m3);
    if (std::isfinite(value)) largest = std::max(largest, value);
  }
  if (std::fabs(v) >= largest) v = std::signbit(v) ? -largest : largest;  // saturation
  int best = -1;
  double best_d = std::numeric_limits<double>::infinity();
  for (int c = 0; c < 256; ++c) {
    const double value = fp8_value(static_cast<uint8_t>(c), e4m3);
    if (!std::isfinite(value)) continue;
    if ((std::signbit(value) != std::signbit(v))) continue;  // keeps the sign, zero included
    const double d = std::fabs(value - v);
    if (d < best_d || (d == best_d && c % 2 == 0)) {
      best = c;
      best_d = d;
    }
  }
  return static_cast<uint8_t>(best);
}

}  // namespace

std::vector<std::byte> encode_fp8_row_scaled(KvDtype dtype, const float* x, int64_t n,
                                             uint16_t scale_bits) {
  const bool e4m3 = dtype == KvDtype::kFp8E4M3;
  const auto scale = static_cast<float>(fp16_value(scale_bits));
  std::vector<std::byte> out;
  for (int64_t i = 0; i < n; ++i)
    out.push_back(std::byte(scale == 0 ? 0 : fp8_nearest(x[i] / scale, e4m3)));
  write_u16(out, scale_bits);
  return out;
}

double fp8_value(uint8_t code, bool e4m3) {
  const int man_bits = e4m3 ? 3 : 2, bias = e4m3 ? 7 : 15;
  const int e = (code & 0x7F) >> man_bits, m = code & ((1 << man_bits) - 1);
  const double sign = (code & 0x80) ? -1.0 : 1.0;
  if (e4m3 && e == 15 && m == 7) return std::numeric_limits<double>::quiet_NaN();
  if (!e4m3 && e == 31)
    return m == 0 ? sign * std::numeric_limits<double>::infinity()
                  : std::numeric_limits<double>::quiet_NaN();
  if (e == 0) return sign * std::ldexp(m, 1 - bias - man_bits);
  return sign * std::ldexp((1 << man_bits) + m, e - bias - man_bits);
}

std::vector<std::byte> encode_kv_row(KvDtype dtype, const float* x, int64_t n) {
  std::vector<std::byte> out;
  switch (dtype) {
    case KvDtype::kF32:
      out.resize(static_cast<size_t>(4 * n));
      std::memcpy(out.data(), x, out.size());
      break;
    case KvDtype::kF16:
      for (int64_t i = 0; i < n; ++i) write_u16(out, f16_nearest(x[i]));
      break;
    case KvDtype::kBF16:
      for (int64_t i = 0; i < n; ++i) write_u16(out, bf16_nearest(x[i]));
      break;
    case KvDtype::kFp8E4M3:
    case KvDtype::kFp8E5M2: {
      const bool e4m3 = dtype == KvDtype::kFp8E4M3;
      float amax = 0;
      for (int64_t i = 0; i < n; ++i)
        if (std::isfinite(x[i])) amax = std::max(amax, std::fabs(x[i]));
      // Candidates amax / max * {1, 2^(1/2)} (f32 arithmetic, the factors as f32), rounded up to
      // f16; the one whose row has the least squared error, the first on ties.
      const float steps[] = {1.0f, 1.41421356f};
      double best_err = INFINITY;
      uint16_t scale_bits = 0;
      for (const float step : steps) {
        const uint16_t bits = f16_at_least(amax / (e4m3 ? 448.0f : 57344.0f) * step);
        const auto scale = static_cast<float>(fp16_value(bits));
        double err = 0;
        for (int64_t i = 0; i < n; ++i) {
          if (!std::isfinite(x[i])) continue;
          const uint8_t code = scale == 0 ? 0 : fp8_nearest(x[i] / scale, e4m3);
          const double d = fp8_value(code, e4m3) * scale - static_cast<double>(x[i]);
          err += d * d;
        }
        if (err < best_err) {
          best_err = err;
          scale_bits = bits;
        }
      }
      const auto scale = static_cast<float>(fp16_value(scale_bits));
      for (int64_t i = 0; i < n; ++i)
        out.push_back(std::byte(scale == 0 ? 0 : fp8_nearest(x[i] / scale, e4m3)));
      write_u16(out, scale_bits);
      break;
    }
    case KvDtype::kInt8: {
      float lo = INFINITY, hi = -INFINITY;
      for (int64_t i = 0; i < n; ++i)
        if (std::isfinite(x[i])) {
          lo = std::min(lo, x[i]);
          hi = std::max(hi, x[i]);
        }
      if (lo > hi) lo = hi = 0;
      const uint16_t zero_bits = f16_at_most(lo);
      const auto zero = static_cast<float>(fp16_value(zero_bits));
      const uint16_t scale_bits = f16_at_least((hi - zero) / 255.0f);
      const auto scale = static_cast<float>(fp16_value(scale_bits));
      for (int64_t i = 0; i < n; ++i) {
        int q = 0;
        if (scale != 0) {
          const float t = (x[i] - zero) / scale;  // f32, as the definition evaluates it
          q = std::isnan(t)
                  ? 0
                  : static_cast<int>(std::fmin(255.0f, std::fmax(0.0f, std::nearbyint(t))));
        }
        out.push_back(std::byte(q));
      }
      write_u16(out, scale_bits);
      write_u16(out, zero_bits);
      break;
    }
    case KvDtype::kKivi2:
    case KvDtype::kKivi4:
      std::abort();  // stored in groups (encode_kivi_group)
  }
  return out;
}

std::vector<double> decode_kv_row(KvDtype dtype, const std::byte* row, int64_t n) {
  std::vector<double> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    switch (dtype) {
      case KvDtype::kF32: {
        float f;
        std::memcpy(&f, row + 4 * i, 4);
        out[i] = f;
        break;
      }
      case KvDtype::kF16:
        out[i] = fp16_value(read_u16(row + 2 * i));
        break;
      case KvDtype::kBF16: {
        const uint32_t u = uint32_t{read_u16(row + 2 * i)} << 16;
        float f;
        std::memcpy(&f, &u, 4);
        out[i] = f;
        break;
      }
      case KvDtype::kFp8E4M3:
      case KvDtype::kFp8E5M2:
        out[i] = fp8_value(static_cast<uint8_t>(row[i]), dtype == KvDtype::kFp8E4M3) *
                 fp16_value(read_u16(row + n));
        break;
      case KvDtype::kInt8:
        out[i] = static_cast<double>(static_cast<uint8_t>(row[i])) * fp16_value(read_u16(row + n)) +
                 fp16_value(read_u16(row + n + 2));
        break;
      case KvDtype::kKivi2:
      case KvDtype::kKivi4:
        std::abort();
    }
  }
  return out;
}

}  // namespace vesper::reference

namespace vesper::reference {
namespace {

// One run of n elements sharing a scale and zero point (x[i * stride]): the f16 zero point (the
// minimum rounded down), f16 scale ((max - zero) / levels rounded up) and codes.
struct QuantizedRun {
  uint16_t scale_bits = 0, zero_bits = 0;
  std::vector<int> codes;
};
QuantizedRun quantize_run(const float* x, int64_t n, int64_t stride, int levels) {
  QuantizedRun r;
  float lo = INFINITY, hi = -INFINITY;
  for (int64_t i = 0; i < n; ++i)
    if (std::isfinite(x[i * stride])) {
      lo = std::min(lo, x[i * stride]);
      hi = std::max(hi, x[i * stride]);
    }
  if (lo > hi) lo = hi = 0;
  r.zero_bits = f16_at_most(lo);
  const auto zero = static_cast<float>(fp16_value(r.zero_bits));
  r.scale_bits = f16_at_least((hi - zero) / static_cast<float>(levels));
  const auto scale = static_cast<float>(fp16_value(r.scale_bits));
  for (int64_t i = 0; i < n; ++i) {
    int q = 0;
    if (scale != 0) {
      const float t = (x[i * stride] - zero) / scale;
      q = std::isnan(t) ? 0
                        : static_cast<int>(std::fmin(static_cast<float>(levels),
                                                     std::fmax(0.0f, std::nearbyint(t))));
    }
    r.codes.push_back(q);
  }
  return r;
}

// codes (bits each) packed little endian from bit 0, to whole bytes.
void pack(const std::vector<int>& codes, int bits, std::vector<std::byte>& out) {
  std::vector<std::byte> row(static_cast<size_t>((codes.size() * bits + 7) / 8));
  for (size_t c = 0; c < codes.size(); ++c)
    for (int b = 0; b < bits; ++b)
      if ((codes[c] >> b) & 1) {
        const size_t bit = c * bits + b;
        row[bit / 8] |= std::byte(1u << (bit % 8));
      }
  out.insert(out.end(), row.begin(), row.end());
}
int unpack(const std::byte* row, int64_t c, int bits) {
  int q = 0;
  for (int b = 0; b < bits; ++b) {
    const int64_t bit = c * bits + b;
    q |= ((static_cast<unsigned>(row[bit / 8]) >> (bit % 8)) & 1) << b;
  }
  return q;
}

}  // namespace

std::vector<std::byte> encode_kivi_group(backend::KvDtype dtype, backend::KvSide side,
                                         const float* x, int64_t g, int64_t d) {
  const int bits = dtype == KvDtype::kKivi2 ? 2 : 4, levels = (1 << bits) - 1;
  std::vector<std::byte> out;
  if (side == backend::KvSide::kKey) {
    std::vector<QuantizedRun> channels;
    for (int64_t c = 0; c < d; ++c) channels.push_back(quantize_run(x + c, g, d, levels));
    for (const QuantizedRun& r : channels) write_u16(out, r.scale_bits);
    for (const QuantizedRun& r : channels) write_u16(out, r.zero_bits);
    for (int64_t i = 0; i < g; ++i) {
      std::vector<int> row;
      for (int64_t c = 0; c < d; ++c) row.push_back(channels[c].codes[i]);
      pack(row, bits, out);
    }
    return out;
  }
  const int64_t width = std::min(g, d);  // channels per run
  for (int64_t i = 0; i < g; ++i) {
    std::vector<int> row;
    std::vector<QuantizedRun> runs;
    for (int64_t c0 = 0; c0 < d; c0 += width) {
      runs.push_back(quantize_run(x + i * d + c0, std::min(width, d - c0), 1, levels));
      row.insert(row.end(), runs.back().codes.begin(), runs.back().codes.end());
    }
    pack(row, bits, out);
    for (const QuantizedRun& r : runs) {
      write_u16(out, r.scale_bits);
      write_u16(out, r.zero_bits);
    }
  }
  return out;
}

std::vector<double> decode_kivi_group(backend::KvDtype dtype, backend::KvSide side,
                                      const std::byte* group, int64_t g, int64_t d) {
  const int bits = dtype == KvDtype::kKivi2 ? 2 : 4;
  const int64_t packed = (d * bits + 7) / 8;
  std::vector<double> out(static_cast<size_t>(g * d));
  if (side == backend::KvSide::kKey) {
    for (int64_t i = 0; i < g; ++i)
      for (int64_t c = 0; c < d; ++c)
        out[i * d + c] =
            unpack(group + 4 * d + i * packed, c, bits) * fp16_value(read_u16(group + 2 * c)) +
            fp16_value(read_u16(group + 2 * (d + c)));
    return out;
  }
  const int64_t width = std::min(g, d), runs = (d + width - 1) / width;
  for (int64_t i = 0; i < g; ++i) {
    const std::byte* row = group + i * (packed + 4 * runs);
    for (int64_t c = 0; c < d; ++c) {
      const std::byte* meta = row + packed + 4 * (c / width);
      out[i * d + c] =
          unpack(row, c, bits) * fp16_value(read_u16(meta)) + fp16_value(read_u16(meta + 2));
    }
  }
  return out;
}

}  // namespace vesper::reference

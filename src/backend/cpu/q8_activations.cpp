#include "backend/cpu/q8_activations.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/check.h"
#include "core/fp16.h"

namespace vesper::backend::cpu {
namespace {

// Round to nearest, ties to even, for |v| < 2^22: adding 1.5 * 2^23 leaves no fraction bits, so
// the addition itself rounds (ggml's nearest_int; AVX2's _mm256_round_ps does the same).
inline int round_nearest(float v) {
  const float shifted = v + 12582912.0f;
  int32_t bits;
  std::memcpy(&bits, &shifted, 4);
  return (bits & 0x007FFFFF) - 0x00400000;
}

// ggml's x86 quantize_row_q8_0: d = amax / 127 stored as fp16, quants round(x * 127 / amax).
// Consecutive blocks are `stride` blocks apart in the output (the row interleave of Q8Rows).
void quantize_row_q8_0(const float* x, int64_t n, int64_t stride, int8_t* qs, float* d,
                       int16_t* bsums) {
  for (int64_t b = 0; b < n / 32; ++b, x += 32, qs += 32 * stride, d += stride, bsums += stride) {
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[i]));
    *d = fp16_to_f32(f32_to_fp16(amax / 127.0f));
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    int sum = 0;
    for (int i = 0; i < 32; ++i) {
      qs[i] = static_cast<int8_t>(round_nearest(x[i] * id));
      sum += qs[i];
    }
    *bsums = static_cast<int16_t>(sum);
  }
}

// ggml's quantize_row_q8_K: the element of largest magnitude (the first, on ties) maps to -127;
// d = 1 / iscale in f32. Consecutive blocks are `stride` blocks apart, as for Q8_0.
void quantize_row_q8_k(const float* x, int64_t n, int64_t stride, int8_t* qs, float* d,
                       int16_t* bsums) {
  for (int64_t b = 0; b < n / 256;
       ++b, x += 256, qs += 256 * stride, d += stride, bsums += 16 * stride) {
    float amax = 0.0f, max = 0.0f;
    for (int i = 0; i < 256; ++i) {
      const float ax = std::fabs(x[i]);
      if (ax > amax) {
        amax = ax;
        max = x[i];
      }
    }
    if (amax == 0.0f) {
      *d = 0.0f;
      std::memset(qs, 0, 256);
      std::memset(bsums, 0, 16 * sizeof(int16_t));
      continue;
    }
    const float iscale = -127.0f / max;
    for (int i = 0; i < 256; ++i)
      qs[i] = static_cast<int8_t>(std::min(127, round_nearest(iscale * x[i])));
    for (int g = 0; g < 16; ++g) {
      int sum = 0;
      for (int i = 0; i < 16; ++i) sum += qs[16 * g + i];
      bsums[g] = static_cast<int16_t>(sum);
    }
    *d = 1.0f / iscale;
  }
}

}  // namespace

Q8Rows Q8Buffer::prepare(ActivationQuant format, int64_t n_in, int64_t n_rows, int64_t interleave) {
  VESPER_CHECK(format != ActivationQuant::kNone);
  VESPER_CHECK(interleave == 1 || interleave == 4);
  const int64_t block = format == ActivationQuant::kQ8_K ? 256 : 32;
  VESPER_CHECK(n_in % block == 0);
  // A partial last tile still takes a whole tile's room.
  const int64_t stored_rows = (n_rows + interleave - 1) / interleave * interleave;
  const auto need = static_cast<size_t>(n_in * stored_rows);
  if (qs_.size() < need) qs_.resize(need);
  if (d_.size() < need / block) d_.resize(need / block);
  const int64_t sum_group = format == ActivationQuant::kQ8_K ? 16 : 32;
  if (bsums_.size() < need / sum_group) bsums_.resize(need / sum_group);
  Q8Rows rows;
  rows.format = format;
  rows.n_in = n_in;
  rows.block = block;
  rows.interleave = interleave;
  rows.qs = qs_.data();
  rows.d = d_.data();
  rows.bsums = bsums_.data();
  return rows;
}

void quantize_rows(const Q8Rows& rows, const float* x, int64_t r_begin, int64_t r_end,
                   bool use_avx2) {
  const int64_t n = rows.n_in;
  // The view is const for the kernels; the buffer behind it is this call's to fill.
  auto* qs = const_cast<int8_t*>(rows.qs);
  auto* d = const_cast<float*>(rows.d);
  auto* bsums = const_cast<int16_t*>(rows.bsums);
  for (int64_t r = r_begin; r < r_end; ++r) {
    const int64_t k = rows.block_index(r, 0);
    if (rows.format == ActivationQuant::kQ8_K) {
      if (use_avx2)
        quantize_row_q8_k_avx2(x + r * n, n, rows.interleave, qs + k * 256, d + k, bsums + k * 16);
      else
        quantize_row_q8_k(x + r * n, n, rows.interleave, qs + k * 256, d + k, bsums + k * 16);
    } else if (use_avx2) {
      quantize_row_q8_0_avx2(x + r * n, n, rows.interleave, qs + k * 32, d + k, bsums + k);
    } else {
      quantize_row_q8_0(x + r * n, n, rows.interleave, qs + k * 32, d + k, bsums + k);
    }
  }
}

}  // namespace vesper::backend::cpu

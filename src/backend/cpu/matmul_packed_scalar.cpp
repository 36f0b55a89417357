// The portable kernels over 8-row packed q4_0 / q8_0 and k-quant (q2_K ... q6_K) weights
// (backend/packed_weights.h): each chunk is decoded back to 8 rows of integers and each row's block
// dotted exactly, then scaled and accumulated in the block-sum / block-total order of
// matmul_kernel.h. The reference the AVX2 packed kernels are tested against, and the fallback on
// CPUs without AVX2; speed is not its job.
#include <cmath>

#include "backend/cpu/matmul_kernel.h"
#include "core/fp16.h"

namespace vesper::backend::cpu {
namespace {

using tensor::GgmlType;

// Row j's 32 weights (q - 8) of a q4_0 chunk (layout in packed_weights.h).
struct UnpackQ4_0 {
  static constexpr int64_t kChunkBytes = 128;
  static void unpack(const uint8_t* chunk, int j, int32_t* w) {
    for (int k = 0; k < 4; ++k)
      for (int t = 0; t < 4; ++t) {
        const uint8_t byte = chunk[32 * k + 4 * j + t];
        w[8 * k + t] = (byte & 0xF) - 8;
        w[8 * k + 4 + t] = (byte >> 4) - 8;
      }
  }
};

// Row j's 32 weights of a q8_0 chunk.
struct UnpackQ8_0 {
  static constexpr int64_t kChunkBytes = 256;
  static void unpack(const uint8_t* chunk, int j, int32_t* w) {
    for (int k = 0; k < 8; ++k)
      for (int t = 0; t < 4; ++t) w[4 * k + t] = static_cast<int8_t>(chunk[32 * k + 4 * j + t]);
  }
};

template <class U>
void matmul_packed_scalar(const MatmulArgs& a, int64_t o_begin, int64_t o_end, float*) {
  const Q8Rows& x = *a.xq;
  const int64_t n_blocks = a.n_in / 32;
  int32_t w[32];
  for (int64_t g = o_begin / 8; g < o_end / 8; ++g) {
    for (int64_t r = 0; r < a.n_rows; ++r) {
      float acc[8] = {};
      for (int64_t b = 0; b < n_blocks; ++b) {
        const int64_t c = g * n_blocks + b;
        const int64_t k = x.block_index(r, b);
        const int8_t* xq = x.qs + k * 32;
        for (int j = 0; j < 8; ++j) {
          U::unpack(a.w + c * U::kChunkBytes, j, w);
          int32_t isum = 0;
          for (int i = 0; i < 32; ++i) isum += w[i] * xq[i];
          const float scale = fp16_to_f32(a.w_scales[8 * c + j]) * x.d[k];
          acc[j] = std::fma(static_cast<float>(isum), scale, acc[j]);
        }
      }
      for (int j = 0; j < 8; ++j) a.y[r * a.n_out + 8 * g + j] = acc[j];
    }
  }
}

// q4_K / q5_K chunks (256-element super-blocks of 8 rows) in the block-total order: per row and
// block, the exact integer totals of sc * q * x over the 8 sub-blocks and of m * (sum of x) over
// them.
template <bool kFifthBit>
void matmul_packed_k45_scalar(const MatmulArgs& a, int64_t o_begin, int64_t o_end, float*) {
  constexpr int64_t kSubBlockBytes = kFifthBit ? 160 : 128;
  const Q8Rows& x = *a.xq;
  const int64_t n_blocks = a.n_in / 256;
  for (int64_t g = o_begin / 8; g < o_end / 8; ++g) {
    for (int64_t r = 0; r < a.n_rows; ++r) {
      float acc[8] = {}, accm[8] = {};
      for (int64_t b = 0; b < n_blocks; ++b) {
        const int64_t c = g * n_blocks + b;
        const uint8_t* quants = a.w + c * 8 * kSubBlockBytes;
        const uint16_t* meta = a.w_scales + c * 80;
        const auto* sc = reinterpret_cast<const uint8_t*>(meta + 16);
        const uint8_t* mins = sc + 64;
        const int64_t k = x.block_index(r, b);
        const int8_t* xq = x.qs + k * 256;
        const int16_t* bsums = x.bsums + k * 16;
        for (int j = 0; j < 8; ++j) {
          int32_t isum = 0, imin = 0;
          for (int s = 0; s < 8; ++s) {
            const uint8_t* sub = quants + kSubBlockBytes * s;
            int32_t dot = 0;
            for (int kk = 0; kk < 4; ++kk)
              for (int t = 0; t < 4; ++t) {
                const uint8_t byte = sub[32 * kk + 4 * j + t];
                int lo = byte & 0xF, hi = byte >> 4;
                if (kFifthBit) {
                  const uint8_t high = sub[128 + 4 * j + t];
                  lo += 16 * ((high >> (2 * kk)) & 1);
                  hi += 16 * ((high >> (2 * kk + 1)) & 1);
                }
                dot += lo * xq[32 * s + 8 * kk + t] + hi * xq[32 * s + 8 * kk + 4 + t];
              }
            isum += sc[8 * s + j] * dot;
            imin += mins[16 * (s / 2) + 2 * j + s % 2] * (bsums[2 * s] + bsums[2 * s + 1]);
          }
          const float dx = x.d[k];
          acc[j] = std::fma(static_cast<float>(isum), fp16_to_f32(meta[j]) * dx, acc[j]);
          accm[j] = std::fma(static_cast<float>(imin), fp16_to_f32(meta[8 + j]) * dx, accm[j]);
        }
      }
      for (int j = 0; j < 8; ++j) a.y[r * a.n_out + 8 * g + j] = acc[j] - accm[j];
    }
  }
}

// Row j's unsigned quant of group element i (0..31) of a q6_K / q3_K / q2_K group (layout in
// packed_weights.h), and the type's offset (the weight is sc * (q - offset)).
struct GroupQ6_K {
  static constexpr int64_t kGroupBytes = 192, kScaleCount = 72, kOffset = 32;
  static constexpr bool kHasMin = false;
  static int quant(const uint8_t* group, int j, int i) {
    const int kk = i / 8, t = i % 4, upper = (i % 8) / 4;
    const uint8_t lo = group[32 * kk + 4 * j + t];
    const uint8_t hi = group[128 + 32 * (kk / 2) + 4 * j + t];
    return (upper ? lo >> 4 : lo & 0xF) | (((hi >> (2 * (2 * (kk % 2) + upper))) & 3) << 4);
  }
};
struct GroupQ3_K {
  static constexpr int64_t kGroupBytes = 96, kScaleCount = 72, kOffset = 4;
  static constexpr bool kHasMin = false;
  static int quant(const uint8_t* group, int j, int i) {
    const int m = i / 16, s = (i % 16) / 4, t = i % 4;  // element 16m + 4s + t
    const int low = (group[32 * m + 4 * j + t] >> (2 * s)) & 3;
    const int third = (group[64 + 4 * j + t] >> (4 * m + s)) & 1;
    return low + 4 * third;
  }
};
struct GroupQ2_K {
  static constexpr int64_t kGroupBytes = 64, kScaleCount = 144, kOffset = 0;
  static constexpr bool kHasMin = true;
  static int quant(const uint8_t* group, int j, int i) {
    const int m = i / 16, s = (i % 16) / 4, t = i % 4;
    return (group[32 * m + 4 * j + t] >> (2 * s)) & 3;
  }
};

// k-quant chunks with 16-element sub-blocks (q2_K, q3_K, q6_K) in the block-total order: per row
// and block, the exact integer totals of sc * (q - offset) * x over the 16 sub-blocks and (q2_K)
// of m * (sum of x) over them.
template <class G>
void matmul_packed_sub16_scalar(const MatmulArgs& a, int64_t o_begin, int64_t o_end, float*) {
  const Q8Rows& x = *a.xq;
  const int64_t n_blocks = a.n_in / 256;
  for (int64_t g = o_begin / 8; g < o_end / 8; ++g) {
    for (int64_t r = 0; r < a.n_rows; ++r) {
      float acc[8] = {}, accm[8] = {};
      for (int64_t b = 0; b < n_blocks; ++b) {
        const int64_t c = g * n_blocks + b;
        const uint8_t* quants = a.w + c * 8 * G::kGroupBytes;
        const uint16_t* meta = a.w_scales + c * G::kScaleCount;
        const auto* sc = reinterpret_cast<const int8_t*>(meta + (G::kHasMin ? 16 : 8));
        const auto* mins = reinterpret_cast<const uint8_t*>(sc + 128);  // q2_K only
        const int64_t k = x.block_index(r, b);
        const int8_t* xq = x.qs + k * 256;
        const int16_t* bsums = x.bsums + k * 16;
        for (int j = 0; j < 8; ++j) {
          int32_t isum = 0, imin = 0;
          for (int e = 0; e < 256; ++e) {
            const int u = e / 16, at = 16 * (u / 2) + 2 * j + u % 2;
            const int q = G::quant(quants + G::kGroupBytes * (e / 32), j, e % 32);
            isum += sc[at] * (q - static_cast<int>(G::kOffset)) * xq[e];
            if (G::kHasMin && e % 16 == 0) imin += mins[at] * bsums[u];
          }
          const float dx = x.d[k];
          acc[j] = std::fma(static_cast<float>(isum), fp16_to_f32(meta[j]) * dx, acc[j]);
          if (G::kHasMin)
            accm[j] = std::fma(static_cast<float>(imin), fp16_to_f32(meta[8 + j]) * dx, accm[j]);
        }
      }
      for (int j = 0; j < 8; ++j)
        a.y[r * a.n_out + 8 * g + j] = G::kHasMin ? acc[j] - accm[j] : acc[j];
    }
  }
}

}  // namespace

MatmulKernel scalar_packed_kernel(GgmlType type) {
  switch (type) {
    case GgmlType::kQ4_0:
      return matmul_packed_scalar<UnpackQ4_0>;
    case GgmlType::kQ8_0:
      return matmul_packed_scalar<UnpackQ8_0>;
    case GgmlType::kQ4_K:
      return matmul_packed_k45_scalar<false>;
    case GgmlType::kQ5_K:
      return matmul_packed_k45_scalar<true>;
    case GgmlType::kQ6_K:
      return matmul_packed_sub16_scalar<GroupQ6_K>;
    case GgmlType::kQ3_K:
      return matmul_packed_sub16_scalar<GroupQ3_K>;
    case GgmlType::kQ2_K:
      return matmul_packed_sub16_scalar<GroupQ2_K>;
    default:
      return nullptr;
  }
}

}  // namespace vesper::backend::cpu

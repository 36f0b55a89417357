// The portable kernels over 8-row packed q4_0 / q8_0 weights (backend/packed_weights.h): each
// chunk is decoded back to 8 rows of integers and each row's block dotted exactly, then scaled and
// accumulated in the block-sum order of matmul_kernel.h. The reference the AVX2 packed kernels are
// tested against, and the fallback on CPUs without AVX2; speed is not its job.
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

}  // namespace

MatmulKernel scalar_packed_kernel(GgmlType type) {
  switch (type) {
    case GgmlType::kQ4_0:
      return matmul_packed_scalar<UnpackQ4_0>;
    case GgmlType::kQ8_0:
      return matmul_packed_scalar<UnpackQ8_0>;
    default:
      return nullptr;
  }
}

}  // namespace vesper::backend::cpu

// The portable float-contract matmul kernel (matmul_kernel.h): decodes each weight row with
// tensor::dequantize_row and dots it with every activation row, following matmul_kernel.h's
// reduction order lane by lane, so it is bit-identical to the SIMD kernels. It is the fallback on
// CPUs without AVX2 and the reference the SIMD kernels are tested against; speed is not its job.
#include <cmath>

#include "backend/cpu/matmul_kernel.h"
#include "tensor/quant.h"

namespace vesper::backend::cpu {
namespace {

using tensor::GgmlType;

float dot_in_kernel_order(const float* w, const float* x, int64_t n) {
  float acc[4][8] = {};
  const int64_t chunks = n / 32;
  for (int64_t c = 0; c < chunks; ++c)
    for (int j = 0; j < 4; ++j)
      for (int l = 0; l < 8; ++l) {
        const int64_t i = 32 * c + 8 * j + l;
        acc[j][l] = std::fma(w[i], x[i], acc[j][l]);
      }
  float s[8];
  for (int l = 0; l < 8; ++l) s[l] = (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]);
  float t[4];
  for (int l = 0; l < 4; ++l) t[l] = s[l] + s[l + 4];
  float sum = (t[0] + t[1]) + (t[2] + t[3]);
  for (int64_t i = 32 * chunks; i < n; ++i) sum = std::fma(w[i], x[i], sum);
  return sum;
}

template <GgmlType kType>
void matmul_scalar(const MatmulArgs& a, int64_t o_begin, int64_t o_end, float* scratch) {
  for (int64_t o = o_begin; o < o_end; ++o) {
    tensor::dequantize_row(kType, a.w + static_cast<size_t>(o) * a.w_row_bytes, scratch, a.n_in);
    for (int64_t r = 0; r < a.n_rows; ++r)
      a.y[r * a.n_out + o] = dot_in_kernel_order(scratch, a.x + r * a.n_in, a.n_in);
  }
}

}  // namespace

MatmulKernel scalar_kernel(GgmlType type) {
  if (MatmulKernel integer_dot = scalar_q8_kernel(type)) return integer_dot;
  switch (type) {
    case GgmlType::kF32:
      return matmul_scalar<GgmlType::kF32>;
    case GgmlType::kF16:
      return matmul_scalar<GgmlType::kF16>;
    case GgmlType::kBF16:
      return matmul_scalar<GgmlType::kBF16>;
    case GgmlType::kQ4_1:
      return matmul_scalar<GgmlType::kQ4_1>;
    case GgmlType::kQ5_1:
      return matmul_scalar<GgmlType::kQ5_1>;
    case GgmlType::kQ8_K:
      return matmul_scalar<GgmlType::kQ8_K>;
    default:
      return nullptr;
  }
}

}  // namespace vesper::backend::cpu

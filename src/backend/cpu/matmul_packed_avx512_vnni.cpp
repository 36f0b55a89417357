// AVX-512 VNNI packed matmul kernels (packed_vnni_kernels.h) bound to the vpdpbusd instruction.
// Compiled with AVX-512 F/BW/VL + VNNI enabled and selected only on CPUs that have them
// (matmul_cpu.cpp).
#include <immintrin.h>

namespace vesper::backend::cpu {
namespace {
inline __m256i dpbusd(__m256i acc, __m256i u8, __m256i s8) {
  return _mm256_dpbusd_epi32(acc, u8, s8);
}
}  // namespace
}  // namespace vesper::backend::cpu

#include "backend/cpu/packed_vnni_kernels.h"

namespace vesper::backend::cpu {

MatmulKernel avx512_vnni_packed_kernel(tensor::GgmlType type) {
  return vnni_packed_kernel(type);
}

}  // namespace vesper::backend::cpu

// The AVX-512 VNNI packed kernels (backend/cpu/packed_vnni_kernels.h) built with vpdpbusd taken
// from SIMDe's portable implementation instead of the instruction, so that their logic is tested
// on any AVX2 machine (packed_matmul_test.cpp). Compiled with -mavx2 -mfma -mf16c only.
#include <simde/x86/avx512/dpbusd.h>

namespace vesper::backend::cpu {
namespace {
inline __m256i dpbusd(__m256i acc, __m256i u8, __m256i s8) {
  return simde_mm256_dpbusd_epi32(acc, u8, s8);
}
}  // namespace
}  // namespace vesper::backend::cpu

#include "backend/cpu/packed_vnni_kernels.h"

namespace vesper::backend::cpu {

MatmulKernel emulated_vnni_packed_kernel(tensor::GgmlType type) {
  return vnni_packed_kernel(type);
}

}  // namespace vesper::backend::cpu

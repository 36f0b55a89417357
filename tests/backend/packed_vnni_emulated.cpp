// The AVX-512 VNNI packed kernels (backend/cpu/packed_vnni_kernels.h, and packed_vnni_wide.h's
// 512-bit ones) built on SIMDe instead of the instructions, so that their logic is tested on any
// AVX2 machine (packed_matmul_test.cpp). Compiled with -mavx2 -mfma -mf16c only: SIMDe's native
// aliases give the wide header's _mm512_* names and types, implemented on pairs of AVX2 vectors.
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>

#include <cstdint>
#include <cstring>

namespace vesper::backend::cpu {
namespace {
inline __m256i dpbusd(__m256i acc, __m256i u8, __m256i s8) {
  return simde_mm256_dpbusd_epi32(acc, u8, s8);
}
inline __m512i dpbusd_bcast_512(__m512i acc, __m512i u8, const int8_t* s8) {
  int32_t four;
  std::memcpy(&four, s8, 4);
  return simde_mm512_dpbusd_epi32(acc, u8, simde_mm512_set1_epi32(four));
}
inline __m512i dpwssd_bcast_512(__m512i acc, __m512i a, const int16_t* b) {
  int32_t pair;
  std::memcpy(&pair, b, 4);
  return simde_mm512_dpwssd_epi32(acc, a, simde_mm512_set1_epi32(pair));
}
// This SIMDe has neither 512-bit conversion: each half converts on AVX2 / F16C, the same roundings.
inline __m512 cvtepi32_ps_512(__m512i v) {
  return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_cvtepi32_ps(_mm512_castsi512_si256(v))),
                            _mm256_cvtepi32_ps(_mm512_extracti64x4_epi64(v, 1)), 1);
}
inline __m512 cvtph_ps_512(__m256i halves) {
  return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_cvtph_ps(_mm256_castsi256_si128(halves))),
                            _mm256_cvtph_ps(_mm256_extracti128_si256(halves, 1)), 1);
}
inline void keep_in_register_512(__m512i&) {}
}  // namespace
}  // namespace vesper::backend::cpu

#include "backend/cpu/packed_vnni_kernels.h"
#include "backend/cpu/packed_vnni_wide.h"

namespace vesper::backend::cpu {

MatmulKernel emulated_vnni_packed_kernel(tensor::GgmlType type) {
  return vnni_wide_packed_kernel(type);
}

}  // namespace vesper::backend::cpu

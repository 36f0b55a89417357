// AVX-512 VNNI packed matmul kernels (packed_vnni_kernels.h on 256-bit vectors, and
// packed_vnni_wide.h's 512-bit ones for every packed type) bound to the vpdpbusd instruction.
// Compiled with AVX-512 F/BW/VL + VNNI enabled and selected only on CPUs that have them
// (matmul_cpu.cpp). g++ 12 warns that its own AVX-512 headers read an uninitialized variable (the
// __Y of _mm512_undefined_*, GCC bug 105593, fixed in 13) when 256-bit halves are cast or inserted
// into 512-bit vectors (-Wuninitialized under some flags); -Werror would make that a build failure.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>

#include <cstdint>

namespace vesper::backend::cpu {
namespace {
inline __m256i dpbusd(__m256i acc, __m256i u8, __m256i s8) {
  return _mm256_dpbusd_epi32(acc, u8, s8);
}
// The broadcast as the dot instruction's own {1to16} memory operand, which no intrinsic spells
// (GCC 12 keeps _mm512_set1_epi32 of a load as a separate vpbroadcastd): one instruction where a
// row and slice took two. Best of 7 on one thread, AMD Zen 5, 2048 x 2048 at 8, 32 and 512 rows:
// q4_K and q6_K 3-7% faster, q4_0 0-2%. kWords: vpdpwssd (int16 pairs), else vpdpbusd.
template <bool kWords>
inline __m512i dot_broadcast(__m512i acc, __m512i a, const void* four_bytes) {
  using Unaligned32 = int32_t __attribute__((may_alias, aligned(1)));
  const auto& b = *reinterpret_cast<const Unaligned32*>(four_bytes);
  if constexpr (kWords)
    asm("vpdpwssd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(a), "m"(b));
  else
    asm("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(a), "m"(b));
  return acc;
}
inline __m512i dpbusd_bcast_512(__m512i acc, __m512i u8, const int8_t* s8) {
  return dot_broadcast<false>(acc, u8, s8);
}
inline __m512i dpwssd_bcast_512(__m512i acc, __m512i a, const int16_t* b) {
  return dot_broadcast<true>(acc, a, b);
}
inline __m512 cvtepi32_ps_512(__m512i v) {
  return _mm512_cvtepi32_ps(v);
}
inline __m512 cvtph_ps_512(__m256i halves) {
  return _mm512_cvtph_ps(halves);
}
// The 256-bit tiles' keep_in_register (packed_gemm_avx2.h) for zmm: "v" names any of the 32.
inline void keep_in_register_512(__m512i& v) {
  asm("" : "+v"(v));
}
}  // namespace
}  // namespace vesper::backend::cpu

#include "backend/cpu/packed_vnni_kernels.h"
#include "backend/cpu/packed_vnni_wide.h"

namespace vesper::backend::cpu {

MatmulKernel avx512_vnni_packed_kernel(tensor::GgmlType type) {
  return vnni_wide_packed_kernel(type);
}

}  // namespace vesper::backend::cpu

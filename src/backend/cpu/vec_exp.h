// A deterministic single-precision exp shared by the CPU kernels (softmax in paged attention,
// SiLU): one lane of arithmetic, written twice, once as portable C++ (exp_lane) and once as eight
// AVX2 lanes (exp_avx2), with the same operations in the same order, so both give bit-identical
// results for every input (a third copy, sixteen lanes, is attention_avx512_tile.h's exp_avx512).
// std::exp is not used because its result depends on the C library and is not vectorised; this one
// is the same on every machine and ISA.
//
// Method (Cephes expf): x is clamped to [kExpMin, kExpMax]; n = round-to-nearest-even(x * log2 e);
// r = x - n ln2 in two fused steps (ln2 split into a short high part and a low part); a degree-5
// polynomial p(r) in Horner form with FMA; exp(x) = (fma(p, r*r, r) + 1) * 2^n. Inputs below
// ln(2^-126) return +0; inputs above 88 return exp(88) (finite, so softmax and SiLU never see
// inf). Measured accuracy: within 2 ulp of the exact result over the whole range
// (tests/backend/ops_test.cpp checks it). NaN inputs are not supported.
//
// Every multiply that feeds an add is an explicit fma, and the files using this one are built with
// -ffp-contract=off, so the compiler's floating-point contraction cannot make the versions differ.
// The functions sit in an unnamed namespace: each kernel file compiles its own copy under its own
// target flags, and the linker must not hand the portable kernel a copy built for AVX2.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

namespace vesper::backend::cpu {

inline constexpr float kExpMin = -87.336544750553102f;  // ln(2^-126): below this, exp is +0
inline constexpr float kExpMax = 88.0f;  // above this, exp(88): 2^n stays finite (n <= 127)
inline constexpr float kExpLog2e = 1.44269504088896341f;
inline constexpr float kExpLn2Hi = -0.693359375f;   // -ln 2, high part (exact in few bits)
inline constexpr float kExpLn2Lo = 2.12194440e-4f;  // -ln 2 - kExpLn2Hi
inline constexpr float kExpP0 = 1.9875691500e-4f;
inline constexpr float kExpP1 = 1.3981999507e-3f;
inline constexpr float kExpP2 = 8.3334519073e-3f;
inline constexpr float kExpP3 = 4.1665795894e-2f;
inline constexpr float kExpP4 = 1.6666665459e-1f;
inline constexpr float kExpP5 = 5.0000001201e-1f;

namespace {

// exp(x), one lane. Mirrors exp_avx2 operation for operation: a < b ? a : b is what
// _mm256_min_ps computes, b < a ? a : b what _mm256_max_ps computes.
inline float exp_lane(float x) {
  const bool underflow = x < kExpMin;
  float c = x < kExpMax ? x : kExpMax;
  c = kExpMin < c ? c : kExpMin;
  const float n = std::nearbyint(c * kExpLog2e);
  float r = std::fma(n, kExpLn2Hi, c);
  r = std::fma(n, kExpLn2Lo, r);
  float p = kExpP0;
  p = std::fma(p, r, kExpP1);
  p = std::fma(p, r, kExpP2);
  p = std::fma(p, r, kExpP3);
  p = std::fma(p, r, kExpP4);
  p = std::fma(p, r, kExpP5);
  const float r2 = r * r;
  float y = std::fma(p, r2, r);
  y = y + 1.0f;
  const uint32_t bits = static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23;
  float pow2n;
  std::memcpy(&pow2n, &bits, sizeof(pow2n));
  y = y * pow2n;
  return underflow ? 0.0f : y;
}

#if defined(__AVX2__) && defined(__FMA__)
// exp of eight lanes; lane i equals exp_lane(x[i]) bit for bit.
inline __m256 exp_avx2(__m256 x) {
  const __m256 underflow = _mm256_cmp_ps(x, _mm256_set1_ps(kExpMin), _CMP_LT_OQ);
  __m256 c = _mm256_min_ps(x, _mm256_set1_ps(kExpMax));
  c = _mm256_max_ps(c, _mm256_set1_ps(kExpMin));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(c, _mm256_set1_ps(kExpLog2e)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(kExpLn2Hi), c);
  r = _mm256_fmadd_ps(n, _mm256_set1_ps(kExpLn2Lo), r);
  __m256 p = _mm256_set1_ps(kExpP0);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExpP1));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExpP2));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExpP3));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExpP4));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExpP5));
  const __m256 r2 = _mm256_mul_ps(r, r);
  __m256 y = _mm256_fmadd_ps(p, r2, r);
  y = _mm256_add_ps(y, _mm256_set1_ps(1.0f));
  const __m256i bits =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  y = _mm256_mul_ps(y, _mm256_castsi256_ps(bits));
  return _mm256_andnot_ps(underflow, y);
}
#endif

}  // namespace
}  // namespace vesper::backend::cpu

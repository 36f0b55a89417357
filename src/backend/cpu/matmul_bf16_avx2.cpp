// AVX2 matmul kernel for bf16 weights: a bf16 is the top half of an f32, so widening is a shift.
#include "backend/cpu/gemm_avx2.h"

namespace vesper::backend::cpu {
namespace {

struct DecodeBF16 {
  static constexpr bool kIdentity = false;
  static constexpr int64_t kBlock = 32;
  static constexpr int64_t kBytes = 32 * 2;
  static void decode(const uint8_t* src, float* out) {
    for (int k = 0; k < 4; ++k) {
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 16 * k));
      const __m256i bits = _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16);
      _mm256_storeu_ps(out + 8 * k, _mm256_castsi256_ps(bits));
    }
  }
  static __m256 load8(const uint8_t* src) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  static void decode_tail(const uint8_t* src, int64_t n, float* out) {
    for (int64_t i = 0; i < n; ++i) {
      const uint32_t bits = static_cast<uint32_t>(src[2 * i] | (src[2 * i + 1] << 8)) << 16;
      std::memcpy(out + i, &bits, 4);
    }
  }
};

}  // namespace

void matmul_bf16_avx2(const MatmulArgs& a, int64_t o_begin, int64_t o_end, float* scratch) {
  run_matmul<DecodeBF16>(a, o_begin, o_end, scratch);
}

}  // namespace vesper::backend::cpu

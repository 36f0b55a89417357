// AVX2 matmul kernel for f16 weights: F16C widens 8 halves per instruction, exactly.
#include "backend/cpu/gemm_avx2.h"

namespace vesper::backend::cpu {
namespace {

struct DecodeF16 {
  static constexpr bool kIdentity = false;
  static constexpr int64_t kBlock = 32;
  static constexpr int64_t kBytes = 32 * 2;
  static void decode(const uint8_t* src, float* out) {
    for (int k = 0; k < 4; ++k) {
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 16 * k));
      _mm256_storeu_ps(out + 8 * k, _mm256_cvtph_ps(h));
    }
  }
  static __m256 load8(const uint8_t* src) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src)));
  }
  static void decode_tail(const uint8_t* src, int64_t n, float* out) {
    for (int64_t i = 0; i < n; ++i) out[i] = load_fp16(src + 2 * i);
  }
};

}  // namespace

void matmul_f16_avx2(const MatmulArgs& a, int64_t o_begin, int64_t o_end, float* scratch) {
  run_matmul<DecodeF16>(a, o_begin, o_end, scratch);
}

}  // namespace vesper::backend::cpu

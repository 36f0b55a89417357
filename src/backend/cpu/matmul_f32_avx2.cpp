// AVX2 matmul kernel for f32 weights: the weight row is dotted in place, no decoding.
#include "backend/cpu/gemm_avx2.h"

namespace vesper::backend::cpu {
namespace {

struct DecodeF32 {
  static constexpr bool kIdentity = true;
  static constexpr int64_t kBlock = 32;
  static constexpr int64_t kBytes = 32 * 4;
  static void decode(const uint8_t*, float*) {}
  static __m256 load8(const uint8_t* src) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(src));
  }
  static void decode_tail(const uint8_t*, int64_t, float*) {}
};

}  // namespace

void matmul_f32_avx2(const MatmulArgs& a, int64_t o_begin, int64_t o_end, float* scratch) {
  run_matmul<DecodeF32>(a, o_begin, o_end, scratch);
}

}  // namespace vesper::backend::cpu

// AVX2 matmul kernel for q2_K weights: super-blocks of 256, sub-blocks of 16 with 4-bit scale
// and min, decoded as d * sc * q - dmin * m.
#include "backend/cpu/gemm_avx2.h"

namespace vesper::backend::cpu {
namespace {

struct DecodeQ2_K {  // scales@0[16], qs@16[64], d@80, dmin@82
  static constexpr bool kIdentity = false;
  static constexpr int64_t kBlock = 256;
  static constexpr int64_t kBytes = 84;
  static void decode(const uint8_t* src, float* out) {
    const float d = load_fp16(src + 80);
    const float dmin = load_fp16(src + 82);
    const uint8_t* qs = src + 16;
    const __m256i three = _mm256_set1_epi32(3);
    for (int sub = 0; sub < 16; ++sub) {
      const float dl = d * static_cast<float>(src[sub] & 0xF);    // exact
      const float ml = dmin * static_cast<float>(src[sub] >> 4);  // exact
      const int h = sub / 8, s = (sub % 8) / 2, l0 = 16 * (sub % 2);
      for (int l = l0; l < l0 + 16; l += 8) {
        const __m256i q = _mm256_and_si256(shift_right(widen_u8(qs + 32 * h + l), 2 * s), three);
        store_affine(q, dl, -ml, out + 128 * h + 32 * s + l);
      }
    }
  }
  static void decode_tail(const uint8_t*, int64_t, float*) {}
};

}  // namespace

void matmul_q2_k_avx2(const MatmulArgs& a, int64_t o_begin, int64_t o_end, float* scratch) {
  run_matmul<DecodeQ2_K>(a, o_begin, o_end, scratch);
}

}  // namespace vesper::backend::cpu

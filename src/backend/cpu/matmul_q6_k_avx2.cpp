// AVX2 matmul kernel for q6_K weights against Q8_K activations: super-blocks of 256, sub-blocks
// of 16 with int8 scales, w = d * sc * (q - 32), q = 4 low bits from ql and 2 high bits from qh.
#include "backend/cpu/gemm_q8_avx2.h"

namespace vesper::backend::cpu {
namespace {

struct KernelQ6_K {  // ql@0[128], qh@128[64], scales@192[16] int8, d@208
  static constexpr int64_t kBlock = 256;
  static constexpr int64_t kBytes = 210;
  static constexpr bool kHasMin = false;
  struct Unpacked {
    __m256i q[8];  // 32-element chunk k's quants: q (0..63) from unpack_one_row, q - 32 from unpack
    __m256i abs_q[8];  // |q - 32| (unpack only)
    __m256i sc[8];     // chunk k's two scales: sub-block 2k in int16 lanes 0-7, 2k + 1 in 8-15
    float d;
  };
  // For one activation row (decode), where a block's unpacking is not shared: quants as stored.
  static void unpack_one_row(const uint8_t* block, Unpacked& u) {
    u.d = load_fp16(block + 208);
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    const __m256i three = _mm256_set1_epi8(3);
    for (int h = 0; h < 2; ++h) {
      const __m256i ql0 = load_256(block + 64 * h);       // chunks 4h (low) and 4h + 2 (high)
      const __m256i ql1 = load_256(block + 64 * h + 32);  // chunks 4h + 1 and 4h + 3
      const __m256i qh = load_256(block + 128 + 32 * h);  // chunk 4h + s in bits 2s, 2s + 1
      // 16-bit shifts move bits across bytes; the masks keep only each byte's own bits.
      const auto high = [&](int s) {
        return _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * s), three), 4);
      };
      u.q[4 * h] = _mm256_or_si256(_mm256_and_si256(ql0, low4), high(0));
      u.q[4 * h + 1] = _mm256_or_si256(_mm256_and_si256(ql1, low4), high(1));
      u.q[4 * h + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), low4), high(2));
      u.q[4 * h + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), low4), high(3));
    }
    sub16_scales(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 192)), u.sc);
  }
  // For several activation rows: the offset is taken out once per block here rather than per row
  // in dot().
  static void unpack(const uint8_t* block, Unpacked& u) {
    unpack_one_row(block, u);
    const __m256i m32 = _mm256_set1_epi8(32);
    for (int k = 0; k < 8; ++k) {
      u.q[k] = _mm256_sub_epi8(u.q[k], m32);
      u.abs_q[k] = _mm256_abs_epi8(u.q[k]);
    }
  }
  // Over unpack_one_row's quants: q * x - 32 * x, each exact in int16 (ggml's q6_K dot); the same
  // integers in every lane as dot().
  static __m256i dot_one_row(const Unpacked& u, const int8_t* xq) {
    const __m256i m32 = _mm256_set1_epi8(32);
    __m256i sum = _mm256_setzero_si256();
    for (int k = 0; k < 8; ++k) {
      const __m256i x = load_256(xq + 32 * k);
      const __m256i p =
          _mm256_sub_epi16(_mm256_maddubs_epi16(u.q[k], x), _mm256_maddubs_epi16(m32, x));
      sum = _mm256_add_epi32(sum, _mm256_madd_epi16(p, u.sc[k]));
    }
    return sum;
  }
  // Over unpack's quants: (q - 32) * x by the sign trick (maddubs wants one unsigned operand): |q -
  // 32| times x with q - 32's sign. The int16 pair sums are the exact (q0 - 32) x0 + (q1 - 32) x1
  // (at most 2 * 32 * 127 in magnitude), the same integers as ggml's q * x - 32 * x, so every lane
  // matches ggml's q6_K dot; one operation fewer per chunk and row.
  static __m256i dot(const Unpacked& u, const int8_t* xq) {
    return dot_signed_chunks(u.q, u.abs_q, u.sc, xq);
  }
  static __m128i min_dot(const Unpacked&, const int16_t*) { return _mm_setzero_si128(); }
};

}  // namespace

void matmul_q6_k_avx2(const MatmulArgs& a, int64_t o_begin, int64_t o_end, float* scratch) {
  run_q8_matmul<KernelQ6_K>(a, o_begin, o_end, scratch);
}

}  // namespace vesper::backend::cpu

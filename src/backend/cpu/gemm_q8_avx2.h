// The AVX2 driver for integer-dot matmul kernels: weights stay quantized, activations arrive
// quantized to 8 bits (q8_activations.h), and each block's dot product is computed exactly in
// integers (_mm256_maddubs_epi16 / _mm256_madd_epi16), then scaled and accumulated in f32 in the
// order matmul_kernel.h fixes. Include it only from files compiled with -mavx2 -mfma -mf16c (see
// the linkage note in gemm_avx2.h, which applies here too).
//
// A kernel file supplies a weight type K and instantiates run_q8_matmul<K>:
//   static constexpr int64_t kBlock;   // elements per weight block: 32, or 256 for k-quants
//   static constexpr int64_t kBytes;   // bytes per weight block
//   static constexpr bool kHasMin;     // k-quants with a min: w = d * sc * q - dmin * m
//   struct Unpacked;                   // one block made ready for the integer dots
//   static void unpack(const uint8_t* block, Unpacked& u);  // also sets u.d (and u.dmin)
//   static __m256i dot(const Unpacked& u, const int8_t* xq);
//       // int32 lanes whose sum is the block's exact sum of wint[i] * xq[i], where
//       // w[i] = u.d * wint[i] (- min part)
//   optionally unpack_one_row / dot_one_row: the same integers, cheaper for one activation row
//   static __m128i min_dot(const Unpacked& u, const int16_t* bsums);  // kHasMin only:
//       // int32 lanes whose sum is the block's exact sum of m(g) * bsums[g]
// Every block is then accumulated as one total (the block-sum and block-total orders of
// matmul_kernel.h).
//
// The driver owns tiling: a block is unpacked once and dotted with up to 8 activation rows
// (prefill reuses each weight block across rows and stays compute-bound); columns are walked in
// chunks so a chunk's weights stay in L2 while all row tiles pass over it.
#pragma once

#include "backend/cpu/gemm_avx2.h"
#include "backend/cpu/q8_activations.h"

namespace vesper::backend::cpu {
namespace {

// The sum of 4 int32 lanes.
inline int hsum_epi32(__m128i v) {
  v = _mm_add_epi32(v, _mm_shuffle_epi32(v, _MM_SHUFFLE(1, 0, 3, 2)));
  v = _mm_add_epi32(v, _mm_shuffle_epi32(v, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(v);
}

// Whether K has a cheaper pair for a single activation row, where a block's unpacking is not
// shared across rows: unpack_one_row(block, u) and dot_one_row(u, xq), giving dot()'s integers.
template <class K>
inline constexpr bool has_one_row_path = requires(const uint8_t* b, typename K::Unpacked& u,
                                                  const int8_t* x) {
  K::unpack_one_row(b, u);
  K::dot_one_row(u, x);
};

// Unpacks one weight block for R activation rows, and dots it with one row's quants: through K's
// single-row pair where R is 1 and K has one (has_one_row_path), else unpack / dot.
template <class K, int R>
inline void unpack_block(const uint8_t* block, typename K::Unpacked& u) {
  if constexpr (R == 1 && has_one_row_path<K>) {
    K::unpack_one_row(block, u);
  } else {
    K::unpack(block, u);
  }
}
template <class K, int R>
inline __m256i dot_block(const typename K::Unpacked& u, const int8_t* xq) {
  if constexpr (R == 1 && has_one_row_path<K>) {
    return K::dot_one_row(u, xq);
  } else {
    return K::dot(u, xq);
  }
}

// The exact sum of an integer dot's 8 lanes.
inline int total_epi32(__m256i v) {
  return hsum_epi32(_mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1)));
}

// Dots of one weight row with R activation rows starting at row r0: out[r] for r < R. Rows are
// addressed as base + r * stride (not an array of pointers) so that the pointers stay in
// registers.
template <class K, int R>
inline void dot_rows(const uint8_t* wrow, const Q8Rows& x, int64_t r0, float* out) {
  const int64_t n_blocks = x.n_in / K::kBlock;
  const int8_t* xq = x.qs + r0 * x.n_in;
  const int64_t q_stride = x.n_in;
  const float* xd = x.d + r0 * n_blocks;
  const int64_t d_stride = n_blocks;
  const int16_t* xs = K::kHasMin ? x.bsums + r0 * (x.n_in / 16) : nullptr;
  const int64_t s_stride = x.n_in / 16;
  if constexpr (K::kBlock == 32 && (R == 8 || R == 4)) {
    // 32-element blocks, block-sum order (matmul_kernel.h), 8 or 4 rows at once: the rows' lane
    // sums reduce together (hadd tree) into one vector of block totals, lane r for row r, and one
    // FMA scales and accumulates all rows; row r's scales are gathered at stride n_blocks.
    const int stride = static_cast<int>(d_stride);
    __m256 acc8 = _mm256_setzero_ps();
    __m128 acc4 = _mm_setzero_ps();
    for (int64_t b = 0; b < n_blocks; ++b, xq += K::kBlock, ++xd) {
      typename K::Unpacked u;
      K::unpack(wrow + b * K::kBytes, u);
      __m256i v[R];
      for (int r = 0; r < R; ++r) v[r] = K::dot(u, xq + r * q_stride);
      // Rows 0-3: low half from lanes 0-3 of each row, high half from lanes 4-7.
      const __m256i u0 =
          _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
      if constexpr (R == 8) {
        const __m256i u1 =
            _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
        const __m256i total = _mm256_add_epi32(_mm256_permute2x128_si256(u0, u1, 0x20),
                                               _mm256_permute2x128_si256(u0, u1, 0x31));
        const __m256i idx = _mm256_setr_epi32(0, stride, 2 * stride, 3 * stride, 4 * stride,
                                              5 * stride, 6 * stride, 7 * stride);
        const __m256 scale = _mm256_mul_ps(_mm256_set1_ps(u.d), _mm256_i32gather_ps(xd, idx, 4));
        acc8 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(total), scale, acc8);
      } else {
        const __m128i total =
            _mm_add_epi32(_mm256_castsi256_si128(u0), _mm256_extracti128_si256(u0, 1));
        const __m128i idx = _mm_setr_epi32(0, stride, 2 * stride, 3 * stride);
        const __m128 scale = _mm_mul_ps(_mm_set1_ps(u.d), _mm_i32gather_ps(xd, idx, 4));
        acc4 = _mm_fmadd_ps(_mm_cvtepi32_ps(total), scale, acc4);
      }
    }
    if constexpr (R == 8) {
      _mm256_storeu_ps(out, acc8);
    } else {
      _mm_storeu_ps(out, acc4);
    }
  } else if constexpr (K::kBlock == 32) {
    // 32-element blocks follow the block-sum order (matmul_kernel.h): the block's exact integer
    // sum, then one scalar FMA per block, as the 8-row packed kernels compute it too.
    // Scalar f32 in lane 0 of an __m128 (_mm_fmadd_ss: no std::fma in AVX2 files, see
    // gemm_avx2.h).
    __m128 accs[R];
    for (int r = 0; r < R; ++r) accs[r] = _mm_setzero_ps();
    for (int64_t b = 0; b < n_blocks; ++b, xq += K::kBlock, ++xd) {
      typename K::Unpacked u;
      K::unpack(wrow + b * K::kBytes, u);
      for (int r = 0; r < R; ++r) {
        const int total = total_epi32(K::dot(u, xq + r * q_stride));
        const __m128 scale = _mm_set_ss(u.d * xd[r * d_stride]);
        accs[r] = _mm_fmadd_ss(_mm_cvtsi32_ss(_mm_setzero_ps(), total), scale, accs[r]);
      }
    }
    for (int r = 0; r < R; ++r) out[r] = _mm_cvtss_f32(accs[r]);
  } else {
    // k-quants, block-total order (q2_K ... q6_K): each block's exact integer totals of the
    // scale part and of the mins, one scalar FMA each per block, as the packed kernels compute.
    __m128 accs[R], accms[R];
    for (int r = 0; r < R; ++r) accs[r] = accms[r] = _mm_setzero_ps();
    for (int64_t b = 0; b < n_blocks; ++b, xq += K::kBlock, ++xd) {
      typename K::Unpacked u;
      unpack_block<K, R>(wrow + b * K::kBytes, u);
      for (int r = 0; r < R; ++r) {
        const int total = total_epi32(dot_block<K, R>(u, xq + r * q_stride));
        const float dx = xd[r * d_stride];
        accs[r] =
            _mm_fmadd_ss(_mm_cvtsi32_ss(_mm_setzero_ps(), total), _mm_set_ss(u.d * dx), accs[r]);
        if constexpr (K::kHasMin) {
          const int imin = hsum_epi32(K::min_dot(u, xs + r * s_stride));
          accms[r] = _mm_fmadd_ss(_mm_cvtsi32_ss(_mm_setzero_ps(), imin), _mm_set_ss(u.dmin * dx),
                                  accms[r]);
        }
      }
      if constexpr (K::kHasMin) xs += K::kBlock / 16;  // (null without mins)
    }
    for (int r = 0; r < R; ++r) {
      out[r] = K::kHasMin ? _mm_cvtss_f32(_mm_sub_ss(accs[r], accms[r])) : _mm_cvtss_f32(accs[r]);
    }
  }
}

template <class K, int R>
inline void columns(const MatmulArgs& a, int64_t r0, int64_t o_begin, int64_t o_end) {
  float out[R];
  for (int64_t o = o_begin; o < o_end; ++o) {
    dot_rows<K, R>(a.w + static_cast<size_t>(o) * a.w_row_bytes, *a.xq, r0, out);
    for (int r = 0; r < R; ++r) a.y[(r0 + r) * a.n_out + o] = out[r];
  }
}

template <class K>
void run_q8_matmul(const MatmulArgs& a, int64_t o_begin, int64_t o_end, float*) {
  // Weight rows per column chunk: 16 rows of a 4096-wide q8_0 matrix are ~70 KB, within L2.
  constexpr int64_t kColumnChunk = 16;
  for (int64_t c0 = o_begin; c0 < o_end; c0 += kColumnChunk) {
    const int64_t c1 = c0 + kColumnChunk < o_end ? c0 + kColumnChunk : o_end;
    // Row tiles of 8 (each unpacked block serves 8 rows), then 4, 2 and 1 for the rest.
    int64_t r0 = 0;
    for (; r0 + 8 <= a.n_rows; r0 += 8) columns<K, 8>(a, r0, c0, c1);
    if (r0 + 4 <= a.n_rows) {
      columns<K, 4>(a, r0, c0, c1);
      r0 += 4;
    }
    if (r0 + 2 <= a.n_rows) {
      columns<K, 2>(a, r0, c0, c1);
      r0 += 2;
    }
    if (r0 < a.n_rows) columns<K, 1>(a, r0, c0, c1);
  }
}

// ---- helpers for weight types --------------------------------------------------------------

// Lanes of sum(w * x) over each 4 consecutive bytes, for signed w and x (|x| <= 127): ggml's sign
// trick, since maddubs wants one unsigned operand.
inline __m256i dot_signed(__m256i w, __m256i abs_w, __m256i x) {
  const __m256i p = _mm256_maddubs_epi16(abs_w, _mm256_sign_epi8(x, w));
  return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

// 32 bytes: 0xFF where bit i of the 32-bit word is set (ggml's bytes_from_bits_32).
inline __m256i bytes_from_bits_32(const uint8_t* p) {
  uint32_t bits;
  std::memcpy(&bits, p, 4);
  const __m256i shuffle = _mm256_setr_epi64x(0x0000000000000000, 0x0101010101010101,
                                             0x0202020202020202, 0x0303030303030303);
  __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(bits)), shuffle);
  bytes = _mm256_or_si256(bytes, _mm256_set1_epi64x(0x7FBFDFEFF7FBFDFE));
  return _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1));
}

// 16 packed bytes to 32 nibbles: element j < 16 from the low nibble of byte j, j + 16 from the
// high nibble (the legacy block layout).
inline __m256i nibbles_32(const uint8_t* p) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m256i both = _mm256_set_m128i(_mm_srli_epi16(raw, 4), raw);
  return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
}

inline __m256i load_256(const void* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

// q4_K / q5_K's 12 packed bytes of 6-bit (scale, min) pairs: sc[j] = sub-block j's scale in every
// int16 lane, mins = the 8 mins as int16. Unpacked in 32-bit words (ggml's kmask trick) rather
// than pair by pair, since a block's scales are on the decode path.
inline void unpack_scales_mins_k4(const uint8_t* packed, __m256i* sc, __m128i* mins) {
  uint32_t w[4];
  std::memcpy(w, packed, 12);
  const uint32_t low6 = 0x3F3F3F3F, low4 = 0x0F0F0F0F, low2 = 0x03030303;
  w[3] = ((w[2] >> 4) & low4) | (((w[1] >> 6) & low2) << 4);  // mins 4..7
  const uint32_t mins_0_3 = w[1] & low6;
  w[1] = (w[2] & low4) | (((w[0] >> 6) & low2) << 4);  // scales 4..7
  w[2] = mins_0_3;
  w[0] &= low6;  // scales 0..3
  const __m256i both =
      _mm256_cvtepu8_epi16(_mm_setr_epi32(static_cast<int>(w[0]), static_cast<int>(w[1]),
                                          static_cast<int>(w[2]), static_cast<int>(w[3])));
  *mins = _mm256_extracti128_si256(both, 1);
  const __m128i scales = _mm256_castsi256_si128(both);
  const __m256i scales2 = _mm256_set_m128i(scales, scales);
  for (int j = 0; j < 8; ++j)  // int16 lane j (bytes 2j, 2j + 1) to every lane
    sc[j] =
        _mm256_shuffle_epi8(scales2, _mm256_set1_epi16(static_cast<int16_t>(0x0100 + 0x0202 * j)));
}

// Lanes of sum over a block's 8 chunks of 32 of sc[j] * q[j] . x[j], for unsigned quants q
// (< 128) and int16 scales per pair of elements (one scale per chunk for q4_K / q5_K, two for the
// 16-element sub-blocks of q2_K: sub16_scales): the unsigned k-quant dot.
inline __m256i dot_unsigned_chunks(const __m256i* q, const __m256i* sc, const int8_t* xq) {
  __m256i sum = _mm256_setzero_si256();
  for (int j = 0; j < 8; ++j) {
    const __m256i p = _mm256_maddubs_epi16(q[j], load_256(xq + 32 * j));
    sum = _mm256_add_epi32(sum, _mm256_madd_epi16(p, sc[j]));
  }
  return sum;
}

// As dot_unsigned_chunks for signed quants q (q3_K, q6_K), by the sign trick (maddubs wants one
// unsigned operand): |q| times x with q's sign. The int16 pair sums are the exact q0 x0 + q1 x1
// (|x| <= 127, so the negation cannot overflow).
inline __m256i dot_signed_chunks(const __m256i* q, const __m256i* abs_q, const __m256i* sc,
                                 const int8_t* xq) {
  __m256i sum = _mm256_setzero_si256();
  for (int j = 0; j < 8; ++j) {
    const __m256i x = _mm256_sign_epi8(load_256(xq + 32 * j), q[j]);
    sum = _mm256_add_epi32(sum, _mm256_madd_epi16(_mm256_maddubs_epi16(abs_q[j], x), sc[j]));
  }
  return sum;
}

// The 16 int8 scales of 16-element sub-blocks (q2_K, q3_K, q6_K) laid out for the chunk dots:
// sc[k] holds sub-block 2k's scale in int16 lanes 0-7 and 2k + 1's in lanes 8-15, which are the
// lanes maddubs fills from the chunk's first and second 16 bytes. One shuffle and one sign
// extension per chunk.
inline void sub16_scales(__m128i scales, __m256i* sc) {
  for (int k = 0; k < 8; ++k) {
    const __m128i pick =
        _mm_or_si128(_mm_set1_epi8(static_cast<char>(2 * k)),
                     _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1));
    sc[k] = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(scales, pick));
  }
}

// Lane k of mins[2k] * (bsums[4k] + bsums[4k + 1]) + mins[2k + 1] * (bsums[4k + 2] + bsums[4k +
// 3]): the 8 sub-block mins of q4_K / q5_K against the activation sums of their 32 elements.
inline __m128i min_lanes_k4(__m128i mins, const int16_t* bsums) {
  const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(bsums));
  const __m128i hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(bsums + 8));
  return _mm_madd_epi16(mins, _mm_hadd_epi16(lo, hi));
}

// The legacy types whose weights are d * (signed integer) in 32-element blocks (q4_0, q5_0,
// q8_0): L::load(block) gives the 32 signed integers, the fp16 scale sits at offset 0.
template <class L>
struct SignedBlock32 {
  static constexpr int64_t kBlock = 32;
  static constexpr int64_t kBytes = L::kBytes;
  static constexpr bool kHasMin = false;
  struct Unpacked {
    __m256i w, abs_w;
    float d;
  };
  static void unpack(const uint8_t* block, Unpacked& u) {
    u.w = L::load(block);
    u.abs_w = _mm256_sign_epi8(u.w, u.w);
    u.d = load_fp16(block);
  }
  static __m256i dot(const Unpacked& u, const int8_t* xq) {
    return dot_signed(u.w, u.abs_w, load_256(xq));
  }
  static __m128i min_dot(const Unpacked&, const int16_t*) { return _mm_setzero_si128(); }
};

}  // namespace
}  // namespace vesper::backend::cpu

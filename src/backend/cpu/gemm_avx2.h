// The AVX2 matmul driver shared by the per-type *_avx2.cpp kernels. Include it only from files
// compiled with -mavx2 -mfma -mf16c. A kernel file supplies a Decoder (how to turn one block of
// its type into f32) and instantiates run_matmul<Decoder>; the driver owns tiling and the
// reduction order of matmul_kernel.h (the float contract).
//
// Decoder concept:
//   static constexpr bool kIdentity;    // f32 weights: dot straight from the weight row
//   static constexpr int64_t kBlock;    // elements per decode step, a multiple of 32
//   static constexpr int64_t kBytes;    // bytes per decode step
//   static void decode(const uint8_t* src, float* out);           // out[kBlock], exact values
//   static void decode_tail(const uint8_t* src, int64_t n, float* out);  // plain types only:
//                                        // the n_in % 32 elements after the last whole block
//   static __m256 load8(const uint8_t* src);  // plain types only (PlainDecoder): 8 consecutive
//                                        // elements at src, exactly, for the decode GEMV
//
// Everything here has internal linkage (anonymous namespace), and AVX2 files call no inline
// functions or templates of other headers (std::fma, std::bit_cast, std::min, ...): these TUs are
// built for a wider instruction set than the rest of the program, and an unoptimised build would
// otherwise emit shared out-of-line copies that the linker may pick for code running on CPUs
// without AVX2.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "backend/cpu/matmul_kernel.h"

namespace vesper::backend::cpu {
namespace {

// Four 8-lane accumulators: chunk c's 32 products go to v[0..3], 8 lanes each.
struct Acc {
  __m256 v[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                 _mm256_setzero_ps()};
};

// NX activation rows x[r] against one weight row, over `chunks` chunks of 32: acc[r] gets the
// weight row times activation row r. The weight row's 8 elements at chunk c, slice k, come from
// load_w(c, k) as exact f32; each is loaded once and used by all NX rows.
template <int NX, class LoadW>
inline void accumulate(LoadW load_w, const float* const* x, int64_t chunks, Acc (&acc)[NX]) {
  for (int64_t c = 0; c < chunks; ++c) {
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {
      const __m256 wv = load_w(c, k);
#pragma GCC unroll 2
      for (int r = 0; r < NX; ++r)
        acc[r].v[k] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x[r] + 32 * c + 8 * k), acc[r].v[k]);
    }
  }
}

// The reduction tree of matmul_kernel.h, then the tail in element order.
inline float finish(const Acc& a, const float* w_tail, const float* x_tail, int64_t tail) {
  const __m256 s = _mm256_add_ps(_mm256_add_ps(a.v[0], a.v[2]), _mm256_add_ps(a.v[1], a.v[3]));
  const __m128 t = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
  const __m128 u = _mm_hadd_ps(t, t);
  __m128 sum = _mm_hadd_ps(u, u);
  // _mm_fmadd_ss rather than std::fma: see the note on linkage at the top of this file.
  for (int64_t i = 0; i < tail; ++i)
    sum = _mm_fmadd_ss(_mm_set_ss(w_tail[i]), _mm_set_ss(x_tail[i]), sum);
  return _mm_cvtss_f32(sum);
}

// ---- helpers for decoders ----------------------------------------------------------------------

inline float load_fp16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);  // exact
}

// 8 consecutive bytes widened to 8 int32 lanes.
inline __m256i widen_u8(const uint8_t* p) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}
inline __m256i widen_i8(const uint8_t* p) {
  return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}

// out[0..8) = q * d, one rounding of an exact product.
inline void store_scaled(__m256i q, float d, float* out) {
  _mm256_storeu_ps(out, _mm256_mul_ps(_mm256_cvtepi32_ps(q), _mm256_set1_ps(d)));
}

// out[0..8) = q * d + m. q * d is exact, so the fused form rounds exactly once, as the scalar
// dequantizer's separate multiply and add do.
inline void store_affine(__m256i q, float d, float m, float* out) {
  _mm256_storeu_ps(out,
                   _mm256_fmadd_ps(_mm256_cvtepi32_ps(q), _mm256_set1_ps(d), _mm256_set1_ps(m)));
}

// ---- the driver ------------------------------------------------------------------------------

// Activation rows of the prefill GEMM's register tile (gemm_tile); kDecodedRows weight rows.
constexpr int64_t kTileRows = 3;

// Chunks of 32 elements a register tile takes per pass: 6 rows of 512 floats (12 KiB) stay in L1
// through the four passes over them.
constexpr int64_t kTileChunks = 16;

// Outputs y[r * y_stride + i] for R activation rows (x + r * n_in) and O decoded weight rows w[i]:
// the float contract's dot products, R x O at once. Its four accumulators of an output element
// are independent FMA chains (acc[j] takes elements 32c + 8j .. 32c + 8j + 7 of every chunk c, in
// chunk order), so the tile runs them one j at a time, over kTileChunks chunks per pass: R x O
// accumulators live at once instead of 4 R O, and each loaded weight vector serves R rows, each
// activation vector O outputs (0.67 loads per FMA at 3 x 3, against 1.5 for two rows against one
// weight row). The per-element operations and their order are the contract's, so results equal
// the decode path and the portable kernel bit for bit.
template <int R, int O>
__attribute__((noinline)) void gemm_tile(const float* const* w, const float* x, int64_t n_in,
                                         float* y, int64_t y_stride) {
  const int64_t chunks = n_in / 32;
  __m256 part[R][O][4];  // acc[j] of each output element, between passes
  for (int64_t c0 = 0; c0 < chunks; c0 += kTileChunks) {
    const int64_t c1 = c0 + kTileChunks < chunks ? c0 + kTileChunks : chunks;
    for (int j = 0; j < 4; ++j) {
      __m256 a[R][O];
#pragma GCC unroll 3
      for (int r = 0; r < R; ++r)
#pragma GCC unroll 3
        for (int i = 0; i < O; ++i) a[r][i] = c0 == 0 ? _mm256_setzero_ps() : part[r][i][j];
      for (int64_t c = c0; c < c1; ++c) {
        const int64_t off = 32 * c + 8 * j;
        __m256 wv[O];
#pragma GCC unroll 3
        for (int i = 0; i < O; ++i) wv[i] = _mm256_loadu_ps(w[i] + off);
#pragma GCC unroll 3
        for (int r = 0; r < R; ++r) {
          const __m256 xv = _mm256_loadu_ps(x + r * n_in + off);
#pragma GCC unroll 3
          for (int i = 0; i < O; ++i) a[r][i] = _mm256_fmadd_ps(wv[i], xv, a[r][i]);
        }
      }
#pragma GCC unroll 3
      for (int r = 0; r < R; ++r)
#pragma GCC unroll 3
        for (int i = 0; i < O; ++i) part[r][i][j] = a[r][i];
    }
  }
  const int64_t tail_offset = chunks * 32, tail = n_in - tail_offset;
  for (int r = 0; r < R; ++r)
    for (int i = 0; i < O; ++i) {
      Acc acc;
      if (chunks > 0)
        for (int j = 0; j < 4; ++j) acc.v[j] = part[r][i][j];
      y[r * y_stride + i] = finish(acc, w[i] + tail_offset, x + r * n_in + tail_offset, tail);
    }
}

// gemm_tile<R, O> for every tile shape: kGemmTiles[R - 1][O - 1].
using GemmTile = void (*)(const float* const* w, const float* x, int64_t n_in, float* y,
                          int64_t y_stride);
constexpr GemmTile kGemmTiles[3][3] = {
    {gemm_tile<1, 1>, gemm_tile<1, 2>, gemm_tile<1, 3>},
    {gemm_tile<2, 1>, gemm_tile<2, 2>, gemm_tile<2, 3>},
    {gemm_tile<3, 1>, gemm_tile<3, 2>, gemm_tile<3, 3>},
};
static_assert(kTileRows == 3 && kDecodedRows == 3, "kGemmTiles covers tiles up to 3 x 3");

// Activation rows processed per decoded weight row (prefill): sized so the x tile stays in L2.
inline int64_t row_tile(int64_t n_in, int64_t n_rows) {
  int64_t tile = (256 * 1024) / (n_in * static_cast<int64_t>(sizeof(float)));
  if (tile < 4) tile = 4;
  if (tile > 64) tile = 64;
  return tile < n_rows ? tile : n_rows;
}

// Decoders of plain types (f32, f16, bf16) also widen 8 consecutive elements in registers:
//   static __m256 load8(const uint8_t* src);
template <class D>
concept PlainDecoder = requires(const uint8_t* p) {
  D::load8(p);
};

// How far ahead of its reads the plain-type GEMV prefetches each weight row: decode streams every
// weight byte once from memory, and the hardware prefetchers alone leave it short of the
// bandwidth (as for the packed GEMV, packed_gemm_avx2.h).
constexpr int64_t kGemvPrefetchBytes = 2048;

// Decode of plain types: output o for the NX (<= 2) activation rows, with the weights widened in
// registers straight from their row (no decode buffer) and prefetched ahead. One weight row at a
// time keeps the prefetch (and the hardware's) linear through the matrix: two rows at once
// measured slower (each row its own page, the prefetch landing in the other row).
template <class D, int NX>
void gemv_plain(const MatmulArgs& a, int64_t o, float* scratch) {
  const int64_t chunks = a.n_in / 32, tail_offset = chunks * 32, tail = a.n_in - tail_offset;
  const uint8_t* w = a.w + static_cast<size_t>(o) * a.w_row_bytes;
  const float* x[NX];
  for (int r = 0; r < NX; ++r) x[r] = a.x + r * a.n_in;
  Acc acc[NX];
  accumulate<NX>(
      [w](int64_t c, int k) {
        const uint8_t* p = w + c * D::kBytes;
        if (k == 0)
          for (int64_t off = 0; off < D::kBytes; off += 64)
            _mm_prefetch(reinterpret_cast<const char*>(p + kGemvPrefetchBytes + off), _MM_HINT_T0);
        return D::load8(p + k * (D::kBytes / 4));
      },
      x, chunks, acc);
  const float* w_tail = scratch;
  if constexpr (D::kIdentity) {
    w_tail = reinterpret_cast<const float*>(w) + tail_offset;
  } else if (tail > 0) {
    D::decode_tail(w + chunks * D::kBytes, tail, scratch);
  }
  for (int r = 0; r < NX; ++r)
    a.y[r * a.n_out + o] = finish(acc[r], w_tail, x[r] + tail_offset, tail);
}

// Decode of block-quantized types: output o (weight row wrow) for the NX (<= 2) activation rows,
// each weight block decoded into `scratch` and dotted from there.
template <class D, int NX>
void gemv_decoded(const MatmulArgs& a, const uint8_t* wrow, int64_t o, float* scratch) {
  const int64_t n_blocks = a.n_in / D::kBlock;
  Acc acc[NX];
  for (int64_t b = 0; b < n_blocks; ++b) {
    D::decode(wrow + b * D::kBytes, scratch);
    const float* x[NX];
    for (int r = 0; r < NX; ++r) x[r] = a.x + r * a.n_in + b * D::kBlock;
    accumulate<NX>(
        [scratch](int64_t c, int k) { return _mm256_loadu_ps(scratch + 32 * c + 8 * k); }, x,
        D::kBlock / 32, acc);
  }
  for (int r = 0; r < NX; ++r) a.y[r * a.n_out + o] = finish(acc[r], nullptr, nullptr, 0);
}

template <class D>
void run_matmul(const MatmulArgs& a, int64_t o_begin, int64_t o_end, float* scratch) {
  const int64_t n_in = a.n_in;
  const int64_t n_blocks = n_in / D::kBlock;
  const int64_t tail = n_in - n_blocks * D::kBlock;  // non-zero only for plain types
  const int64_t tail_offset = n_blocks * D::kBlock;

  if (a.n_rows <= 2) {
    // Decode: one or two activation rows.
    if constexpr (PlainDecoder<D>) {
      for (int64_t o = o_begin; o < o_end; ++o) {
        if (a.n_rows == 2) {
          gemv_plain<D, 2>(a, o, scratch);
        } else {
          gemv_plain<D, 1>(a, o, scratch);
        }
      }
    } else {
      // Stream the weight row block by block, decoding each into a small L1 buffer, with the
      // accumulators in registers.
      for (int64_t o = o_begin; o < o_end; ++o) {
        const uint8_t* wrow = a.w + static_cast<size_t>(o) * a.w_row_bytes;
        if (a.n_rows == 2) {
          gemv_decoded<D, 2>(a, wrow, o, scratch);
        } else {
          gemv_decoded<D, 1>(a, wrow, o, scratch);
        }
      }
    }
    return;
  }

  // Prefill: decode kDecodedRows weight rows once per tile of activation rows and run the
  // register tiles of gemm_tile over them.
  const int64_t tile = row_tile(n_in, a.n_rows);
  for (int64_t r0 = 0; r0 < a.n_rows; r0 += tile) {
    const int64_t r1 = r0 + tile < a.n_rows ? r0 + tile : a.n_rows;
    for (int64_t o0 = o_begin; o0 < o_end; o0 += kDecodedRows) {
      const int n_w = static_cast<int>(o_end - o0 < kDecodedRows ? o_end - o0 : kDecodedRows);
      const float* w[kDecodedRows];
      for (int i = 0; i < n_w; ++i) {
        const uint8_t* wrow = a.w + static_cast<size_t>(o0 + i) * a.w_row_bytes;
        if constexpr (D::kIdentity) {
          w[i] = reinterpret_cast<const float*>(wrow);
        } else {
          float* dst = scratch + i * n_in;
          for (int64_t b = 0; b < n_blocks; ++b)
            D::decode(wrow + b * D::kBytes, dst + b * D::kBlock);
          if (tail > 0) D::decode_tail(wrow + n_blocks * D::kBytes, tail, dst + tail_offset);
          w[i] = dst;
        }
      }
      for (int64_t r = r0; r < r1; r += kTileRows) {
        const int n_x = static_cast<int>(r1 - r < kTileRows ? r1 - r : kTileRows);
        float* y = a.y + r * a.n_out + o0;
        const float* x = a.x + r * n_in;
        kGemmTiles[n_x - 1][n_w - 1](w, x, n_in, y, a.n_out);
      }
    }
  }
}

}  // namespace
}  // namespace vesper::backend::cpu

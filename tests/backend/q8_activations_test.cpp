// Tests of backend/cpu/q8_activations.h: the AVX2 quantizers give the portable ones' bits,
// every layout (interleave 1 and 4, Q8_0 and Q8_K) stores each block where Q8Rows::block_index
// says, and the quantized values are within half a step of the input.
#include "backend/cpu/q8_activations.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/matmul_cpu.h"

namespace vesper::backend::cpu {
namespace {

// Rows with the values a quantizer gets wrong first: all-zero blocks, exact halves after scaling
// (ties), a single nonzero, negative maxima, huge and tiny magnitudes.
std::vector<float> awkward_rows(int64_t n_rows, int64_t n_in, std::mt19937& rng) {
  std::normal_distribution<float> gauss(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n_rows * n_in));
  for (auto& v : x) v = gauss(rng);
  for (int64_t r = 0; r < n_rows; ++r) {
    float* row = x.data() + r * n_in;
    const int64_t blocks = n_in / 32;
    switch (r % 5) {
      case 0:
        std::fill(row, row + 32, 0.0f);
        break;
      case 1:  // amax 127: x * id = x, so halves are ties
        for (int i = 0; i < 32; ++i) row[i] = static_cast<float>(i) - 15.5f;
        row[31] = -127.0f;
        break;
      case 2:
        std::fill(row, row + 32, 0.0f);
        row[7] = -3.0e-3f;
        break;
      case 3:
        for (int i = 0; i < 32; ++i) row[i] *= 1.0e4f;
        break;
      default:
        for (int i = 0; i < 32; ++i) row[i] *= 1.0e-6f;
        break;
    }
    if (blocks > 1) row[32 + r % 32] = 50.0f;  // one large value in the second block
  }
  return x;
}

class Q8ActivationsTest : public ::testing::TestWithParam<int64_t> {};

TEST_P(Q8ActivationsTest, Avx2EqualsPortableAndBlocksSitAtBlockIndex) {
  const int64_t interleave = GetParam();
  std::mt19937 rng(91);
  for (const int64_t n_in : {32, 64, 96, 2048}) {
    for (const int64_t n_rows : {1, 2, 3, 4, 5, 7, 9}) {
      const std::vector<float> x = awkward_rows(n_rows, n_in, rng);
      Q8Buffer portable_buf;
      const Q8Rows portable =
          portable_buf.prepare(ActivationQuant::kQ8_0, n_in, n_rows, interleave);
      quantize_rows(portable, x.data(), 0, n_rows, false);
      const int64_t n_blocks = n_in / 32;
      for (int64_t r = 0; r < n_rows; ++r)
        for (int64_t b = 0; b < n_blocks; ++b) {
          const int64_t k = portable.block_index(r, b);
          const float* xs = x.data() + r * n_in + 32 * b;
          float amax = 0.0f;
          for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(xs[i]));
          // x = (x / step) * step with step = amax / 127 and |x / step - q| <= 1/2; d is step
          // rounded to fp16 (0 where fp16 underflows), which adds |q| * |d - step| at most.
          const double step = amax / 127.0;
          const double bound = (0.5 * step + 127.0 * std::fabs(portable.d[k] - step)) * 1.001;
          int sum = 0;
          for (int i = 0; i < 32; ++i) {
            const int q = portable.qs[32 * k + i];
            sum += q;
            ASSERT_LE(std::abs(q), 127);
            ASSERT_NEAR(q * portable.d[k], xs[i], bound)
                << "row " << r << " block " << b << " element " << i;
          }
          ASSERT_EQ(portable.bsums[k], sum) << "row " << r << " block " << b;
        }
      if (!isa_available(Isa::kAvx2)) continue;
      Q8Buffer avx2_buf;
      const Q8Rows avx2 = avx2_buf.prepare(ActivationQuant::kQ8_0, n_in, n_rows, interleave);
      quantize_rows(avx2, x.data(), 0, n_rows, true);
      for (int64_t r = 0; r < n_rows; ++r)
        for (int64_t b = 0; b < n_blocks; ++b) {
          const int64_t k = portable.block_index(r, b);
          ASSERT_EQ(std::memcmp(avx2.qs + 32 * k, portable.qs + 32 * k, 32), 0)
              << "n_in " << n_in << " row " << r << " block " << b;
          ASSERT_EQ(std::bit_cast<uint32_t>(avx2.d[k]), std::bit_cast<uint32_t>(portable.d[k]));
          ASSERT_EQ(avx2.bsums[k], portable.bsums[k]);
        }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Interleave, Q8ActivationsTest, ::testing::Values(1, 4));

// Q8_K rows interleaved in tiles of 4 (the packed q4_K kernels' layout) and quantized by the AVX2
// quantizer hold, at block_index, exactly the blocks of the plain row-major quantization by the
// portable one: quants, scale and the 16 sums.
TEST(Q8ActivationsQ8K, Avx2InterleavedBlocksEqualPortableRowMajorOnes) {
  std::mt19937 rng(17);
  for (const int64_t n_in : {256, 768}) {
    for (const int64_t n_rows : {1, 3, 4, 5, 9}) {
      std::vector<float> x = awkward_rows(n_rows, n_in, rng);
      // Blocks whose largest magnitude comes twice with both signs (the first one sets the scale's
      // sign), in the first vector and across vectors, and a block of one nonzero value.
      for (int64_t r = 0; r < n_rows; ++r) {
        float* row = x.data() + r * n_in + (n_in > 256 ? 256 : 0);
        const int64_t first = (r * 37) % 200, second = first + 1 + (r * 11) % 40;
        row[first] = (r % 2 == 0 ? -1.0f : 1.0f) * 80.0f;
        row[second] = -row[first];
        if (n_in > 512 && r % 3 == 0) {
          std::fill(row + 256, row + 512, 0.0f);
          row[256 + 255] = -1.0e-3f;
        }
      }
      Q8Buffer plain_buf, tiled_buf;
      const Q8Rows plain = plain_buf.prepare(ActivationQuant::kQ8_K, n_in, n_rows, 1);
      const Q8Rows tiled = tiled_buf.prepare(ActivationQuant::kQ8_K, n_in, n_rows, 4);
      quantize_rows(plain, x.data(), 0, n_rows, false);
      quantize_rows(tiled, x.data(), 0, n_rows, true);
      for (int64_t r = 0; r < n_rows; ++r)
        for (int64_t b = 0; b < n_in / 256; ++b) {
          const int64_t p = plain.block_index(r, b), t = tiled.block_index(r, b);
          ASSERT_EQ(p, r * (n_in / 256) + b);
          ASSERT_EQ(std::memcmp(tiled.qs + 256 * t, plain.qs + 256 * p, 256), 0)
              << "n_in " << n_in << " row " << r << " block " << b;
          ASSERT_EQ(std::bit_cast<uint32_t>(tiled.d[t]), std::bit_cast<uint32_t>(plain.d[p]));
          ASSERT_EQ(std::memcmp(tiled.bsums + 16 * t, plain.bsums + 16 * p, 32), 0);
        }
    }
  }
}

TEST(Q8Rows, BlockIndexIsRowMajorWithoutInterleave) {
  Q8Rows rows;
  rows.n_in = 96;
  rows.block = 32;
  EXPECT_EQ(rows.block_index(0, 0), 0);
  EXPECT_EQ(rows.block_index(2, 1), 7);
  rows.interleave = 4;
  // Tile 0: rows 0-3 alternate block by block; tile 1 starts after its 4 x 3 blocks.
  EXPECT_EQ(rows.block_index(1, 0), 1);
  EXPECT_EQ(rows.block_index(0, 1), 4);
  EXPECT_EQ(rows.block_index(3, 2), 11);
  EXPECT_EQ(rows.block_index(5, 0), 13);
}

}  // namespace
}  // namespace vesper::backend::cpu

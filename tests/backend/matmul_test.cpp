// Tests of backend/matmul.h: every weight type against an f64 reference built on the oracle
// dequantizer and, for types dotted in integers, the oracle activation quantizer (tests/reference),
// batch and thread-count invariance (bitwise), and agreement of the instruction-set variants.
#include "backend/matmul.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/matmul_cpu.h"
#include "backend/random_rows.h"
#include "core/thread_pool.h"
#include "reference/reference_q8.h"
#include "reference/reference_quant.h"
#include "tensor/ggml_type.h"
#include "tensor/quant.h"

namespace vesper::backend {
namespace {

using cpu::Isa;
using tensor::GgmlType;
using test_rows::gaussian;
using test_rows::same_bits;

constexpr GgmlType kWeightTypes[] = {
    GgmlType::kF32,  GgmlType::kF16,  GgmlType::kBF16, GgmlType::kQ4_0, GgmlType::kQ4_1,
    GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kQ8_0, GgmlType::kQ2_K, GgmlType::kQ3_K,
    GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K, GgmlType::kQ8_K,
};

uint32_t test_seed() {
  static const uint32_t seed = [] {
    const char* env = std::getenv("VESPER_TEST_SEED");
    const uint32_t s = env ? static_cast<uint32_t>(std::strtoul(env, nullptr, 10)) : 7919u;
    std::printf("matmul tests: seed %u (set VESPER_TEST_SEED to change)\n", s);
    return s;
  }();
  return seed;
}

std::string seed_trace() {
  return "seed " + std::to_string(test_seed());
}

int64_t block_size(GgmlType type) {
  return tensor::traits(type).block_size;
}

// n_out rows of n_in weights of `type`, quantized from Gaussian values.
std::vector<uint8_t> make_weights(GgmlType type, int64_t n_in, int64_t n_out, std::mt19937& rng) {
  const size_t row_bytes = tensor::row_size(type, n_in);
  std::vector<uint8_t> w(row_bytes * static_cast<size_t>(n_out));
  for (int64_t o = 0; o < n_out; ++o) {
    const std::vector<float> values = gaussian(n_in, rng);
    tensor::quantize_row(type, values.data(), w.data() + o * row_bytes, n_in);
  }
  return w;
}

// The exact product (f64, with the oracle's exact weight values, and the oracle's quantized
// activations for types dotted in integers) and, per output element, the scale of the allowed
// rounding error: sum |w x| (float activations), or sum (|A| + |N|) |xa| with W = A + N split
// into scale part and min part (quantized activations; backend/matmul.h).
struct Expected {
  std::vector<double> y;
  std::vector<double> abs_sum;
};

Expected reference_matmul(GgmlType type, const std::vector<uint8_t>& w, int64_t n_in, int64_t n_out,
                          const std::vector<float>& x, int64_t n_rows) {
  Expected e{std::vector<double>(static_cast<size_t>(n_rows * n_out)),
             std::vector<double>(static_cast<size_t>(n_rows * n_out))};
  const ActivationQuant quant = matmul_activation_quant(type);
  std::vector<std::vector<double>> xa(static_cast<size_t>(n_rows));
  for (int64_t r = 0; r < n_rows; ++r)
    xa[r] = reference::quantize_activations(quant, x.data() + r * n_in, n_in);
  const size_t row_bytes = tensor::row_size(type, n_in);
  for (int64_t o = 0; o < n_out; ++o) {
    const uint8_t* row = w.data() + o * row_bytes;
    const std::vector<double> wo = reference::dequantize_row(type, row, n_in);
    const std::vector<double> no = reference::min_part(type, row, n_in);
    for (int64_t r = 0; r < n_rows; ++r) {
      double sum = 0.0, abs_sum = 0.0;
      for (int64_t i = 0; i < n_in; ++i) {
        sum += wo[i] * xa[r][i];
        abs_sum += (std::fabs(wo[i] - no[i]) + std::fabs(no[i])) * std::fabs(xa[r][i]);
      }
      e.y[r * n_out + o] = sum;
      e.abs_sum[r * n_out + o] = abs_sum;
    }
  }
  return e;
}

// The documented bounds (backend/matmul.h). Float activations: weights are decoded exactly, so
// the only error is f32 accumulation: per lane n_in / 32 FMAs, 5 levels of the reduction tree,
// the tail FMAs. Quantized activations: block dots are exact integers, so per lane one FMA per
// block (n_in / block), the scale product, 3 levels of reduction, and the min accumulation.
double allowed_error(GgmlType type, int64_t n_in, double abs_sum) {
  const double steps = matmul_activation_quant(type) == ActivationQuant::kNone
                           ? static_cast<double>(n_in / 32 + 6 + n_in % 32)
                           : static_cast<double>(n_in / block_size(type) + 6);
  return steps * std::ldexp(1.0, -24) * abs_sum * (1 + 1e-6) + 1e-30;
}

std::vector<float> run(Isa isa, GgmlType type, const std::vector<uint8_t>& w, int64_t n_in,
                       int64_t n_out, const float* x, int64_t n_rows, ThreadPool& pool) {
  std::vector<float> y(static_cast<size_t>(n_rows * n_out), std::nanf(""));
  cpu::matmul_with_isa(isa, type, w.data(), n_in, n_out, x, n_rows, y.data(), pool);
  return y;
}

std::string type_param_name(const ::testing::TestParamInfo<GgmlType>& info) {
  return std::string(tensor::type_name(info.param));
}

// n_in values to try: whole blocks in several counts; plain types also get lengths that leave a
// tail after the last 32-element chunk, and one longer than a pass of the AVX2 prefill tile (16
// chunks).
std::vector<int64_t> input_sizes(GgmlType type) {
  const int64_t block = block_size(type);
  if (block == 1) return {1, 7, 32, 37, 96, 300, 1000};
  if (block == 32) return {32, 96, 224};
  return {256, 768};
}

// ---- basics --------------------------------------------------------------------------------

TEST(Matmul, SupportsExactlyTheDequantizableTypes) {
  for (uint32_t id = 0; id < 40; ++id) {
    if (!tensor::type_traits(id)) continue;
    const auto type = static_cast<GgmlType>(id);
    EXPECT_EQ(matmul_supported(type), tensor::can_dequantize(type)) << tensor::type_name(type);
  }
  for (GgmlType type : kWeightTypes) EXPECT_TRUE(matmul_supported(type)) << tensor::type_name(type);
}

TEST(Matmul, SelectsTheBestAvailableIsa) {
  const Isa expected = cpu::isa_available(Isa::kAvx512Vnni) ? Isa::kAvx512Vnni
                       : cpu::isa_available(Isa::kAvx2)     ? Isa::kAvx2
                                                            : Isa::kScalar;
  EXPECT_EQ(cpu::selected_isa(), expected);
  std::printf("  selected isa: %s\n", cpu::isa_name(cpu::selected_isa()).data());
}

// y[r][o] = sum_i W[o][i] x[r][i], W row-major n_out x n_in: a 2 x 3 example by hand.
TEST(Matmul, ComputesHandWorkedF32Example) {
  const float w[2 * 3] = {1, 2, 3, -1, 0.5f, 4};
  const float x[2 * 3] = {1, 1, 1, 2, -2, 0.25f};
  float y[2 * 2];
  ThreadPool pool(2);
  matmul(GgmlType::kF32, w, 3, 2, x, 2, y, pool);
  EXPECT_EQ(y[0], 6.0f);    // row 0, feature 0: 1 + 2 + 3
  EXPECT_EQ(y[1], 3.5f);    // row 0, feature 1: -1 + 0.5 + 4
  EXPECT_EQ(y[2], -1.25f);  // row 1, feature 0: 2 - 4 + 0.75
  EXPECT_EQ(y[3], -2.0f);   // row 1, feature 1: -2 - 1 + 1
}

TEST(Matmul, EmptyBatchOrNoOutputsWritesNothing) {
  ThreadPool pool(2);
  const std::vector<float> w(64, 1.0f), x(64, 1.0f);
  float y = 42.0f;
  matmul(GgmlType::kF32, w.data(), 64, 0, x.data(), 1, &y, pool);
  matmul(GgmlType::kF32, w.data(), 64, 1, x.data(), 0, &y, pool);
  EXPECT_EQ(y, 42.0f);
}

TEST(MatmulDeathTest, RejectsRowsThatAreNotWholeBlocks) {
  ThreadPool pool(1);
  std::vector<uint8_t> w(1024);
  std::vector<float> x(64), y(4);
  EXPECT_DEATH(matmul(GgmlType::kQ4_0, w.data(), 48, 1, x.data(), 1, y.data(), pool), "n_in");
  EXPECT_DEATH(matmul(GgmlType::kIQ2_XXS, w.data(), 256, 1, x.data(), 1, y.data(), pool),
               "unsupported");
}

// The oracle's rounding trace (used by tests/model to tell one tie rounded the other way from an
// error) records near ties and flips exactly the element it is told to, by one quant step.
TEST(ReferenceQ8, RoundingTraceFlipsOnlyTheNamedElement) {
  std::mt19937 rng(test_seed());
  const std::vector<float> x = gaussian(512, rng);
  for (ActivationQuant q : {ActivationQuant::kQ8_0, ActivationQuant::kQ8_K}) {
    reference::RoundingTrace all;
    all.window = 0.6;  // every element is within half a step of a tie
    const std::vector<double> plain = reference::quantize_activations(q, x.data(), 512, &all);
    ASSERT_EQ(all.near_ties.size(), 512u);
    reference::RoundingTrace flip;
    flip.flip = 300;
    const std::vector<double> flipped = reference::quantize_activations(q, x.data(), 512, &flip);
    for (int i = 0; i < 512; ++i) {
      if (i != 300) {
        EXPECT_EQ(flipped[i], plain[i]) << i;
        continue;
      }
      const double step = std::fabs(plain[i] - x[i]) * 2;  // |x - round(x)| <= step / 2
      EXPECT_NE(flipped[i], plain[i]);
      EXPECT_LE(std::fabs(flipped[i] - x[i]), std::fabs(flipped[i] - plain[i]) + 1e-12);
      EXPECT_GE(std::fabs(flipped[i] - x[i]) + 1e-12, step / 2);
    }
  }
}

// ---- per weight type -----------------------------------------------------------------------

class MatmulPerType : public ::testing::TestWithParam<GgmlType> {};

// Every ISA, 1 and 3 threads, odd feature counts and batch sizes (1, 2 and 3 exercise the decode
// paths, 17 the prefill tiling), within the accumulation bound of the exact f64 product.
TEST_P(MatmulPerType, MatchesF64ReferenceWithinBound) {
  const GgmlType type = GetParam();
  SCOPED_TRACE(seed_trace());
  std::mt19937 rng(test_seed() + static_cast<uint32_t>(type));
  ThreadPool pool1(1), pool3(3);
  for (int64_t n_in : input_sizes(type)) {
    for (int64_t n_out : {1, 7, 33}) {
      const std::vector<uint8_t> w = make_weights(type, n_in, n_out, rng);
      for (int64_t n_rows : {1, 2, 3, 17}) {
        const std::vector<float> x = gaussian(n_in * n_rows, rng);
        const Expected expected = reference_matmul(type, w, n_in, n_out, x, n_rows);
        for (Isa isa : cpu::available_isas()) {
          for (ThreadPool* pool : {&pool1, &pool3}) {
            const std::vector<float> y = run(isa, type, w, n_in, n_out, x.data(), n_rows, *pool);
            for (int64_t k = 0; k < n_rows * n_out; ++k) {
              ASSERT_NEAR(y[k], expected.y[k], allowed_error(type, n_in, expected.abs_sum[k]))
                  << tensor::type_name(type) << " isa " << cpu::isa_name(isa) << " threads "
                  << pool->num_threads() << " n_in " << n_in << " n_out " << n_out << " n_rows "
                  << n_rows << " row " << k / n_out << " feature " << k % n_out;
            }
          }
        }
      }
    }
  }
}

// Types dotted in integers, at the shapes their tiling cares about: every row count 1..9 and 15
// (row tiles of 8, then 4, 2, 1) and 67 (many tiles), odd feature counts (column chunks of 16
// and their remainder, threads' ranges), rows of many blocks, 1, 3 and 5 threads.
TEST_P(MatmulPerType, IntegerDotMatchesQuantizedReferenceAtTileShapes) {
  const GgmlType type = GetParam();
  if (matmul_activation_quant(type) == ActivationQuant::kNone) GTEST_SKIP() << "float activations";
  SCOPED_TRACE(seed_trace());
  std::mt19937 rng(test_seed() + 4000 + static_cast<uint32_t>(type));
  ThreadPool pool1(1), pool3(3), pool5(5);
  const int64_t n_in = block_size(type) * (block_size(type) == 32 ? 67 : 9);
  for (int64_t n_out : {5, 51}) {
    const std::vector<uint8_t> w = make_weights(type, n_in, n_out, rng);
    for (int64_t n_rows : {1, 2, 3, 4, 5, 6, 7, 8, 9, 15, 67}) {
      const std::vector<float> x = gaussian(n_in * n_rows, rng);
      const Expected expected = reference_matmul(type, w, n_in, n_out, x, n_rows);
      for (Isa isa : cpu::available_isas()) {
        for (ThreadPool* pool : {&pool1, &pool3, &pool5}) {
          const std::vector<float> y = run(isa, type, w, n_in, n_out, x.data(), n_rows, *pool);
          for (int64_t k = 0; k < n_rows * n_out; ++k) {
            ASSERT_NEAR(y[k], expected.y[k], allowed_error(type, n_in, expected.abs_sum[k]))
                << cpu::isa_name(isa) << " threads " << pool->num_threads() << " n_out " << n_out
                << " n_rows " << n_rows << " row " << k / n_out << " feature " << k % n_out;
          }
        }
      }
    }
  }
}

// Row r computed alone, in a pair, inside batches of different sizes and contents, and with any
// thread count: the same bits. n_in spans several prefill tiles' worth of rows (37 rows at
// n_in = 4096 cover three 16-row tiles, the last one partial and odd).
TEST_P(MatmulPerType, OutputRowIsIndependentOfBatchAndThreads) {
  const GgmlType type = GetParam();
  SCOPED_TRACE(seed_trace());
  std::mt19937 rng(test_seed() + 1000 + static_cast<uint32_t>(type));
  const int64_t n_in = block_size(type) == 1 ? 4096 + 13 : 4096;
  const int64_t n_out = 33;
  const int64_t n_rows = 37;
  const std::vector<uint8_t> w = make_weights(type, n_in, n_out, rng);
  const std::vector<float> x = gaussian(n_in * n_rows, rng);
  ThreadPool pool1(1), pool2(2), pool3(3);

  for (Isa isa : cpu::available_isas()) {
    const std::vector<float> batch = run(isa, type, w, n_in, n_out, x.data(), n_rows, pool3);
    for (ThreadPool* pool : {&pool1, &pool2}) {
      const std::vector<float> again = run(isa, type, w, n_in, n_out, x.data(), n_rows, *pool);
      for (size_t k = 0; k < batch.size(); ++k)
        ASSERT_TRUE(same_bits(batch[k], again[k]))
            << "threads " << pool->num_threads() << " at " << k;
    }
    // A different batch: the rows reversed, so every row meets other neighbours, tile
    // positions and pairings.
    std::vector<float> reversed(x.size());
    for (int64_t r = 0; r < n_rows; ++r)
      std::copy_n(x.begin() + r * n_in, n_in, reversed.begin() + (n_rows - 1 - r) * n_in);
    const std::vector<float> batch_reversed =
        run(isa, type, w, n_in, n_out, reversed.data(), n_rows, pool2);
    for (int64_t r = 0; r < n_rows; ++r) {
      const float* row = x.data() + r * n_in;
      const std::vector<float> alone = run(isa, type, w, n_in, n_out, row, 1, pool3);
      // Paired with the next row (wrapping): the two-row decode path.
      std::vector<float> pair(row, row + n_in);
      const float* partner = x.data() + ((r + 1) % n_rows) * n_in;
      pair.insert(pair.end(), partner, partner + n_in);
      const std::vector<float> paired = run(isa, type, w, n_in, n_out, pair.data(), 2, pool1);
      // Inside a batch of 3 as its last row (the odd row of the prefill path).
      std::vector<float> three(partner, partner + n_in);
      three.insert(three.end(), partner, partner + n_in);
      three.insert(three.end(), row, row + n_in);
      const std::vector<float> in_three = run(isa, type, w, n_in, n_out, three.data(), 3, pool2);
      for (int64_t o = 0; o < n_out; ++o) {
        const float want = batch[r * n_out + o];
        ASSERT_TRUE(same_bits(alone[o], want)) << "alone: row " << r << " feature " << o;
        ASSERT_TRUE(same_bits(paired[o], want)) << "pair: row " << r << " feature " << o;
        ASSERT_TRUE(same_bits(in_three[2 * n_out + o], want))
            << "in 3: row " << r << " feature " << o;
        ASSERT_TRUE(same_bits(batch_reversed[(n_rows - 1 - r) * n_out + o], want))
            << "reversed batch: row " << r << " feature " << o;
      }
    }
  }
}

// The AVX2 kernels follow the portable kernel's reduction order exactly (matmul_kernel.h), so
// which one a machine runs cannot change any output.
TEST_P(MatmulPerType, Avx2AgreesWithScalarBitForBit) {
  if (!cpu::isa_available(Isa::kAvx2)) GTEST_SKIP() << "no AVX2 on this CPU";
  const GgmlType type = GetParam();
  SCOPED_TRACE(seed_trace());
  std::mt19937 rng(test_seed() + 2000 + static_cast<uint32_t>(type));
  ThreadPool pool(2);
  for (int64_t n_in : input_sizes(type)) {
    // 5 and 7 rows: the prefill tiles of 3 rows with a remainder of 2 and 1.
    for (int64_t n_rows : {1, 2, 5, 7}) {
      const int64_t n_out = 9;
      const std::vector<uint8_t> w = make_weights(type, n_in, n_out, rng);
      const std::vector<float> x = gaussian(n_in * n_rows, rng);
      const std::vector<float> scalar =
          run(Isa::kScalar, type, w, n_in, n_out, x.data(), n_rows, pool);
      const std::vector<float> avx2 = run(Isa::kAvx2, type, w, n_in, n_out, x.data(), n_rows, pool);
      for (size_t k = 0; k < scalar.size(); ++k) {
        ASSERT_TRUE(same_bits(scalar[k], avx2[k]))
            << "n_in " << n_in << " n_rows " << n_rows << " at " << k << ": " << scalar[k] << " vs "
            << avx2[k];
      }
    }
  }
}

// Weights from random bytes (random scales, quants or plain values, not what a quantizer would
// write), which reach every bit pattern of the format: the kernels still decode exactly as the
// oracle does.
TEST_P(MatmulPerType, DecodesArbitraryBitPatternsLikeTheOracle) {
  const GgmlType type = GetParam();
  SCOPED_TRACE(seed_trace());
  std::mt19937 rng(test_seed() + 3000 + static_cast<uint32_t>(type));
  const int64_t n_in = block_size(type) == 1 ? 77 : block_size(type) * 2;
  const int64_t n_out = 5;
  std::vector<uint8_t> w(tensor::row_size(type, n_in) * n_out);
  for (auto& b : w) b = static_cast<uint8_t>(rng());
  // Keep values finite and moderate by clearing the top exponent bit of every f16 / bf16 / f32
  // value or scale (so |v| < 2, subnormals and zeros included).
  std::vector<int> top_bytes;  // offsets, within each block, of the byte holding that bit
  switch (type) {
    case GgmlType::kF32:
      top_bytes = {3};
      break;
    case GgmlType::kF16:
    case GgmlType::kBF16:
      top_bytes = {1};
      break;
    case GgmlType::kQ4_0:
    case GgmlType::kQ5_0:
    case GgmlType::kQ8_0:
      top_bytes = {1};
      break;
    case GgmlType::kQ4_1:
    case GgmlType::kQ5_1:
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
      top_bytes = {1, 3};
      break;
    case GgmlType::kQ2_K:
      top_bytes = {81, 83};
      break;
    case GgmlType::kQ3_K:
      top_bytes = {109};
      break;
    case GgmlType::kQ6_K:
      top_bytes = {209};
      break;
    case GgmlType::kQ8_K:
      top_bytes = {3};
      break;
    default:
      FAIL() << "no field map for " << tensor::type_name(type);
  }
  const size_t block_bytes = tensor::traits(type).type_size;
  for (size_t b = 0; b < w.size(); b += block_bytes)
    for (int off : top_bytes) w[b + off] &= 0xBF;
  const std::vector<float> x = gaussian(n_in * 3, rng);
  const Expected expected = reference_matmul(type, w, n_in, n_out, x, 3);
  ThreadPool pool(1);
  for (Isa isa : cpu::available_isas()) {
    for (int64_t n_rows : {1, 3}) {
      const std::vector<float> y = run(isa, type, w, n_in, n_out, x.data(), n_rows, pool);
      for (size_t k = 0; k < y.size(); ++k)
        ASSERT_NEAR(y[k], expected.y[k], allowed_error(type, n_in, expected.abs_sum[k]))
            << cpu::isa_name(isa) << " n_rows " << n_rows << " at " << k;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllTypes, MatmulPerType, ::testing::ValuesIn(kWeightTypes),
                         type_param_name);

}  // namespace
}  // namespace vesper::backend

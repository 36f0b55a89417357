// The KV cache codecs (backend/kv_codec.h) against their definitions (tests/reference/
// reference_kv.h): the bytes written for every type, odd row lengths and awkward rows (zeros,
// one outlier, constant rows, ties, values past the fp8 range, non-finite values), the values
// read back, every fp8 code, and the error each type promises.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/kv_codec_cpu.h"
#include "backend/cpu/matmul_cpu.h"
#include "backend/kv_cache.h"
#include "backend/kv_codec.h"
#include "backend/paged_attention.h"
#include "core/fp16.h"
#include "core/thread_pool.h"
#include "reference/reference_kv.h"

namespace vesper::backend {
namespace {

std::vector<std::vector<float>> test_rows() {
  std::vector<std::vector<float>> rows;
  std::mt19937_64 rng(5);
  for (int64_t n : {1, 3, 8, 13, 37, 64, 128}) {
    for (float range : {1.0f, 1e-3f, 300.0f, 1e5f}) {
      std::uniform_real_distribution<float> u(-range, range);
      std::vector<float> r(static_cast<size_t>(n));
      for (float& x : r) x = u(rng);
      rows.push_back(r);
      // Skewed: all positive (int8's zero point away from 0), and one outlier.
      for (float& x : r) x = std::fabs(x) + range;
      rows.push_back(r);
      r[0] = 40 * range;
      rows.push_back(r);
    }
    rows.emplace_back(static_cast<size_t>(n), 0.0f);
    rows.emplace_back(static_cast<size_t>(n), -2.5f);
  }
  // Halfway cases for the f16 and fp8 roundings, and tiny values (subnormals).
  rows.push_back({1.0f + 1.0f / 2048, 1.0f + 3.0f / 2048, 448.0f, 1.0f + 1.0f / 16,
                  1.0f + 3.0f / 16, 1e-7f, -3e-8f, 0.0f, -0.0f});
  rows.push_back({std::ldexp(1.0f, -20), std::ldexp(3.0f, -22), -std::ldexp(1.0f, -24)});
  rows.push_back({1.0f, INFINITY, -2.0f, NAN, 0.5f});
  return rows;
}

TEST(KvCodec, EncodesEveryTypeAsItsDefinition) {
  for (KvDtype d : kRowKvDtypes)
    for (const std::vector<float>& x : test_rows()) {
      const auto n = static_cast<int64_t>(x.size());
      std::vector<std::byte> row(
          static_cast<size_t>(n * kv_element_bytes(d) + kv_row_metadata_bytes(d)));
      encode_kv_row(d, x.data(), n, row.data());
      const std::vector<std::byte> want = reference::encode_kv_row(d, x.data(), n);
      ASSERT_EQ(want.size(), row.size());
      for (size_t i = 0; i < row.size(); ++i)
        ASSERT_EQ(static_cast<int>(want[i]), static_cast<int>(row[i]))
            << kv_dtype_name(d) << " n " << n << " byte " << i << " x[0] " << x[0];
      // Decoding gives the stored values exactly, from any first element on.
      const std::vector<double> values = reference::decode_kv_row(d, row.data(), n);
      std::vector<float> out(static_cast<size_t>(n), -7.0f);
      const int64_t begin = n / 2;
      decode_kv_row(d, row.data(), n, out.data(), begin);
      for (int64_t i = 0; i < begin; ++i) ASSERT_EQ(-7.0f, out[i]);  // untouched
      decode_kv_row(d, row.data(), n, out.data());
      for (int64_t i = 0; i < n; ++i) {
        if (std::isnan(values[i])) {
          ASSERT_TRUE(std::isnan(out[i]));
          continue;
        }
        ASSERT_EQ(static_cast<float>(values[i]), out[i]) << kv_dtype_name(d) << " element " << i;
      }
    }
}

TEST(KvCodec, DecodesEveryFp8Code) {
  for (KvDtype d : {KvDtype::kFp8E4M3, KvDtype::kFp8E5M2}) {
    const bool e4m3 = d == KvDtype::kFp8E4M3;
    for (int c = 0; c < 256; ++c) {
      const double want = reference::fp8_value(static_cast<uint8_t>(c), e4m3);
      if (!std::isfinite(want)) continue;  // never written: encoding saturates
      // One element, scale 1.0 (f16 0x3C00) and a scale of 3 * 2^-20 (0x0030 + exponent...).
      for (uint16_t scale : {uint16_t{0x3C00}, uint16_t{0x0123}, uint16_t{0x7BFF}}) {
        std::byte row[3] = {std::byte(c), std::byte(scale & 0xFF), std::byte(scale >> 8)};
        float out = 0;
        decode_kv_row(d, row, 1, &out);
        const double s = reference::decode_kv_row(KvDtype::kF16, row + 1, 1)[0];
        ASSERT_EQ(want * s, static_cast<double>(out)) << kv_dtype_name(d) << " code " << c;
      }
    }
  }
}

// fp8 rows against a scale fixed beforehand (--calculate-kv-scales): the definition's bytes for
// every test row, with the scale the row's own amax calibrates, one four times too small (the
// large elements saturate), 1.0 and 0; the calibrated scale is the least f16 mapping amax to the
// format's largest value.
TEST(KvCodec, Fp8RowsAgainstAFixedScaleAsTheirDefinition) {
  for (KvDtype d : {KvDtype::kFp8E4M3, KvDtype::kFp8E5M2}) {
    const float largest = d == KvDtype::kFp8E4M3 ? 448.0f : 57344.0f;
    for (const std::vector<float>& x : test_rows()) {
      const auto n = static_cast<int64_t>(x.size());
      float amax = 0;
      for (float v : x)
        if (std::isfinite(v)) amax = std::max(amax, std::fabs(v));
      const uint16_t own = fp8_scale_bits(d, amax);
      if (amax > 0) {
        EXPECT_GE(fp16_to_f32(own) * largest, amax);
        EXPECT_LT(fp16_to_f32(static_cast<uint16_t>(own - 1)) * largest, amax);
      } else {
        EXPECT_EQ(own, 0);
      }
      for (uint16_t scale : {own, fp8_scale_bits(d, amax / 4), uint16_t{0x3C00}, uint16_t{0}}) {
        std::vector<std::byte> row(static_cast<size_t>(n + 2));
        encode_fp8_row_scaled(d, x.data(), n, scale, row.data());
        ASSERT_EQ(reference::encode_fp8_row_scaled(d, x.data(), n, scale), row)
            << kv_dtype_name(d) << " n " << n << " scale bits " << scale;
      }
    }
  }
}

// A cache told to calibrate: each layer's first write_kv fixes every head's scale from the
// amax of that write's rows, and later rows of the layer carry that scale; other layers wait for
// their own first write. fp8 keys with f16 values: the values are untouched.
TEST(KvCodec, CalibratedFp8ScalesComeFromEachLayersFirstWrite) {
  KvCacheSpec spec{{KvDtype::kFp8E4M3, KvDtype::kF16}, 2, 16, 2, 8};
  KvCache cache(spec, 4);
  cache.calibrate_fp8_scales();
  EXPECT_TRUE(cache.awaits_calibration(0));
  EXPECT_TRUE(cache.awaits_calibration(1));
  // Three tokens, head 0's keys up to 3.375 in magnitude, head 1's up to 100.
  std::vector<float> k(3 * 16), v(3 * 16, 0.25f);
  for (int64_t t = 0; t < 3; ++t)
    for (int64_t i = 0; i < 8; ++i) {
      k[static_cast<size_t>(t * 16 + i)] = (i % 2 ? -1.0f : 1.0f) * (0.5f + t + 0.125f * i);
      k[static_cast<size_t>(t * 16 + 8 + i)] = 100.0f * static_cast<float>(i + 1) / 8;
    }
  const int32_t positions[] = {0, 1, 2}, seqs[] = {0, 0, 0}, tables[] = {0}, offsets[] = {0, 1};
  const int64_t slots[] = {0, 1, 2};
  AttentionBatch batch{3, positions, seqs, slots, tables, offsets};
  ThreadPool pool(1);
  write_kv(cache, 0, batch, k.data(), v.data(), pool);
  EXPECT_FALSE(cache.awaits_calibration(0));
  EXPECT_TRUE(cache.awaits_calibration(1));
  EXPECT_EQ(cache.fixed_key_scale(0, 0), fp8_scale_bits(KvDtype::kFp8E4M3, 3.375f));
  EXPECT_EQ(cache.fixed_key_scale(0, 1), fp8_scale_bits(KvDtype::kFp8E4M3, 100.0f));
  // A later token of small keys keeps the calibrated scale (its own amax would give another).
  std::vector<float> small(16, 0.01f);
  const int64_t slot3[] = {3};
  const int32_t pos3[] = {3};
  AttentionBatch one{1, pos3, seqs, slot3, tables, offsets};
  write_kv(cache, 0, one, small.data(), small.data(), pool);
  for (int64_t h = 0; h < 2; ++h) {
    uint16_t meta;
    std::memcpy(&meta, cache.key_row(0, 3, h) + 8, sizeof(meta));
    EXPECT_EQ(meta, cache.fixed_key_scale(0, h));
    std::vector<std::byte> want(10);
    encode_fp8_row_scaled(KvDtype::kFp8E4M3, small.data(), 8, cache.fixed_key_scale(0, h),
                          want.data());
    EXPECT_EQ(0, std::memcmp(want.data(), cache.key_row(0, 3, h), want.size()));
    // Values are f16 rows as ever.
    float out[8];
    decode_kv_row(KvDtype::kF16, cache.value_row(0, 3, h), 8, out);
    EXPECT_EQ(out[0], fp16_to_f32(f32_to_fp16(0.01f)));
  }
}

// |decode(encode(x)) - x| within each type's bound, relative to the row's largest magnitude
// (fp8, int8) or to the element (f16, bf16).
TEST(KvCodec, RoundTripErrorWithinEachTypesBound) {
  std::mt19937_64 rng(11);
  std::normal_distribution<float> g(0.0f, 1.0f);
  for (KvDtype d : kRowKvDtypes) {
    double worst = 0;
    for (int trial = 0; trial < 200; ++trial) {
      const int64_t n = 64 + trial % 7;
      std::vector<float> x(static_cast<size_t>(n));
      const float range = std::ldexp(1.0f, trial % 20 - 10);
      for (float& v : x) v = g(rng) * range;
      float amax = 0, lo = x[0], hi = x[0];
      for (float v : x) {
        amax = std::max(amax, std::fabs(v));
        lo = std::min(lo, v);
        hi = std::max(hi, v);
      }
      std::vector<std::byte> row(
          static_cast<size_t>(n * kv_element_bytes(d) + kv_row_metadata_bytes(d)));
      encode_kv_row(d, x.data(), n, row.data());
      std::vector<float> y(static_cast<size_t>(n));
      decode_kv_row(d, row.data(), n, y.data());
      for (int64_t i = 0; i < n; ++i) {
        const double err = std::fabs(static_cast<double>(y[i]) - x[i]);
        double bound = 0;
        switch (d) {
          case KvDtype::kF32:
            bound = 0;
            break;
          case KvDtype::kF16:
            bound = std::ldexp(std::fabs(x[i]), -11) + std::ldexp(1.0, -25);
            break;
          case KvDtype::kBF16:
            bound = std::ldexp(std::fabs(x[i]), -8);
            break;
          // Half a step: 3 (2) mantissa bits, and the subnormal step of the scaled format;
          // the scale is at most 2^(1/2) (the last candidate) and 2^-10 (f16) above amax / max.
          case KvDtype::kFp8E4M3:
            bound = std::ldexp(std::fabs(x[i]), -4) + amax / 448.0 * 1.42 * std::ldexp(1.0, -10);
            break;
          case KvDtype::kFp8E5M2:
            bound = std::ldexp(std::fabs(x[i]), -3) + amax / 57344.0 * 1.42 * std::ldexp(1.0, -17);
            break;
          // Half a step of (hi - lo) / 255, the step rounded up to f16 and the zero point down.
          case KvDtype::kInt8:
            bound =
                (hi - lo) / 255.0 * 0.5 * (1 + 2e-3) + std::ldexp(std::fabs(lo), -10) + 1e-6 * amax;
            break;
          case KvDtype::kKivi2:
          case KvDtype::kKivi4:
            FAIL() << "not a row type";
        }
        worst = std::max(worst, err / std::max(amax, 1e-30f));
        ASSERT_LE(err, bound) << kv_dtype_name(d) << " x " << x[i] << " got " << y[i];
      }
    }
    std::printf("  %-8s worst error / row amax: %.3g\n", std::string(kv_dtype_name(d)).c_str(),
                worst);
  }
}

// KIVI groups: the bytes of every (type, side) against the definition, for group sizes 32 and 64,
// odd head sizes (a row padded to whole bytes, a last value channel run cut short), and groups
// with a constant channel, an outlier token, zeros and non-finite values; decoding any rows of a
// group gives its exact values; the round-trip error is within half a step of each run.
// A group of g tokens x d channels for the KIVI tests, by variant: 0 normal values; 1 large ones
// with a constant channel; 2 an outlier token; 3 a zero token and non-finite values (NaN, +-inf);
// 4 zeros of both signs and positives (a zero is every run's minimum); 5 f16 subnormals.
std::vector<float> kivi_test_group(std::mt19937_64& rng, int64_t g, int64_t d, int variant) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(g * d));
  for (float& v : x) v = normal(rng) * (variant == 1 ? 300.0f : 1.0f);
  if (variant == 1)
    for (int64_t i = 0; i < g; ++i) x[i * d] = 0.25f;
  if (variant == 2) x[5 * d] = 40.0f;
  if (variant == 3) {
    std::fill(x.begin(), x.begin() + d, 0.0f);
    x[d] = INFINITY;
    x[2 * d] = NAN;
    x[3 * d + d / 2] = -INFINITY;
  }
  if (variant == 4)
    for (size_t i = 0; i < x.size(); ++i)
      x[i] = i % 3 == 0 ? 0.0f : (i % 3 == 1 ? -0.0f : std::fabs(x[i]));
  if (variant == 5)
    for (float& v : x) v *= 1e-6f;
  return x;
}

TEST(KvCodec, KiviGroupsAsTheirDefinition) {
  std::mt19937_64 rng(17);
  for (KvDtype dtype : kKiviKvDtypes)
    for (KvSide side : {KvSide::kKey, KvSide::kValue})
      for (int64_t g : {32, 64})
        for (int64_t d : {1, 3, 8, 13, 37, 64, 72})
          for (int variant = 0; variant < 4; ++variant) {
            KvCacheSpec spec{{dtype, dtype}, 1, g, 1, d};
            const std::vector<float> x = kivi_test_group(rng, g, d, variant);
            const int64_t bytes = spec.group_bytes(dtype, side);
            std::vector<std::byte> group(static_cast<size_t>(bytes), std::byte{0x5A});
            encode_kv_group(spec, dtype, side, x.data(), group.data());
            const std::vector<std::byte> want =
                reference::encode_kivi_group(dtype, side, x.data(), g, d);
            ASSERT_EQ(want.size(), group.size()) << kv_dtype_name(dtype) << " d " << d;
            for (size_t i = 0; i < want.size(); ++i)
              ASSERT_EQ(static_cast<int>(want[i]), static_cast<int>(group[i]))
                  << kv_dtype_name(dtype) << (side == KvSide::kKey ? " keys" : " values") << " g "
                  << g << " d " << d << " variant " << variant << " byte " << i;
            const std::vector<double> values =
                reference::decode_kivi_group(dtype, side, group.data(), g, d);
            const int64_t first = 7, n = g - 9;
            std::vector<float> out(static_cast<size_t>(n * d));
            decode_kv_group_rows(spec, dtype, side, group.data(), first, n, out.data());
            for (int64_t i = 0; i < n * d; ++i)
              ASSERT_EQ(static_cast<float>(values[(first * d) + i]), out[i]) << i;
            if (variant == 3) continue;
            // Half a step of the run's range (each run's step rounded up to f16, its zero down).
            const int levels = (1 << kv_kivi_bits(dtype)) - 1;
            std::vector<float> all(static_cast<size_t>(g * d));
            decode_kv_group_rows(spec, dtype, side, group.data(), 0, g, all.data());
            for (int64_t i = 0; i < g; ++i)
              for (int64_t c = 0; c < d; ++c) {
                float lo = INFINITY, hi = -INFINITY;
                const int64_t width = std::min(g, d), c0 = c / width * width;
                for (int64_t j = 0; j < (side == KvSide::kKey ? g : std::min(width, d - c0)); ++j) {
                  const float v = side == KvSide::kKey ? x[j * d + c] : x[i * d + c0 + j];
                  lo = std::min(lo, v);
                  hi = std::max(hi, v);
                }
                const double bound = (hi - lo) / levels * 0.5 * (1 + 2e-3) +
                                     std::ldexp(std::fabs(lo), -10) + 1e-6 * std::fabs(hi);
                ASSERT_LE(std::fabs(static_cast<double>(all[i * d + c]) - x[i * d + c]), bound)
                    << kv_dtype_name(dtype) << " row " << i << " channel " << c;
              }
          }
}

// The AVX2 f16 row encoder (what KvCache writes f16 rows with on AVX2 CPUs) gives the portable
// bytes: the test rows (halfway cases, subnormals, infinities, NaN), f32 bit patterns spread over
// the whole range (every exponent, both signs, NaNs with payloads), at every row length's tail.
TEST(KvCodec, F16Avx2EncoderGivesThePortableBytes) {
  if (!cpu::isa_available(cpu::Isa::kAvx2)) GTEST_SKIP() << "no AVX2 on this CPU";
  std::vector<std::vector<float>> rows = test_rows();
  std::vector<float> sweep;
  for (uint64_t bits = 0; bits < (uint64_t{1} << 32); bits += 65521)  // a prime stride
    sweep.push_back(std::bit_cast<float>(static_cast<uint32_t>(bits)));
  for (float x : {65504.0f, 65519.99f, 65520.0f, -65520.0f, std::ldexp(1.0f, -25),
                  std::ldexp(3.0f, -26), std::ldexp(1.0f, -14), -std::ldexp(1023.5f, -24),
                  std::bit_cast<float>(0x7FC01234u), std::bit_cast<float>(0xFF800001u)})
    sweep.push_back(x);
  rows.push_back(sweep);
  for (size_t cut : {size_t{9}, size_t{23}, size_t{1001}})
    rows.emplace_back(sweep.begin(), sweep.begin() + static_cast<std::ptrdiff_t>(cut));
  for (const std::vector<float>& x : rows) {
    const auto n = static_cast<int64_t>(x.size());
    std::vector<std::byte> want(static_cast<size_t>(2 * n)), got(want.size(), std::byte{0x5A});
    encode_kv_row(KvDtype::kF16, x.data(), n, want.data());
    cpu::encode_f16_row_avx2(x.data(), n, got.data());
    for (int64_t i = 0; i < 2 * n; ++i)
      ASSERT_EQ(static_cast<int>(want[i]), static_cast<int>(got[i]))
          << "element " << i / 2 << " of " << n << " (bits 0x" << std::hex
          << std::bit_cast<uint32_t>(x[static_cast<size_t>(i / 2)]) << ")";
  }
}

// The AVX2 KIVI encoder (what KvCache uses on AVX2 CPUs) gives the portable encoder's bytes from
// the same f16 residual rows: signed zeros as extremes, non-finite values, constant runs,
// outliers, tiny values, every group size and odd head sizes.
TEST(KvCodec, KiviAvx2EncoderGivesThePortableBytes) {
  if (!cpu::isa_available(cpu::Isa::kAvx2)) GTEST_SKIP() << "no AVX2 on this CPU";
  std::mt19937_64 rng(23);
  for (KvDtype dtype : kKiviKvDtypes)
    for (KvSide side : {KvSide::kKey, KvSide::kValue})
      for (int64_t g : {32, 64, 128})
        for (int64_t d : {1, 3, 8, 13, 37, 64, 72, 128})
          for (int variant = 0; variant < 6; ++variant) {
            KvCacheSpec spec{{dtype, dtype}, 1, g, 1, d};
            const std::vector<float> x = kivi_test_group(rng, g, d, variant);
            // The residual rows as stored (f16), and the values they hold.
            const int64_t row = spec.row_bytes(KvDtype::kF16);
            std::vector<std::byte> rows(static_cast<size_t>(g * row));
            std::vector<const std::byte*> row_ptrs;
            std::vector<float> stored(static_cast<size_t>(g * d));
            for (int64_t i = 0; i < g; ++i) {
              encode_kv_row(KvDtype::kF16, x.data() + i * d, d, rows.data() + i * row);
              decode_kv_row(KvDtype::kF16, rows.data() + i * row, d, stored.data() + i * d);
              row_ptrs.push_back(rows.data() + i * row);
            }
            const int64_t bytes = spec.group_bytes(dtype, side);
            std::vector<std::byte> want(static_cast<size_t>(bytes)),
                got(want.size(), std::byte{0x5A});
            encode_kv_group(spec, dtype, side, stored.data(), want.data());
            cpu::encode_kivi_group_avx2(spec, dtype, side, row_ptrs.data(), got.data());
            for (size_t i = 0; i < want.size(); ++i)
              ASSERT_EQ(static_cast<int>(want[i]), static_cast<int>(got[i]))
                  << kv_dtype_name(dtype) << (side == KvSide::kKey ? " keys" : " values") << " g "
                  << g << " d " << d << " variant " << variant << " byte " << i;
          }
}

TEST(KvCodec, KiviSpecGeometry) {
  // 110M-like heads: kivi2 keys 64 * 4 + 32 * 16 bytes, values 32 * (16 + 2 * 4).
  KvCacheSpec s{{KvDtype::kKivi2, KvDtype::kKivi2}, 12, 32, 12, 64};
  s.kivi_residual_length = 40;
  EXPECT_EQ(256 + 512, s.key_unit_bytes());
  EXPECT_EQ(32 * 24, s.value_unit_bytes());
  EXPECT_EQ(128, s.key_row_bytes());            // f16 residual rows
  EXPECT_EQ(6, s.residual_rows_per_block());    // 768 / 128
  EXPECT_EQ(6, s.residual_blocks_per_group());  // ceil(32 / 6)
  EXPECT_EQ(12 * 12 * (768 + 768) / 32, s.bytes_per_token());
  EXPECT_EQ(0, s.kivi_quantized_tokens(70));  // 71 - 40 = 31 < one group
  EXPECT_EQ(32, s.kivi_quantized_tokens(71));
  EXPECT_EQ(64, s.kivi_quantized_tokens(103));
  // The most blocks a sequence holds as it decodes: at the first token of its last group.
  EXPECT_EQ(0, s.peak_blocks(0));
  EXPECT_EQ(6, s.peak_blocks(1));    // one residual group
  EXPECT_EQ(12, s.peak_blocks(64));  // a query at 32 reads nothing quantized (33 - 40 < 0)
  EXPECT_EQ(61 + 3 * 6, s.peak_blocks(2048));  // at 2,016: 61 groups wholly before 2,017 - 40
  s.kivi_residual_length = 128;
  EXPECT_EQ(59 + 5 * 6, s.peak_blocks(2048));
  EXPECT_EQ(59 + 5 * 6, s.peak_blocks(2017));
  EXPECT_EQ(58 + 5 * 6, s.peak_blocks(2016));
  s.kivi_residual_length = 96;
  EXPECT_EQ(60 + 4 * 6, s.peak_blocks(2048));
  // A mix: int8 keys keep their rows (a group is 32 of them); kivi4 values.
  KvCacheSpec m{{KvDtype::kInt8, KvDtype::kKivi4}, 1, 32, 1, 64};
  EXPECT_EQ(32 * 68, m.key_unit_bytes());
  EXPECT_EQ(32 * (32 + 2 * 4), m.value_unit_bytes());
  EXPECT_EQ(std::min<int64_t>(32 * 68 / 68, 32 * 40 / 128), m.residual_rows_per_block());
  // Without KIVI the geometry is the row layout it always was.
  KvCacheSpec f{{KvDtype::kF16, KvDtype::kF16}, 1, 16, 2, 8};
  EXPECT_EQ(16, f.residual_rows_per_block());
  EXPECT_EQ(1, f.residual_blocks_per_group());
  EXPECT_EQ(0, f.kivi_quantized_tokens(1000));
  EXPECT_EQ(63, f.peak_blocks(1000));
}

TEST(KvCodec, SpecSizesRowsWithTheirMetadata) {
  KvCacheSpec s{{KvDtype::kInt8, KvDtype::kF16}, 2, 16, 4, 64};
  EXPECT_EQ(64 + 4, s.key_row_bytes());
  EXPECT_EQ(128, s.value_row_bytes());
  EXPECT_EQ(2 * 16 * 4 * (68 + 128), s.bytes_per_block());
  EXPECT_EQ(2 * 4 * (68 + 128), s.bytes_per_token());
  EXPECT_EQ("k int8, v f16", s.dtypes.describe());
  EXPECT_EQ(KvDtype::kF16, parse_kv_dtype("auto"));
  EXPECT_EQ(KvDtype::kFp8E4M3, parse_kv_dtype("fp8"));
  EXPECT_EQ(KvDtype::kFp8E5M2, parse_kv_dtype("fp8_e5m2"));
  EXPECT_EQ(std::nullopt, parse_kv_dtype("q4_0"));
  EXPECT_EQ(std::nullopt, parse_kv_dtype("F16"));
}

}  // namespace
}  // namespace vesper::backend

// The KV cache codecs (backend/kv_codec.h) against their definitions (tests/reference/
// reference_kv.h): the bytes written for every type, odd row lengths and awkward rows (zeros,
// one outlier, constant rows, ties, values past the fp8 range, non-finite values), the values
// read back, every fp8 code, and the error each type promises.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend/kv_codec.h"
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
  for (KvDtype d : kAllKvDtypes)
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

// |decode(encode(x)) - x| within each type's bound, relative to the row's largest magnitude
// (fp8, int8) or to the element (f16, bf16).
TEST(KvCodec, RoundTripErrorWithinEachTypesBound) {
  std::mt19937_64 rng(11);
  std::normal_distribution<float> g(0.0f, 1.0f);
  for (KvDtype d : kAllKvDtypes) {
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
        }
        worst = std::max(worst, err / std::max(amax, 1e-30f));
        ASSERT_LE(err, bound) << kv_dtype_name(d) << " x " << x[i] << " got " << y[i];
      }
    }
    std::printf("  %-8s worst error / row amax: %.3g\n", std::string(kv_dtype_name(d)).c_str(),
                worst);
  }
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

#include "hf/exl2_quantize.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "core/fp16.h"

namespace vesper::hf {
namespace {

float round_fp16(float x) {
  return fp16_to_f32(f32_to_fp16(x));
}

// Scale code c of a group whose q_scale_max is `scale_max` (an fp16 value), as exl2_format.h.
float scale_of(float scale_max, int code) {
  return round_fp16(static_cast<float>((code + 1) * (code + 1)) * round_fp16(scale_max / 256.0f));
}

}  // namespace

std::vector<float> dequantize_exl2_layer(const Exl2PackInput& q) {
  std::vector<float> w(static_cast<size_t>(q.n * q.k));
  int64_t first = 0;
  for (size_t g = 0; g < q.groups.size(); ++g) {
    const int zero = 1 << (q.groups[g].bits - 1);
    for (int64_t c = 0; c < q.n; ++c) {
      const float scale = scale_of(
          q.scale_max[g], q.scale_codes[g * static_cast<size_t>(q.n) + static_cast<size_t>(c)]);
      for (int64_t r = first; r < first + q.groups[g].rows; ++r) {
        const int64_t input = q.perm.empty() ? r : q.perm[static_cast<size_t>(r)];
        w[static_cast<size_t>(c * q.k + input)] =
            static_cast<float>(q.codes[static_cast<size_t>(r * q.n + c)] - zero) * scale;
      }
    }
    first += q.groups[g].rows;
  }
  return w;
}

Exl2PackInput quantize_exl2_layer(const float* w, int64_t n, int64_t k, const Exl2LayerPlan& plan) {
  Exl2PackInput out;
  out.k = k;
  out.n = n;
  out.groups = plan.groups;
  out.perm = plan.perm;
  out.codes.assign(static_cast<size_t>(k * n), 0);
  out.scale_codes.assign(plan.groups.size() * static_cast<size_t>(n), 0);
  const auto input_of = [&](int64_t packed_row) {
    return plan.perm.empty() ? packed_row
                             : static_cast<int64_t>(plan.perm[static_cast<size_t>(packed_row)]);
  };
  int64_t first = 0;
  for (size_t g = 0; g < plan.groups.size(); ++g) {
    const int bits = plan.groups[g].bits;
    const int64_t rows = plan.groups[g].rows;
    const int zero = 1 << (bits - 1);
    const int top = (1 << bits) - 1;
    // The group's weights gathered column by column ([n][rows], packed row order), once.
    std::vector<float> x(static_cast<size_t>(n * rows));
    std::vector<float> column_max(static_cast<size_t>(n), 0.0f);
    float largest = 0.0f;
    for (int64_t c = 0; c < n; ++c) {
      float* xc = x.data() + c * rows;
      for (int64_t r = 0; r < rows; ++r) {
        xc[r] = w[c * k + input_of(first + r)];
        column_max[static_cast<size_t>(c)] =
            std::max(column_max[static_cast<size_t>(c)], std::abs(xc[r]));
      }
      largest = std::max(largest, column_max[static_cast<size_t>(c)]);
    }
    // Each column's best scale code under a group scale_max; the group's total squared error.
    // `store` writes the codes and scale codes. The codes tried are those around the smallest
    // that reaches the column's largest weight: three smaller (clipping it for finer steps) and
    // one larger. Further from it the steps are coarser or the clipping heavier: on stories260K
    // the search of all 16 gave no better perplexity at 4, 6 or 8 bits per weight, and made
    // quantizing a 1B model take hours.
    std::vector<float> squared(static_cast<size_t>(rows));
    const float lowest = static_cast<float>(-zero), highest = static_cast<float>(top - zero);
    // x / scale clamped to the codes' range and rounded to the nearest integer (ties to even):
    // adding and taking away 1.5 * 2^23 rounds a float below 2^22 in magnitude, in registers,
    // where std::lround was a library call per weight (most of a 1B model's quantizing time).
    const auto level = [&](float v, float scale) {
      const float clamped = std::clamp(v / scale, lowest, highest);
      return (clamped + 12582912.0f) - 12582912.0f;
    };
    const auto fit = [&](float scale_max, bool store) {
      float scales[16];
      for (int code = 0; code < 16; ++code) scales[code] = scale_of(scale_max, code);
      double total = 0.0;
      for (int64_t c = 0; c < n; ++c) {
        const float* xc = x.data() + c * rows;
        int reach = 15;
        for (int code = 0; code < 16; ++code)
          if (scales[code] * static_cast<float>(zero) >= column_max[static_cast<size_t>(c)]) {
            reach = code;
            break;
          }
        double best_error = INFINITY;
        int best_code = reach;
        for (int code = std::max(0, reach - 3); code <= std::min(15, reach + 1); ++code) {
          const float scale = scales[code];
          if (scale <= 0.0f) continue;
          for (int64_t r = 0; r < rows; ++r) {  // no reduction here, so this loop vectorizes
            const float d = xc[r] - level(xc[r], scale) * scale;
            squared[static_cast<size_t>(r)] = d * d;
          }
          double error = 0.0;
          for (int64_t r = 0; r < rows; ++r) error += squared[static_cast<size_t>(r)];
          if (error < best_error) {
            best_error = error;
            best_code = code;
          }
        }
        total += best_error;
        if (!store) continue;
        out.scale_codes[g * static_cast<size_t>(n) + static_cast<size_t>(c)] =
            static_cast<uint8_t>(best_code);
        for (int64_t r = 0; r < rows; ++r)
          out.codes[static_cast<size_t>((first + r) * n + c)] =
              static_cast<uint8_t>(static_cast<int>(level(xc[r], scales[best_code])) + zero);
      }
      return total;
    };
    // scale_max (stored in fp16; a zero group gets the smallest normal one, every code then
    // reading zero): code 15 covers the group's largest weight, or, when clipping the largest
    // weights costs less than the coarser steps, somewhat less.
    float best_max = 0.0f;
    double best_total = INFINITY;
    for (const float shrink : {1.0f, 0.9f, 0.8f, 0.7f, 0.6f}) {
      const float scale_max =
          round_fp16(std::max(largest * shrink / static_cast<float>(zero), 6.2e-5f));
      const double total = fit(scale_max, false);
      if (total < best_total) {
        best_total = total;
        best_max = scale_max;
      }
    }
    out.scale_max.push_back(best_max);
    fit(best_max, true);
    first += rows;
  }
  VESPER_CHECK(first == k, "EXL2 plan covers %lld of %lld rows", static_cast<long long>(first),
               static_cast<long long>(k));
  return out;
}

}  // namespace vesper::hf

// Quantizing one linear layer to EXL2 (round to nearest, per group and output column the scale
// code that gives the least squared error), as the input of pack_exl2. The bit allocation (which
// widths, which group sizes, which act order) is the caller's plan.
#pragma once

#include <cstdint>
#include <vector>

#include "hf/exl2_pack.h"

namespace vesper::hf {

struct Exl2LayerPlan {
  std::vector<Exl2PackGroup> groups;  // rows summing to k, widths never increasing
  std::vector<int32_t> perm;  // act order: packed row j is input row perm[j]; empty: identity
};

// W is [n][k] row-major (torch's [out_features, in_features]). Each column's scale code minimizes
// the squared error of its rounded codes among the five codes around the smallest that reaches
// the column's largest weight, scales as exl2_format.h computes them (in fp16); each
// group's scale_max is the one of {1, 0.9, 0.8, 0.7, 0.6} x (the group's largest |w| / 2^(bits-1))
// whose columns err least in total (clipping the largest weights can cost less than the coarser
// steps that reaching them takes).
Exl2PackInput quantize_exl2_layer(const float* w, int64_t n, int64_t k, const Exl2LayerPlan& plan);

// The weights `q` (quantize_exl2_layer's result) decode to, [n][k] in W's layout: each the exact
// product (code - 2^(bits-1)) * scale, scales in fp16 as exl2_format.h computes them.
std::vector<float> dequantize_exl2_layer(const Exl2PackInput& q);

}  // namespace vesper::hf

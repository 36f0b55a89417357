// Activation statistics of a model's linear layers over calibration text: what calibrated
// quantization weighs each weight's rounding error by (`vesper quantize --to exl2 --calibration`,
// hf/exl2_writer.h). The statistic is llama.cpp's importance matrix: for each weight matrix W and
// each of its input channels i, the mean of x_i^2 over the calibration tokens, so that
//   E ||(W - Q) x||^2  ~=  sum_o sum_i (W - Q)[o][i]^2 * mean(x_i^2)
// (the error a quantization Q adds to the layer's output, cross terms between channels left out).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "core/result.h"
#include "model/model.h"

namespace vesper::model {

struct InputEnergy {
  int64_t tokens = 0;  // calibration tokens each weight's input was observed on
  // GGUF weight name ("blk.3.attn_q.weight", "output.weight") -> mean of x_i^2 per input channel.
  std::map<std::string, std::vector<double>> mean_square;
};

// Runs `model` over `tokens` in chunks of `ctx` (each a sequence from position 0, all its rows'
// logits computed so that the output matrix sees every token), f32 KV, and returns every linear
// layer's input energy. Trailing tokens short of a whole chunk are not used. `progress`, if set,
// gets (chunks done, chunks) after each chunk. Errors: fewer tokens than one chunk, ctx < 1.
Result<InputEnergy> measure_input_energy(
    Model& model, std::span<const int32_t> tokens, int64_t ctx,
    const std::function<void(int64_t, int64_t)>& progress = {});

}  // namespace vesper::model

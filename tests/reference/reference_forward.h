// A slow, obviously-correct f64 forward pass of the llama family, straight from the equations,
// with no paging, batching, threading or SIMD. It reads the same GGUF weights (dequantized by
// the independent reference dequantizer) and is the oracle the fast forward is checked against.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "model/model.h"
#include "reference/reference_q8.h"

namespace vesper::reference {

// Logits (f64) for every position of one sequence of `tokens`: result[p][v]. Activations that
// backend::matmul quantizes (matmul_activation_quant) are quantized the same way, from their f64
// values rounded to f32; `trace`, if given, follows those rounding decisions (reference_q8.h).
// `linear_inputs`, if given, gets every linear layer's input at every position, once per weight
// that reads it: the weight's GGUF name and the f64 input (what Model's linear-input observer
// reports).
using LinearInputSink = std::function<void(const std::string& weight, const std::vector<double>&)>;
std::vector<std::vector<double>> forward_all_positions(const model::Model& model,
                                                       const std::vector<int32_t>& tokens,
                                                       RoundingTrace* trace = nullptr,
                                                       const LinearInputSink& linear_inputs = {});

}  // namespace vesper::reference

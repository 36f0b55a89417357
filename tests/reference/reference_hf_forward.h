// An f64 forward pass of a Hugging Face checkpoint written from transformers' modeling code, not
// from Vesper's: it reads config.json and the safetensors by their Hugging Face names and runs
// rotate-half RoPE (with linear / llama3 scaling computed as transformers does), qwen2 biases,
// qwen3 q/k norms and mistral's sliding window on the weights as stored. So it checks the
// checkpoint loader's name mapping, q/k permutation and dtype handling independently.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace vesper::reference {

// Logits (f64) of every position of `tokens` for the checkpoint in `dir`: result[p][v]. Aborts
// the test binary on a malformed checkpoint (tests pass only well-formed fixtures).
std::vector<std::vector<double>> hf_forward_all_positions(const std::string& dir,
                                                          const std::vector<int32_t>& tokens);

}  // namespace vesper::reference

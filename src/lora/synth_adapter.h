// Random-weight LoRA adapters for a given base model, written as llama.cpp GGUF LoRA files:
// benchmark inputs (`vesper synth --lora-rank R --lora-targets q,k,v,o --base MODEL -o FILE`).
// A ~ U(+-1/sqrt(n_in)) as PEFT initialises it; B small and random (a trained B is not zero), so
// that the delta is of the order of a trained adapter's and activations stay sane.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/result.h"
#include "model/adapter_source.h"
#include "tensor/ggml_type.h"

namespace vesper::lora {

struct SynthAdapterSpec {
  std::string base_model;  // the GGUF whose shapes the adapter fits
  int64_t rank = 16;
  float alpha = 32.0f;
  std::vector<model::Projection> targets;
  tensor::GgmlType type = tensor::GgmlType::kF16;  // f32, f16, bf16 or q8_0
  uint64_t seed = 1;
};

// "q,k,v,o,gate,up,down" (or GGUF names: attn_q, ...; "all") into projections; errors name the
// unknown one.
Result<std::vector<model::Projection>> parse_lora_targets(const std::string& text);

Status write_synthetic_adapter(const SynthAdapterSpec& spec, const std::string& path);

}  // namespace vesper::lora

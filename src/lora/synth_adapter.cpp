#include "lora/synth_adapter.h"

#include <cmath>
#include <random>
#include <sstream>

#include "gguf/gguf.h"
#include "hf/model_file.h"
#include "model/model_config.h"
#include "tensor/quant.h"

namespace vesper::lora {
namespace {

struct TargetName {
  model::Projection p;
  const char* short_name;
  const char* gguf;
};
constexpr TargetName kTargets[] = {
    {model::Projection::kQ, "q", "attn_q"},         {model::Projection::kK, "k", "attn_k"},
    {model::Projection::kV, "v", "attn_v"},         {model::Projection::kO, "o", "attn_output"},
    {model::Projection::kGate, "gate", "ffn_gate"}, {model::Projection::kUp, "up", "ffn_up"},
    {model::Projection::kDown, "down", "ffn_down"},
};

}  // namespace

Result<std::vector<model::Projection>> parse_lora_targets(const std::string& text) {
  std::vector<model::Projection> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (item == "all") {
      for (const TargetName& t : kTargets) out.push_back(t.p);
      continue;
    }
    bool found = false;
    for (const TargetName& t : kTargets)
      if (item == t.short_name || item == t.gguf) {
        out.push_back(t.p);
        found = true;
      }
    if (!found)
      return make_error("--lora-targets: unknown projection \"" + item +
                        "\" (q, k, v, o, gate, up, down, or all)");
  }
  if (out.empty()) return make_error("--lora-targets names no projection");
  return out;
}

Status write_synthetic_adapter(const SynthAdapterSpec& spec, const std::string& path) {
  VESPER_ASSIGN_OR_RETURN(gguf::GgufFile base, hf::open_model_file(spec.base_model));
  VESPER_ASSIGN_OR_RETURN(model::ModelConfig c, model::read_model_config(base));
  if (spec.rank < 1) return make_error("--lora-rank must be positive");
  gguf::GgufWriter w;
  w.set("general.architecture", gguf::Value::string(c.arch.name));
  w.set("general.type", gguf::Value::string("adapter"));
  w.set("general.name",
        gguf::Value::string(c.name + "-synthetic-lora-r" + std::to_string(spec.rank)));
  w.set("adapter.type", gguf::Value::string("lora"));
  w.set("adapter.lora.alpha", gguf::Value::f32(spec.alpha));
  std::mt19937_64 rng(spec.seed);
  auto tensor = [&](const std::string& name, int64_t cols, int64_t rows, float range) -> Status {
    std::uniform_real_distribution<float> u(-range, range);
    std::vector<float> v(static_cast<size_t>(cols * rows));
    for (float& x : v) x = u(rng);
    tensor::GgmlType type = spec.type;
    if (cols % tensor::traits(type).block_size != 0) type = tensor::GgmlType::kF16;
    const size_t row_bytes = tensor::row_size(type, cols);
    std::vector<uint8_t> bytes(row_bytes * static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r)
      tensor::quantize_row(type, v.data() + r * cols, bytes.data() + r * row_bytes, cols);
    return w.add_tensor(name, {cols, rows}, type, bytes);
  };
  for (int64_t l = 0; l < c.n_layer; ++l)
    for (const TargetName& t : kTargets) {
      if (std::find(spec.targets.begin(), spec.targets.end(), t.p) == spec.targets.end()) continue;
      int64_t n_in = c.n_embd, n_out = c.n_embd;
      switch (t.p) {
        case model::Projection::kQ:
          n_out = c.q_dim();
          break;
        case model::Projection::kK:
        case model::Projection::kV:
          n_out = c.kv_dim();
          break;
        case model::Projection::kO:
          n_in = c.q_dim();
          break;
        case model::Projection::kGate:
        case model::Projection::kUp:
          n_out = c.n_ff;
          break;
        case model::Projection::kDown:
          n_in = c.n_ff;
          break;
      }
      const std::string prefix = "blk." + std::to_string(l) + "." + t.gguf + ".weight.";
      VESPER_TRY(
          tensor(prefix + "lora_a", n_in, spec.rank, 1.0f / std::sqrt(static_cast<float>(n_in))));
      // B: small, so that scale * B A x stays a modest fraction of W x.
      VESPER_TRY(tensor(prefix + "lora_b", spec.rank, n_out,
                        0.1f / std::sqrt(static_cast<float>(spec.rank))));
    }
  return w.write(path);
}

}  // namespace vesper::lora
